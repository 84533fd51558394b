"""Clocks: the live side injects :class:`MonotonicClock`; tests and the simulator a fake one."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...


class MonotonicClock:
    """Seconds from an arbitrary origin, never going backwards."""

    now = staticmethod(time.monotonic)


class FakeClock:
    """A clock that moves only when told to.

    >>> c = FakeClock(); c.advance(0.5); c.now()
    0.5
    """

    def __init__(self, start: float = 0.0):
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError("time does not go backwards")
        self.t += dt
