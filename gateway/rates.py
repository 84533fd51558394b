"""Per-model arrival rates as this gateway sees them (its partial view, for the autoscaler).

Rows are counted in one-second buckets; ``rate_rps`` is the mean over the last ``window_s``
complete-or-current seconds. The clock is injected, so tests drive it by hand.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Callable


class RateMeter:
    """>>> t = [0.0]; m = RateMeter(lambda: t[0], window_s=2)
    >>> m.add(10); t[0] = 1.5; m.add(10); round(m.rate_rps(), 1)
    10.0
    """

    def __init__(self, clock: Callable[[], float], window_s: float = 5.0):
        self.clock = clock
        self.window_s = int(max(1, window_s))
        self._buckets: deque[list[float]] = deque()  # [second, rows]
        self._start = clock()

    def add(self, rows: int) -> None:
        sec = int(self.clock())
        b = self._buckets
        if b and b[-1][0] == sec:
            b[-1][1] += rows
        else:
            b.append([sec, rows])
            while b and b[0][0] <= sec - self.window_s:
                b.popleft()

    def rate_rps(self) -> float:
        now = self.clock()
        lo = int(now) - self.window_s + 1
        rows = sum(r for s, r in self._buckets if s >= lo)
        span = min(float(self.window_s), max(now - self._start, 1.0))
        return rows / span


def gateway_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
