"""Load signals and the degrade level with hysteresis, private machinery of the ``slo`` policy.

*Level* ``k`` means the ``k + 1`` most accurate variants may serve (level 0: only the best). The
level rises at once when the queue is predicted to miss deadlines at the current level, and falls
one step only after the lower level has looked comfortable (arrival rate below
``(1 - restore_headroom)`` of its sustainable throughput and no predicted miss for the queue) for
``restore_hold_s`` without a break. Rising fast and falling slowly is the hysteresis: a burst
degrades within one decision, and the best variant returns only once load has really fallen, so
a load that hovers at the best variant's capacity does not flap between variants.

The controller also remembers, for ``memory_s``, the arrival rate at which each level last proved
too little (the rate when it had to rise past it, by prediction or by observed lateness). A level
is not comfortable while the rate is above ``(1 - restore_headroom)`` of that remembered rate,
whatever the profile says: under a load the profile never saw (the event loop and an in-process
replica sharing a core), the profile's throughput promises a capacity that is not there, and
without this memory the level came back down in the middle of a burst every ``restore_hold_s``,
answering a wave of requests late each time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable

from sloserve.batching.types import QueuedItem


class ArrivalRate:
    """Rows per second that arrived during the last ``window_s`` (by ``arrival_s``; no clock)."""

    __slots__ = ("_events", "_first_s", "_rows", "slo_s", "window_s")

    def __init__(self, window_s: float = 1.0):
        self.window_s = window_s
        self._events: deque = deque()
        self._rows = 0
        self.slo_s = 0.0  # EWMA of deadline - arrival of arrivals: the typical budget
        self._first_s: float | None = None  # first arrival ever: a young window is shorter

    def add(self, items: Iterable[QueuedItem]) -> None:
        ev = self._events
        for it in items:
            if self._first_s is None:
                self._first_s = it.arrival_s
            ev.append((it.arrival_s, it.size))
            self._rows += it.size
            if it.best_effort:  # its deadline is only a bound on its wait, not a budget
                continue
            budget = it.deadline_s - it.arrival_s
            self.slo_s = budget if self.slo_s == 0.0 else 0.95 * self.slo_s + 0.05 * budget

    def rate(self, now: float) -> float:
        ev = self._events
        oldest = now - self.window_s
        while ev and ev[0][0] < oldest:
            self._rows -= ev.popleft()[1]
        if self._first_s is None or len(ev) < 2:
            return 0.0  # one arrival says nothing about a rate
        span = min(self.window_s, max(now - self._first_s, 1e-3))
        return self._rows / span


class LevelController:
    """The degrade level and its hysteresis (see the module docstring)."""

    __slots__ = ("_calm_since_s", "_ceiling", "level", "memory_s", "restore_headroom", "restore_hold_s", "switches")

    def __init__(self, restore_headroom: float = 0.25, restore_hold_s: float = 0.5, memory_s: float = 10.0):
        if not 0.0 <= restore_headroom < 1.0 or restore_hold_s < 0 or memory_s < 0:
            raise ValueError("restore_headroom in [0, 1), restore_hold_s >= 0, memory_s >= 0")
        self.restore_headroom = restore_headroom
        self.restore_hold_s = restore_hold_s
        self.memory_s = memory_s
        self.level = 0
        self.switches = 0
        self._calm_since_s: float | None = None
        self._ceiling: dict[int, tuple[float, float]] = {}  # level -> (rate it proved too little at, when)

    def update(
        self,
        now: float,
        max_level: int,
        need_level: int,
        overloaded: Callable[[int], bool],
        comfortable: Callable[[int], bool],
        rate: float | None = None,
        failed_level: int | None = None,
    ) -> int:
        """One step: ``overloaded(k)`` predicts misses at level k, ``comfortable(k)`` says k would do;
        ``rate``: the arrival rate now (rows/s), remembered when a level proves too little;
        ``failed_level``: the part of ``need_level`` that says the levels below it failed (observed
        lateness), as opposed to one request that only a cheaper variant can still make (default:
        all of it)."""
        lvl = min(self.level, max_level)
        target = min(max(lvl, need_level), max_level)
        while target < max_level and overloaded(target):
            target += 1
        # The rate to remember when a level proves too little (None: nothing to remember).
        remember = rate if rate is not None and rate > 0.0 and self.memory_s > 0 else None
        if target > lvl:
            if remember is not None:
                failed = need_level if failed_level is None else failed_level
                for k in range(lvl, target):
                    if k < failed or overloaded(k):
                        self._ceiling[k] = (remember, now)
            self._set(target)
            self._calm_since_s = None
            return target
        if remember is not None:
            # The rate a level rose at is read from a window that, at the onset of a burst, still
            # holds mostly the load before it: while degraded, what is remembered follows the rate
            # up, so that the level returns once the burst is over, not memory_s after its onset.
            # The time stays that of the failure: after memory_s the level is tried again.
            for k in range(lvl):
                c = self._ceiling.get(k)
                if c is not None and remember > c[0]:
                    self._ceiling[k] = (remember, c[1])
        if lvl > 0 and self.under_ceiling(lvl - 1, now, rate) and comfortable(lvl - 1):
            if self._calm_since_s is None:
                self._calm_since_s = now
            elif now - self._calm_since_s >= self.restore_hold_s:
                self._set(lvl - 1)
                self._calm_since_s = None
        else:
            self._calm_since_s = None
        if lvl != self.level or self.level > max_level:
            self._set(min(self.level, max_level))
        return self.level

    def ceiling(self, level: int, now: float) -> float | None:
        """The rate ``level`` last proved too little at, if remembered (within ``memory_s``)."""
        c = self._ceiling.get(level)
        if c is None:
            return None
        if now - c[1] > self.memory_s:
            del self._ceiling[level]
            return None
        return c[0]

    def under_ceiling(self, level: int, now: float, rate: float | None) -> bool:
        """False while ``rate`` is within ``restore_headroom`` of the rate at which ``level`` last
        proved too little (for ``memory_s`` after that)."""
        c = self.ceiling(level, now)
        return c is None or rate is None or rate <= (1.0 - self.restore_headroom) * c

    def _set(self, level: int) -> None:
        if level != self.level:
            self.switches += 1
            self.level = level


class LatenessMonitor:
    """Lateness feedback for the degrade level (the ``slo`` policy's ``late_*`` arguments).

    Predictions can be right on average and still wrong under a load the profile never saw (CPU
    shared with the gateway's event loop). Each batch result says how many of its rows were
    answered late; when more than ``target`` of the rows that the variants in use (rank <= level)
    answered over ``window_s`` were late, with at least ``min_rows`` answered, the level this asks
    for is one step above the current one. It stays there until the level comes down by the usual
    restore rule, and the evidence is cleared at each step, so a further step needs new late answers.
    """

    __slots__ = ("_last_s", "_q", "_recent", "level", "min_rows", "target", "window_s")

    def __init__(self, target: float = 0.01, window_s: float = 1.0, min_rows: int = 32):
        self.target = target
        self.window_s = window_s
        self.min_rows = min_rows
        self._q: deque = deque()  # (finished_s, rank, rows, late rows)
        self._recent: deque = deque()  # the same, never cleared by a step: for late_now
        self.level = 0
        self._last_s = -math.inf  # the last batch result seen

    def observe(self, finished_s: float, rank: int, rows: int, late_rows: int) -> None:
        self._q.append((finished_s, rank, rows, late_rows))
        r = self._recent
        r.append((finished_s, rank, rows, late_rows))
        while r and r[0][0] < finished_s - self.window_s:  # bounded by the window even if never asked
            r.popleft()
        self._last_s = max(self._last_s, finished_s)

    def late_now(self, now: float, rank: int) -> bool:
        """Whether more than ``target`` of the rows variants of rank <= ``rank`` answered over the last
        ``window_s`` were late (at least ``min_rows`` answered): the evidence itself, with no level
        kept (shared replicas decide batch by batch)."""
        q = self._recent
        while q and q[0][0] < now - self.window_s:
            q.popleft()
        rows = late = 0
        for t, r, n, k in q:
            if r <= rank and t >= now - self.window_s:  # (a result that came in out of order: by its time)
                rows += n
                late += k
        return rows >= self.min_rows and late > self.target * rows

    def need(self, now: float, level: int, max_level: int) -> int:
        """The level observed lateness asks for, given the current ``level``."""
        if now - self._last_s > self.window_s:  # idle for a window: old lateness says nothing now
            self.level = 0
        elif self.level > level:  # the level came down since (comfortable for restore_hold)
            self.level = level
        q = self._q
        while q and q[0][0] < now - self.window_s:
            q.popleft()
        if level < max_level:
            rows = late = 0
            for _, rank, n, k in q:
                if rank <= level:
                    rows += n
                    late += k
            if rows >= self.min_rows and late > self.target * rows:
                self.level = level + 1
                q.clear()
        return self.level
