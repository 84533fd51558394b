"""``slo``: deadline-aware batching with early shedding and accuracy variants.

Decision rules, in the order ``plan`` applies them (docs/batching.md has the long form):

1. **Order.** Requests are kept by priority level (Triton's: 1 first; one level when the model has
   none), then in deadline order (arrival + SLO).
2. **Shed.** A request that cannot meet its deadline even if dispatched alone, right now, on the
   earliest free replica of any variant it allows (``busy_until_s`` when the driver gives it,
   else a busy variant counts as free now: shedding is never speculative) is shed with
   ``late_by_s``, before it wastes device time.
3. **Level.** The degrade level (``sloserve.batching.policies._levels``) says which variants may serve: it rises at
   once when the queue is predicted to miss deadlines at the current level, and falls with
   hysteresis. A cheaper variant takes work only when the more accurate ones are predicted to
   miss for the current queue, so it serves the overflow, not the whole load.
4. **Dispatch or wait**, per variant with an idle replica, most accurate first: the batch is the
   earliest-deadline requests that fit in the largest batch whose predicted completion
   (``now + p99(b)``) meets the earliest deadline in it. It goes now if it is full (by size or
   by deadline), if no larger batch would raise throughput by ``min_gain``, or if the expected
   arrivals could not grow it before the head's latest start; else the policy waits until that
   latest start (the driver re-plans on every arrival anyway).

``admit(view, item, now)`` refuses at the door a request whose predicted queueing (rows ahead
of it in deadline order at the best throughput of the variants it allows) + compute already
misses its deadline. Per-decision cost: O(new arrivals * log n) to keep the order, O(k) for the
k requests near their deadline, O(n / max_batch) capacity checks per degrade-level evaluation.

>>> from sloserve.batching.types import QueuedItem, QueueView
>>> p = SLOPolicy(max_batch_size=8, latency_fn=lambda v, n: 0.002 + 0.001 * n)
>>> q = QueueView("m", [QueuedItem(0, 0.0, 0.010, variants=("v",))], {"v": 1}, 8)
>>> p.plan(q, now=0.0).reason
'no_gain'
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from sloserve.batching.latency import LatencyModel
from sloserve.batching.policies._admission import predict_finish
from sloserve.batching.policies._edf import DeadlineOrder
from sloserve.batching.policies._levels import ArrivalRate, LatenessMonitor, LevelController
from sloserve.batching.policies._pool import Pool, pipelined_pool
from sloserve.batching.policies.slo_settings import SLOSettings
from sloserve.batching.policy import PolicyBase, register_policy
from sloserve.batching.profile import ProfileTable
from sloserve.batching.types import (
    BatchResult,
    Decision,
    Dispatch,
    QueuedItem,
    QueueView,
    Shed,
    Wait,
)

_INF = math.inf
EPS_S = 1e-9
_MAX_PASS = 64  # heads passed over per decision (bounds the cost of a plan)


@register_policy("slo")
class SLOPolicy(PolicyBase):
    """The SLO-aware policy. Construct with keyword arguments: the context (``PolicyContext``) and
    :class:`SLOSettings`; see the module docstring.

    Latency source, first given wins: ``latency_fn(variant, rows) -> s``, ``profile`` (a
    ProfileTable, a Calibrator, or a model repository path). With ``calibrate`` (default) a
    ProfileTable is wrapped in a :class:`~sloserve.batching.calibration.Calibrator` fed by ``observe``;
    ``calibrator`` exposes it (its ``drift()`` is the metric).
    """

    name = "slo"
    Settings = SLOSettings
    settings: SLOSettings  # what PolicyBase.__init__ validated with Settings

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        c, s = self.context, self.settings
        max_batch_size, model, device_type, profile = c.max_batch_size, c.model, c.device_type, c.profile
        self.max_batch_size = max_batch_size
        self.default_variant = c.default_variant
        self.lat = LatencyModel(
            c.latency_fn if c.latency_fn is not None else profile,
            max_batch_size,
            model=model,
            device_type=device_type,
            calibrate=s.calibrate,
            quantile=s.size_quantile,
            recent=s.calibration_recent,
        )
        self.calibrator = self.lat.calibrator
        # Shedding and best-effort late starts ask "can it make it at all?": the median, not the
        # p99 that sizes batches. A p99 inflated by contention must not shed what would be on time.
        self.lat_shed = (
            LatencyModel(
                self.lat.source,
                max_batch_size,
                model=model,
                device_type=device_type,
                quantile=s.shed_quantile,
                calibrate=False,
            )
            if s.shed_quantile != self.lat.quantile
            else self.lat
        )
        variants, accuracy = c.variants, c.accuracy
        if variants is None and accuracy:
            variants = sorted(accuracy, key=lambda v: -accuracy[v])
        table = self.calibrator.prior if self.calibrator is not None else profile
        if variants is None and isinstance(table, ProfileTable) and model:
            acc = {v: a for (m, v), a in table.accuracy.items() if m == model}
            variants = sorted(acc, key=lambda v: -acc[v]) or None
        self._variants: list[str] = list(variants or ([c.default_variant] if c.default_variant else []))
        self._rank = {v: i for i, v in enumerate(self._variants)}
        self._shared = False  # the last view's QueueView.shared (set by _pools): one set of replicas for every variant
        self.min_gain = s.min_gain
        self.max_wait_s = None if s.max_wait_ms is None else s.max_wait_ms / 1e3
        self.min_wait_s = s.min_wait_ms / 1e3
        self.safety_s = s.safety_ms / 1e3
        # Wait to grow a batch only when arrivals exceed this share of what the current batch size
        # sustains on one replica (below it, dispatching at once costs no throughput that matters).
        self.wait_load = s.wait_load
        self.spill_derate = s.spill_derate
        self.predict_busy = s.predict_busy
        self.levels = LevelController(s.restore_headroom, s.restore_hold_ms / 1e3, s.overload_memory_ms / 1e3)
        self.rate = ArrivalRate(s.rate_window_ms / 1e3)
        self._q = DeadlineOrder()
        self._busy_pred: dict[str, list[float]] = {}  # heap of predicted finishes per variant
        # Lateness feedback (sloserve.batching.policies._levels.LatenessMonitor, docs/batching.md).
        self.lateness = LatenessMonitor(s.late_target, s.late_window_ms / 1e3, s.late_min_rows)

    # ---- variants ---------------------------------------------------------------------------
    def _learn_variants(self, names) -> None:
        for v in names:
            if v not in self._rank:
                self._rank[v] = len(self._variants)
                self._variants.append(v)

    def _allowed(self, item: QueuedItem) -> tuple[str, ...]:
        return item.variants or tuple(self._variants)

    @property
    def level(self) -> int:
        return self.levels.level

    # ---- pools ------------------------------------------------------------------------------
    def _pools(self, view: QueueView, now: float) -> dict[str, Pool]:
        pools = {}
        busy_all = view.busy_until_s
        self._shared = view.shared
        for v in view.idle:
            pred = self._busy_pred.get(v, ())
            while pred and pred[0] < now - 1.0:  # a completion we never heard of: forget it
                heapq.heappop(pred)
        merged = None
        if view.shared and busy_all is None:  # one set of replicas: every variant's batches in flight
            merged = sorted(t for v in view.idle for t in self._busy_pred.get(v, ()))  # occupy them all
        for v, idle in view.idle.items():
            idle = max(0, idle)
            pred = merged if merged is not None else self._busy_pred.get(v, ())
            if busy_all is not None and v in busy_all:
                busy = [max(now, t) for t in busy_all[v]]
                known = True
            else:
                busy = [max(now, t) for t in pred]
                known = self.predict_busy
            if view.depth > 1:
                pools[v] = pipelined_pool(idle, busy, view.depth, now, known)
                continue
            n = max(1, idle + len(busy))  # a variant the driver lists has a replica, maybe busy
            start = now if idle > 0 or not busy or not known else min(busy)
            pools[v] = Pool(idle, n, start, [now] * idle + busy)
        return pools

    # ---- plan -------------------------------------------------------------------------------
    def _sync(self, view: QueueView) -> DeadlineOrder:
        q = self._q
        new = q.sync(view.items)
        if new:
            self.rate.add(new)
            for it in new:
                if it.variants and it.variants[-1] not in self._rank:
                    self._learn_variants(it.variants)
        return q

    def plan(self, view: QueueView, now: float) -> Decision:
        q = self._sync(view)
        ents = q.entries
        if not ents:
            return Wait(None, "empty")
        if not self.lat.model:
            self.lat.model = self.lat_shed.model = view.model
        self._learn_variants(view.idle)
        pools = self._pools(view, now)
        shed, lates, wake_s, need = self._scan(ents, pools, now, q.max_size)
        if shed:
            q.forget(shed)
            return Shed(tuple(shed), "deadline", tuple(lates))
        if not any(p.idle > 0 for p in pools.values()):
            return Wait(wake_s if wake_s < _INF else None, "no_replica")
        B = min(self.max_batch_size, view.max_batch_size)
        memo: dict[tuple[int, float], bool] = {}

        def overloaded(level: int, derate: float = 1.0) -> bool:
            k = (level, derate)
            if k not in memo:
                memo[k] = self._overloaded(ents, pools, level, now, derate, B)
            return memo[k]

        max_level = max((self._rank[v] for v in pools), default=0)
        late_need = self.lateness.need(now, self.levels.level, max_level)
        need_all = max(need, late_need)
        rate = self.rate.rate(now)
        level = self.levels.update(
            now,
            max_level,
            need_all,
            overloaded,
            lambda k: self._comfortable(k, pools, rate, B) and not overloaded(k),
            rate=rate,
            failed_level=late_need,
        )
        reserved: set[int] = set()
        order = self._variants
        shared = view.shared and max_level > 0
        late_now = shared and self.lateness.late_now(now, 0)  # the best variant answered late just now
        # one set of replicas: under overload a freed replica serves a cheaper variant first (ranks 1, 2,
        # ..., the best last), unless the earliest deadline may only go to the best (pinned, min_accuracy)
        head_flexible = shared and any(self._rank.get(v, 0) > 0 for v in self._allowed(ents[0][4]))
        if head_flexible and (late_now or overloaded(0, self.spill_derate)):
            order = sorted(order, key=lambda v: (self._rank[v] == 0, self._rank[v]))
        for v in order:
            p = pools.get(v)
            if p is None or p.idle <= 0:
                continue
            r = self._rank[v]
            if shared:  # by the queue alone, at each freed replica: the same replicas serve either
                # variant, so there is no level to hold (held, it spilled ~3/4 of a load near capacity)
                spill = r > 0 and (need >= r or (late_now and r == 1) or overloaded(r - 1, self.spill_derate))
            elif not 0 < r <= level:
                spill = False
            elif need >= r:  # a near-deadline request only a cheaper variant can still make
                spill = True
            else:
                spill = late_need >= r or overloaded(r - 1, self.spill_derate)
            d = self._plan_pool(v, r, spill, ents, reserved, now, B, p, overloaded)
            if type(d) is Dispatch:
                q.forget(d.ids)
                rows = sum(q.known[i].size for i in d.ids)
                heapq.heappush(self._busy_pred.setdefault(v, []), max(now, p.begin_s) + self.lat.latency_s(v, rows))
                return d
            if d is not None and d < wake_s:
                wake_s = d
        return Wait(wake_s if wake_s < _INF else None, "filling" if reserved else "no_work")

    def _scan(self, ents, pools, now: float, max_size: int):
        """Shed what cannot make it; also the next time something becomes infeasible, and the
        level the near-deadline requests need. Stops at the first deadline every variant meets."""
        lat = self.lat
        reach = [(p.start_s, lat.latency_s(v, max_size)) for v, p in pools.items()]
        if not reach:
            return [], [], _INF, 0
        horizon = max(s + L for s, L in reach)
        l_max = max(L for _, L in reach)
        shed: list[int] = []
        lates: list[float] = []
        wake = _INF
        need = 0
        memo: dict = {}
        for e in ents:
            d = e[1]
            if d >= horizon:
                wake = min(wake, d - l_max)
                if e[0] == ents[-1][0]:  # the rest share its priority level: later deadlines only
                    break
                continue
            it = e[4]
            key = (it.variants, it.size)
            opts = memo.get(key)
            if opts is None:  # (finish if started at the earliest, latency, rank), best first
                opts = memo[key] = [
                    (pools[v].start_s + lat.latency_s(v, it.size), lat.latency_s(v, it.size), self._rank.get(v, 0))
                    for v in self._allowed(it)
                    if v in pools
                ]
            first = True
            latest = -_INF
            for fin, L, rank in opts:
                if fin <= d + EPS_S:
                    if latest == -_INF and not first and rank > need:
                        need = rank
                    latest = max(latest, d - L)
                first = False
            if latest == -_INF:
                fin50 = [
                    pools[v].start_s + self.lat_shed.latency_s(v, it.size) for v in self._allowed(it) if v in pools
                ]
                if fin50 and min(fin50) <= d + EPS_S:
                    continue  # late at p99, on time at the median: dispatched alone (late_start), not shed
                shed.append(it.id)
                lates.append(min(fin50) - d if fin50 else d - it.arrival_s)
            elif latest < wake:
                wake = latest
        return shed, lates, wake + EPS_S, need

    def _capacity(self, v: str, window_s: float, B: int) -> int:
        lat = self.lat
        lb = lat.latency_s(v, B)
        full = int(window_s // lb)
        return full * B + lat.max_rows_within(v, window_s - full * lb)

    def _overloaded(self, ents, pools, level: int, now: float, derate: float, B: int) -> bool:
        """Would the variants of rank <= level miss a deadline serving the whole queue (EDF)?"""
        if self._shared:  # the same replicas under every variant: count them once, as the cheapest
            v = max((v for v in pools if self._rank[v] <= level), key=self._rank.__getitem__, default=None)
            reps = [(f, v) for f in pools[v].free_s] if v is not None else []
        else:
            reps = [(f, v) for v, p in pools.items() if self._rank[v] <= level for f in p.free_s]
        if not reps:
            return True
        cum = 0
        check_at = 0
        last = len(ents) - 1
        for i, e in enumerate(ents):
            cum += e[4].size
            if cum < check_at and i != last:
                continue
            check_at = cum + B
            d = e[1]
            cap = 0
            for f, v in reps:
                if d > f:
                    cap += self._capacity(v, d - f, B)
            if cum > cap * derate:
                return True
        return False

    def _sustainable_rps(self, level: int, pools, B: int) -> float:
        """The profile's throughput of ranks <= level: per replica ``b / p99(b)`` with ``b`` the
        Nexus batch (``2 * p99(b) <= typical SLO``)."""
        slo = self.rate.slo_s
        tput = 0.0
        for v, p in pools.items():
            if self._rank[v] <= level:
                b = max(1, self.lat.max_rows_within(v, slo / 2.0)) if slo > 0 else B
                t = p.replicas * self.lat.throughput_rps(v, min(b, B))
                tput = max(tput, t) if self._shared else tput + t  # shared replicas: counted once
        return tput

    def _comfortable(self, level: int, pools, rate: float, B: int) -> bool:
        """Arrivals (``rate``, rows/s now) fit in the sustainable throughput of ranks <= level, with headroom."""
        return rate <= (1.0 - self.levels.restore_headroom) * self._sustainable_rps(level, pools, B)

    def _keep_up_rows(self, v: str, replicas: int, now: float, B: int) -> int:
        """The smallest batch with which ``v``'s replicas keep up with the arrival rate; 1 when none
        does: past the variant's capacity no batch size drains the queue, the excess is for
        admission and shedding (or a cheaper variant) to take, and passing heads over would only
        make admitted requests late."""
        rate = self.rate.rate(now)
        if rate <= 0.0:
            return 1
        need = rate / max(1, replicas)
        lat = self.lat
        for b in range(1, B + 1):
            if lat.throughput_rps(v, b) >= need:
                return b
        return 1

    def _plan_pool(
        self, v: str, rank: int, spill: bool, ents, reserved: set[int], now: float, B: int, pool: Pool, overloaded
    ):
        """Dispatch for variant ``v`` (its ``pool``), or the time it wants to be asked again, or None.

        ``pool.begin_s``: when the batch would start computing (later than ``now`` in a pipelined
        slot). Such a slot takes only a batch that is already full; a smaller one waits for the
        replica to free, since it could still grow until then."""
        begin = max(now, pool.begin_s)
        got = self._gather(v, rank, spill, ents, reserved, now, B, pool, overloaded, begin)
        if type(got) is Dispatch:
            return got
        ids, rows, cap, skips, head = got
        if not ids:
            return None
        if rows >= cap:
            return Dispatch(tuple(ids), v, "full" if cap >= B else "deadline")
        return self._now_or_later(v, ids, rows, cap, skips, head, reserved, now, begin)

    def _gather(
        self,
        v: str,
        rank: int,
        spill: bool,
        ents,
        reserved: set[int],
        now: float,
        B: int,
        pool: Pool,
        overloaded,
        begin: float,
    ):
        """The batch ``v`` would take: ``(ids, rows, cap, skips, head)``, or a late start's Dispatch.

        ``keep_up`` (from the pool's replicas and the arrival rate, computed only when a head is
        short of slack): the batch size with which this variant keeps up with the arrivals. When
        the queue is backlogged (``overloaded(rank)``, memoised by ``plan``: serving it in deadline
        order on ranks <= ``rank`` would miss a deadline)
        a head whose slack allows only a smaller batch, while more work is queued behind it, is
        passed over for the first request with the slack for a ``keep_up`` batch. Without a
        backlog a tight head is served as it is: a request that simply asked for a small
        ``slo_ms`` must not be passed over at normal load. Serving it would
        spend the replica on a batch too small to keep up, so every request behind it would age
        into the same state: after an overload, a deadline-ordered queue otherwise settles into
        one-row batches that never drain it (docs/batching.md). The request passed over stays
        queued: another replica or variant may still take it, else it is shed when infeasible."""
        lat = self.lat
        ids: list[int] = []
        rows = cap = skips = 0
        head = None
        passed = 0
        keep_up = 0  # not computed yet
        total = self._q.rows
        prefix = 0  # rows of every entry up to and including this one
        for e in ents:
            it = e[4]
            prefix += it.size
            if not self._eligible(it, v, rank, spill, reserved):
                continue
            if head is None:
                c = min(B, lat.max_rows_within(v, e[1] - begin - self.safety_s + EPS_S))
                if it.size <= c < B and passed < _MAX_PASS:
                    if not keep_up:
                        keep_up = self._keep_up_rows(v, pool.replicas, now, B)
                    if c < keep_up and total - prefix >= keep_up and overloaded(rank):
                        passed += 1
                        continue
                if c < it.size:
                    # Past the safety margin but not the deadline: go now rather than wait and shed
                    # a request that can still make it, with as many rows as the median says still
                    # fit (not alone: under overload a batch of one wastes the replica's capacity).
                    fit = min(B, self.lat_shed.max_rows_within(v, e[1] - begin + EPS_S))
                    if fit >= it.size:
                        return self._late_start(v, rank, spill, ents, reserved, fit)
                    continue  # v cannot make this one; a faster variant may
                head, cap = it, c
            if rows + it.size > cap:
                skips += 1
                if skips > 8:
                    break
                continue
            ids.append(it.id)
            rows += it.size
            if rows >= cap:
                break
        return ids, rows, cap, skips, head

    def _now_or_later(
        self,
        v: str,
        ids: list[int],
        rows: int,
        cap: int,
        skips: int,
        head: QueuedItem,
        reserved: set[int],
        now: float,
        begin: float,
    ):
        """A batch short of its cap: dispatch it now, or the time to look again (its ids reserved)."""
        lat = self.lat
        latest = head.deadline_s - lat.latency_s(v, rows) - self.safety_s
        if begin > now + EPS_S:  # a pipelined slot: only full batches queue behind the running one
            reserved.update(ids)
            return min(latest, begin)
        if skips:
            return Dispatch(tuple(ids), v, "packed")
        if self.max_wait_s is not None:
            latest = min(latest, min(self._q.known[i].arrival_s for i in ids) + self.max_wait_s)
        nb = lat.next_better(v, rows, self.min_gain)
        if nb > cap:
            return Dispatch(tuple(ids), v, "no_gain")
        room = latest - now
        if room < self.min_wait_s:
            return Dispatch(tuple(ids), v, "deadline")
        rate = self.rate.rate(now)
        if rate <= 0.0 or (nb - rows) / rate > room:
            return Dispatch(tuple(ids), v, "no_gain")
        if rate < self.wait_load * rows / lat.latency_s(v, rows):
            # Batches of this size already keep up with the arrivals: waiting would buy throughput
            # nobody needs and cost every request latency (the low-load case).
            return Dispatch(tuple(ids), v, "idle")
        reserved.update(ids)
        return latest

    def _eligible(self, it: QueuedItem, v: str, rank: int, spill: bool, reserved: set[int]) -> bool:
        """May variant ``v`` (of ``rank``) take ``it`` now? A cheaper variant serves only the
        overflow (requests that prefer a better one), and only when degraded (``spill``)."""
        allowed = self._allowed(it)
        if v not in allowed or it.id in reserved:
            return False
        return rank == 0 or allowed[0] == v or spill

    def _late_start(self, v: str, rank: int, spill: bool, ents, reserved: set[int], fit: int) -> Dispatch:
        """The head request (first eligible in ``ents``) and the next eligible ones, up to ``fit`` rows."""
        ids: list[int] = []
        rows = 0
        for e in ents:
            it = e[4]
            if not self._eligible(it, v, rank, spill, reserved):
                continue
            if rows + it.size > fit:
                if ids:
                    break
                continue
            ids.append(it.id)
            rows += it.size
        return Dispatch(tuple(ids), v, "late_start")

    # ---- admission and learning -------------------------------------------------------------
    def admit(self, view: QueueView, item: QueuedItem, now: float) -> Shed | None:
        """``None`` to admit, or a :class:`Shed` (reason ``admission``) if it cannot make it.

        The finish time is predicted discretely: the rows ahead of ``item`` in deadline order are
        served in full batches of ``B`` on the allowed variants' replicas, each starting when its
        replica frees (an idle one now, a busy one when its in-flight batch is predicted to end),
        and ``item`` rides in the batch after them with the leftover rows. A fluid estimate
        (rows / throughput, start = now) admits up to a batch and a half too many at a small
        ``B``: those requests were late by a batch under overload (docs/reliability.md)."""
        self.predicted_finish_s: float | None = None  # the last admitted request's predicted finish, for its trace
        q = self._sync(view)
        self._learn_variants(view.idle)
        pools = self._pools(view, now)
        B = min(self.max_batch_size, view.max_batch_size)
        free: list[tuple[float, int, str]] = []
        allowed = [v for v in self._allowed(item) if v in pools]
        if view.shared and allowed:  # the same replicas under every variant: once, as the variant an
            # overload turns to first (the next down from the best allowed), or the only one allowed
            down = [v for v in allowed if self._rank.get(v, 0) > 0]
            allowed = [min(down, key=lambda v: self._rank.get(v, 0))] if down else allowed[:1]
        for v in allowed:
            p = pools[v]  # a busy replica whose batch this policy did not see: free now
            free.extend((t, self._rank.get(v, 0), v) for t in (p.free_s[: p.replicas] or [now]))
        if not free:
            return Shed((item.id,), "admission", (item.deadline_s - item.arrival_s,))
        ahead = q.rows_before(item)
        if ahead == 0 and any(view.idle.get(v, 0) > 0 for v in self._allowed(item)):
            # Nothing queued ahead and a replica free: always let it try. Refusing here would refuse
            # on the calibrator's word alone, and with nothing admitted no batch would ever correct a
            # stale (too slow) estimate: the system would refuse forever after an overload.
            return None
        finish = predict_finish(self.lat_shed, free, ahead, item.size, B, self.safety_s)
        if finish > item.deadline_s + EPS_S:
            return Shed((item.id,), "admission", (finish - item.deadline_s,))
        self.predicted_finish_s = finish
        return None

    def observe(self, result: BatchResult) -> None:
        pred = self._busy_pred.get(result.variant)
        if pred:
            heapq.heappop(pred)
        self.lat.observe(result)
        if result.ok:
            self.lateness.observe(result.finished_s, self._rank.get(result.variant, 0), result.rows, result.late_rows)
