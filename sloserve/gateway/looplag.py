"""The event loop's lag: a metric, and the signal of the door.

A request's bytes can sit in its socket for a whole loop iteration before the gateway reads them:
under a burst one iteration decodes dozens of JSON bodies, several milliseconds. When the loop runs
that far behind, the front end, not the replicas, is the bottleneck.

:class:`LoopLag` probes the loop with a timer every ``period_s`` and keeps an exponentially
weighted mean of how late the timer ran: a ready callback waits as long as a freshly readable
socket does, for the rest of the iteration in progress (idle, ~0.15 ms under uvloop). It is
exported as ``sloserve_event_loop_lag_seconds``.

A timer also runs late when the loop has nothing to do but the operating system gives its core to
another process: on a busy host a lightly loaded gateway sees lags of several milliseconds that no
refusal would shorten. So each probe also weighs its lateness by how much of the probe's interval the
loop's thread itself spent on the CPU (``time.thread_time``): the loop's **own** lag
(``own_estimate_s``, ``own_last_s``). A loop that is late because it is working through its own
backlog counts in full; one that is late because it waited for a core counts for what it ran. The own
lag, while the latest probe's own lag is late too, drives the door (``loop_lag_shed_ms``,
sloserve/gateway/admission.py).

The probe runs only while requests come (it stops ``idle_s`` after the last one and the next
arrival restarts it): an idle gateway pays nothing, a busy one ~200 timer callbacks a second.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


class LoopLag:
    def __init__(
        self,
        period_s: float = 0.005,
        alpha: float = 0.2,
        cap_s: float = 0.05,
        idle_s: float = 1.0,
        clock=time.monotonic,
        cpu_clock=time.thread_time,
    ):
        self.period_s = period_s
        self.alpha = alpha
        self.cap_s = cap_s  # one stall (a collection, a slow scrape) must not eat a whole budget
        self.idle_s = idle_s
        self.clock = clock  # time.monotonic, not loop.time(): uvloop's is a cached millisecond clock
        self.cpu_clock = cpu_clock  # the loop thread's CPU time (probes are armed and run on the loop)
        self.estimate_s = 0.0
        self.last_s = 0.0  # the latest probe's lateness (capped)
        self.own_estimate_s = 0.0  # the same, each probe weighed by the loop thread's CPU share
        self.own_last_s = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._armed_at = 0.0
        self._armed_cpu = 0.0
        self._last_touch = 0.0

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Bind to the running loop; probing begins with the first :meth:`touch`."""
        self._loop = loop or asyncio.get_running_loop()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._loop = None

    def touch(self) -> float:
        """A request arrived: keep probing (start again after an idle spell); returns the estimate."""
        self._last_touch = self.clock()
        if self._timer is None and self._loop is not None:
            self._arm()
        return self.estimate_s

    def _arm(self) -> None:
        assert self._loop is not None, "armed only while bound to a loop (touch and _tick check)"
        self._armed_at = self.clock()
        self._armed_cpu = self.cpu_clock()
        self._due = self._armed_at + self.period_s
        self._timer = self._loop.call_later(self.period_s, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._loop is None:
            return
        now = self.clock()
        wall = now - self._armed_at
        busy = (self.cpu_clock() - self._armed_cpu) / wall if wall > 0 else 1.0
        self.observe(now - self._due, busy)
        if now - self._last_touch < self.idle_s:
            self._arm()
        else:  # idle: no lag to count; the next arrival starts the probe again
            self.estimate_s = self.last_s = self.own_estimate_s = self.own_last_s = 0.0

    def observe(self, lag_s: float, busy: float = 1.0) -> None:
        """One probe's lateness (seconds) and the share of its interval the loop's thread ran on the
        CPU (clamped to [0, 1]); exposed for tests and other drivers."""
        lag = min(max(lag_s, 0.0), self.cap_s)
        own = lag * min(max(busy, 0.0), 1.0)
        self.estimate_s += self.alpha * (lag - self.estimate_s)
        self.last_s = lag
        self.own_estimate_s += self.alpha * (own - self.own_estimate_s)
        self.own_last_s = own


def door_ms(settings: Any) -> float:
    """The door's threshold: ``loop_lag_shed_ms`` as set, else its default: 5 ms in-process; off on Ray,
    where it is not measured (the gateway's loop shares its GIL with Ray's client threads there)."""
    if settings.loop_lag_shed_ms is not None:
        return float(settings.loop_lag_shed_ms)
    return 5.0 if settings.backend == "inprocess" else 0.0
