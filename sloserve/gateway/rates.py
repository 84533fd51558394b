"""Per-model arrival rates as this gateway sees them (its partial view, for the autoscaler).

Rows are counted in one-second buckets; ``rate_rps`` is the mean over the last ``window_s``
complete-or-current seconds, ``dispersion`` how clumped they are (for swayam's burst term). The clock is injected, so tests drive it by hand.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from collections.abc import Callable

from sloserve.autoscaler.burst import index_of_dispersion


class RateMeter:
    """>>> t = [0.0]; m = RateMeter(lambda: t[0], window_s=2)
    >>> m.add(10); t[0] = 1.5; m.add(10); round(m.rate_rps(), 1)  # 20 rows in 1.5 s
    13.3
    """

    def __init__(self, clock: Callable[[], float], window_s: float = 5.0, dispersion_s: float = 10.0):
        self.clock = clock
        self.window_s = int(max(1, window_s))
        self.dispersion_s = int(max(3, dispersion_s))
        self._keep_s = max(self.window_s, self.dispersion_s) + 1  # (+1: the second being counted)
        self._buckets: deque[list[float]] = deque()  # [second, rows]
        self._start = clock()
        self._first: float | None = None  # the first arrival's time

    def add(self, rows: int) -> None:
        if self._first is None:
            self._first = self.clock()
        sec = int(self.clock())
        b = self._buckets
        if b and b[-1][0] == sec:
            b[-1][1] += rows
        else:
            b.append([sec, rows])
            while b and b[0][0] <= sec - self._keep_s:
                b.popleft()

    def rate_rps(self) -> float:
        now = self.clock()
        lo = int(now) - self.window_s + 1
        rows = sum(r for s, r in self._buckets if s >= lo)
        span = min(float(self.window_s), max(now - self._start, 1.0))
        return rows / span

    def dispersion(self) -> float:
        """Index of dispersion of the per-second counts over the last ``dispersion_s`` complete
        seconds since the first arrival (empty ones included; ``sloserve.autoscaler.burst``): 1 for Poisson
        arrivals, more when they clump. The idle seconds before the first request are left out: a
        gateway started before its traffic would otherwise report the start as one big clump."""
        if self._first is None:
            return 1.0
        now = int(self.clock())
        lo = max(now - self.dispersion_s, int(self._first) + 1)  # whole seconds only: the first may be partial
        if now - lo < 2:
            return 1.0
        per = dict((s, r) for s, r in self._buckets if lo <= s < now)
        return index_of_dispersion(per.get(s, 0.0) for s in range(lo, now))


def gateway_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
