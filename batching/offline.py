"""Offline driver: run a batching policy over a list of requests in virtual time.

:func:`replay` is the discrete-event twin of :class:`batching.batcher.Batcher`: the same queue
(arrival order, requests removed by id), the same ``QueueView``, the same rule for calling the
policy (after every arrival, batch completion or ``Wait`` timer that fires, over and over until
it answers ``Wait``; never on an empty queue), the same timer floor (20 us), one replica pool per
variant. No clock, sleep or asyncio: time jumps from event to event, so a run is deterministic
and fast (tens of thousands of requests per second of CPU). The simulator (sim/) reuses it for
request-level runs.

>>> from batching.timeout import TimeoutPolicy
>>> reqs = [Request(i, arrival_s=i * 0.001, slo_s=0.02) for i in range(4)]
>>> r = replay(TimeoutPolicy(max_batch_size=2, max_wait_ms=1.0, default_variant="v"), reqs,
...            lambda v, n: 0.002, {"v": 1}, max_batch_size=2)
>>> [b.rows for b in r.batches], r.attainment
([2, 2], 1.0)
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from batching.policy import BatchPolicy
from batching.types import BatchResult, Dispatch, QueuedItem, QueueView, Shed, Wait

MIN_TIMER_S = 20e-6  # the live batcher never sleeps less than this
ON_TIME_EPS_S = 1e-9  # float slack when comparing a finish time with a deadline


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a workload: ``slo_s`` from arrival; ``variants`` allowed, best first."""

    id: int
    arrival_s: float
    slo_s: float
    size: int = 1
    priority: int = 0
    variants: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What happened to one request. Exactly one of served (``variant`` set) or ``shed``."""

    id: int
    arrival_s: float
    deadline_s: float
    variant: str | None = None
    start_s: float | None = None  # when its batch was dispatched
    finish_s: float | None = None  # when it was answered (served or shed)
    batch: int = -1  # index into ReplayResult.batches
    shed: bool = False
    reason: str = ""  # shed reason ("deadline", "admission") or the dispatch reason
    late_by_s: float = 0.0  # the policy's estimate, for a shed request

    @property
    def on_time(self) -> bool:
        return (not self.shed and self.finish_s is not None
                and self.finish_s <= self.deadline_s + ON_TIME_EPS_S)


@dataclass(frozen=True, slots=True)
class BatchRecord:
    index: int
    variant: str
    replica: int
    start_s: float
    finish_s: float
    rows: int
    ids: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class ReplayResult:
    outcomes: tuple[RequestOutcome, ...]  # in the order of the input requests
    batches: tuple[BatchRecord, ...]
    decisions: int  # plan() calls
    stranded: tuple[int, ...] = ()  # ids still queued when events ran out (a policy that never acts)

    @property
    def attainment(self) -> float:
        n = len(self.outcomes)
        return sum(o.on_time for o in self.outcomes) / n if n else 1.0

    @property
    def shed_share(self) -> float:
        n = len(self.outcomes)
        return sum(o.shed for o in self.outcomes) / n if n else 0.0

    def goodput_rps(self) -> float:
        if not self.outcomes:
            return 0.0
        t0 = min(o.arrival_s for o in self.outcomes)
        t1 = max((o.finish_s or o.arrival_s) for o in self.outcomes)
        return sum(o.on_time for o in self.outcomes) / max(t1 - t0, 1e-9)

    def effective_accuracy(self, accuracy: Mapping[str, float]) -> float:
        """Sum of the accuracy of on-time responses / all requests (the Model-Switching metric)."""
        n = len(self.outcomes)
        return sum(accuracy[o.variant] for o in self.outcomes if o.on_time) / n if n else 0.0


class PolicyError(RuntimeError):
    """The policy returned a decision the driver cannot carry out (``strict`` mode)."""


def replay(policy: BatchPolicy, requests: Iterable[Request], latency_fn: Callable[[str, int], float],
           n_replicas_per_variant: Mapping[str, int] | int, *, model: str = "m",
           max_batch_size: int = 32, variants: Sequence[str] | None = None, admission: bool = False,
           busy_until: bool = False, device_type: str = "cpu", strict: bool = True,
           max_plans_per_instant: int = 100_000, depth: int = 1) -> ReplayResult:
    """Run ``policy`` on ``requests`` in virtual time.

    ``latency_fn(variant, rows) -> seconds`` is the *actual* service time of a batch (pass a
    seeded sampler for noise). ``n_replicas_per_variant``: an int gives every variant in
    ``variants`` (default: those the requests name) that many replicas. ``admission``: call
    ``policy.admit(view, item, now)`` before queueing, if the policy has one. ``busy_until``:
    give the policy each busy replica's true finish time in ``QueueView.busy_until_s`` (the live
    batcher does not). ``depth``: batches each replica queues (the in-process backend's
    ``inprocess_pipeline_depth``): a batch in a queued slot starts when the replica's previous
    batch ends, and the view carries ``depth`` (``busy_until`` needs depth 1). ``strict`` raises :class:`PolicyError` on unknown ids, batches over
    ``max_batch_size``, dispatches to a variant with no idle replica, or an empty Dispatch/Shed.
    """
    reqs = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    rows_of = {r.id: r.size for r in reqs}
    if variants is None:
        seen: dict[str, None] = {}
        for r in reqs:
            for v in r.variants:
                seen.setdefault(v)
        variants = list(seen) or [getattr(policy, "default_variant", "") or "default"]
    if isinstance(n_replicas_per_variant, int):
        n_replicas_per_variant = {v: n_replicas_per_variant for v in variants}
    n_rep = dict(n_replicas_per_variant)
    if depth < 1 or (depth > 1 and busy_until):
        raise ValueError(f"depth must be >= 1 (got {depth}), and busy_until needs depth 1 (got busy_until={busy_until})")
    # a free slot is a replica id, listed once per batch it can still queue
    free: dict[str, list[int]] = {v: [r for r in range(n) for _ in range(depth)] for v, n in n_rep.items()}
    busy: dict[str, dict[int, float]] = {v: {} for v in n_rep}  # replica -> finish time (depth 1)
    last_fin: dict[str, dict[int, float]] = {v: {} for v in n_rep}  # replica -> its last batch's finish
    admit = getattr(policy, "admit", None) if admission else None

    queue: list[QueuedItem] = []
    queued: dict[int, QueuedItem] = {}
    outcomes: dict[int, RequestOutcome] = {}
    batches: list[BatchRecord] = []
    completions: list[tuple[float, int, int]] = []  # (finish_s, batch index, replica)
    timer_s: float | None = None
    decisions = 0
    i = 0
    n_req = len(reqs)

    def view() -> QueueView:
        idle = {v: len(f) for v, f in free.items()}
        bu = {v: tuple(b.values()) for v, b in busy.items()} if busy_until else None
        return QueueView(model, queue, idle, max_batch_size, bu, depth)

    def remove(ids: tuple[int, ...]) -> list[QueuedItem]:
        nonlocal queue
        n = len(ids)
        if queue[:n] and all(queue[k].id == ids[k] for k in range(n)):
            out = queue[:n]
            del queue[:n]
        else:
            drop = set(ids)
            out = [it for it in queue if it.id in drop]
            queue = [it for it in queue if it.id not in drop]
        for it in out:
            del queued[it.id]
        return out

    while True:
        # next event time: an arrival, a completion or the timer
        t_arr = reqs[i].arrival_s if i < n_req else None
        t_done = completions[0][0] if completions else None
        cands = [t for t in (t_arr, t_done, timer_s) if t is not None]
        if not cands:
            break
        now = min(cands)
        timer_s = None  # any wake-up cancels the timer, as in the live loop
        while completions and completions[0][0] <= now:
            fin, bi, rep = heapq.heappop(completions)
            b = batches[bi]
            busy[b.variant].pop(rep, None)
            free[b.variant].append(rep)
            late = sum(rows_of[rid] for rid in b.ids if fin > outcomes[rid].deadline_s)  # rows, as the live batcher counts
            policy.observe(BatchResult(model, b.variant, b.rows, fin - b.start_s, fin, True, device_type,
                                       late_rows=late))
        while i < n_req and reqs[i].arrival_s <= now:
            r = reqs[i]
            i += 1
            item = QueuedItem(r.id, r.arrival_s, r.arrival_s + r.slo_s, r.size, r.priority, r.variants)
            if admit is not None:
                refused = admit(view(), item, now)
                if refused is not None:
                    late = refused.late_by_s[0] if refused.late_by_s else 0.0
                    outcomes[r.id] = RequestOutcome(r.id, r.arrival_s, item.deadline_s, finish_s=now,
                                                    shed=True, reason=refused.reason, late_by_s=late)
                    continue
            queue.append(item)
            queued[item.id] = item
        plans = 0
        while queue:
            decisions += 1
            plans += 1
            if plans > max_plans_per_instant:
                raise PolicyError(f"policy made {plans} decisions at t={now} without waiting")
            d = policy.plan(view(), now)
            kind = type(d)
            if kind is Wait:
                if d.until_s is not None:
                    timer_s = now + max(d.until_s - now, MIN_TIMER_S)
                break
            if strict and (not d.ids or any(x not in queued for x in d.ids)):
                raise PolicyError(f"decision names no or unknown queued ids: {d!r}")
            if kind is Shed:
                lates = d.late_by_s or (0.0,) * len(d.ids)
                for it, late in zip(remove(d.ids), lates):
                    outcomes[it.id] = RequestOutcome(it.id, it.arrival_s, it.deadline_s, finish_s=now,
                                                     shed=True, reason=d.reason, late_by_s=late)
                continue
            if not isinstance(d, Dispatch):
                raise PolicyError(f"not a decision: {d!r}")
            pool = free.get(d.variant)
            if not pool:
                if strict:
                    raise PolicyError(f"dispatch to {d.variant!r} with no idle replica: {d!r}")
                timer_s = now + 0.001
                break
            items = remove(d.ids)
            rows = sum(it.size for it in items)
            if strict and rows > max_batch_size:
                raise PolicyError(f"batch of {rows} rows over max_batch_size {max_batch_size}")
            if depth == 1:
                rep = pool.pop()
            else:  # the replica that frees first, as the in-process backend's queue of free replicas does
                lf = last_fin[d.variant]
                rep = min(set(pool), key=lambda r: (lf.get(r, 0.0), r))
                pool.remove(rep)
            start = max(now, last_fin[d.variant].get(rep, now))
            fin = start + latency_fn(d.variant, rows)
            last_fin[d.variant][rep] = fin
            bi = len(batches)
            batches.append(BatchRecord(bi, d.variant, rep, start, fin, rows, tuple(it.id for it in items), d.reason))
            if depth == 1:
                busy[d.variant][rep] = fin
            heapq.heappush(completions, (fin, bi, rep))
            for it in items:
                outcomes[it.id] = RequestOutcome(it.id, it.arrival_s, it.deadline_s, d.variant, now, fin,
                                                 bi, reason=d.reason)
    stranded = tuple(it.id for it in queue)
    for it in queue:
        outcomes[it.id] = RequestOutcome(it.id, it.arrival_s, it.deadline_s, reason="stranded")
    return ReplayResult(tuple(outcomes[r.id] for r in reqs), tuple(batches), decisions, stranded)
