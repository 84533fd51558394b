"""Offline driver: run a batching policy over a list of requests in virtual time.

:func:`replay` is the discrete-event twin of :class:`sloserve.batching.batcher.Batcher`: the same queue
(arrival order, requests removed by id), the same ``QueueView``, the same rule for calling the
policy (after every arrival, batch completion or ``Wait`` timer that fires, over and over until
it answers ``Wait``; never on an empty queue), the same timer floor (20 us), one replica pool per
variant. No clock, sleep or asyncio: time jumps from event to event, so a run is deterministic
and fast (tens of thousands of requests per second of CPU). :class:`VirtualQueue` is the plan
loop itself, which the request-level simulator (``sloserve/sim/engine.py``) drives too.

>>> from sloserve.batching.policies.timeout import TimeoutPolicy
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
from typing import Protocol

from sloserve.batching.policy import BatchPolicy
from sloserve.batching.types import BatchResult, Dispatch, QueuedItem, QueueView, Shed, Wait

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
        return not self.shed and self.finish_s is not None and self.finish_s <= self.deadline_s + ON_TIME_EPS_S


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
        # an on-time request was served, so its variant is set
        return sum(accuracy[o.variant] for o in self.outcomes if o.on_time and o.variant is not None) / n if n else 0.0


class PolicyError(RuntimeError):
    """The policy returned a decision the driver cannot carry out (``strict`` mode)."""


class Slots(Protocol):
    """The replicas a :class:`VirtualQueue` dispatches to, as its driver keeps them."""

    def state(self, now: float) -> tuple[Mapping[str, int], Mapping[str, Sequence[float]] | None]:
        """Free slots per variant, and (optionally) each variant's busy replicas' finish times."""

    def start(self, d: Dispatch, items: list[QueuedItem], now: float) -> bool:
        """Start the batch ``items`` on a free replica of ``d.variant``; False when none is free."""

    def shed(self, d: Shed, items: list[QueuedItem], now: float) -> None:
        """The policy shed ``items``."""


class VirtualQueue:
    """One model's queue under a batching policy in virtual time: the one driver of a policy that
    :func:`replay` and the request-level simulator (``sloserve/sim/engine.py``) share, and the twin of the live
    :class:`~sloserve.batching.batcher.Batcher`: the same queue (arrival order, requests removed by id), the
    same ``QueueView``, the same rule for calling the policy (after every event, over and over until
    it answers ``Wait``; never on an empty queue). The driver keeps the clock and the replicas
    (:class:`Slots`).

    ``strict`` raises :class:`PolicyError` on a decision the live batcher would refuse: unknown ids,
    a batch over ``max_batch_size``, a dispatch to a variant with no free slot, an empty decision.
    Without it such a dispatch stops the plan loop until the next event (or ``retry_s`` later).
    """

    def __init__(
        self,
        policy: BatchPolicy,
        model: str,
        max_batch_size: int,
        *,
        depth: int = 1,
        shared: bool = False,
        strict: bool = True,
        retry_s: float | None = None,
        max_plans_per_instant: int = 100_000,
    ):
        self.policy, self.model, self.max_batch_size = policy, model, max_batch_size
        self.depth, self.shared, self.strict = depth, shared, strict
        self.retry_s = retry_s  # not strict: a dispatch with no free slot is planned again this much later
        self.max_plans_per_instant = max_plans_per_instant
        self.items: list[QueuedItem] = []
        self.queued: dict[int, QueuedItem] = {}
        self.decisions = 0  # plan() calls

    def view(self, slots: Slots, now: float) -> QueueView:
        idle, busy = slots.state(now)
        return QueueView(self.model, self.items, idle, self.max_batch_size, busy, self.depth, self.shared)

    def add(self, item: QueuedItem) -> None:
        self.items.append(item)
        self.queued[item.id] = item

    def admit(self, item: QueuedItem, slots: Slots, now: float) -> Shed | None:
        """The policy's admission of ``item`` (None: queue it)."""
        return self.policy.admit(self.view(slots, now), item, now)

    def remove(self, ids: tuple[int, ...]) -> list[QueuedItem]:
        items = self.items
        n = len(ids)
        if items[:n] and all(items[k].id == ids[k] for k in range(n)):
            out = items[:n]
            del items[:n]
        else:
            drop = set(ids)
            out = [it for it in items if it.id in drop]
            self.items = [it for it in items if it.id not in drop]
        for it in out:
            del self.queued[it.id]
        return out

    def run(self, slots: Slots, now: float) -> float | None:
        """Plan until the policy waits, carrying out each decision through ``slots``; returns when the
        policy asked to be called again (None: at the next event)."""
        plans = 0
        while self.items:
            self.decisions += 1
            plans += 1
            if plans > self.max_plans_per_instant:
                raise PolicyError(f"policy made {plans} decisions at t={now} without waiting")
            d = self.policy.plan(self.view(slots, now), now)
            if type(d) is Wait:
                return d.until_s
            if not d.ids or any(x not in self.queued for x in d.ids):
                if self.strict:
                    raise PolicyError(f"decision names no or unknown queued ids: {d!r}")
                if not d.ids:
                    return None
            if type(d) is Shed:
                items = self.remove(d.ids)
                slots.shed(d, items, now)
                if not items:
                    return None
                continue
            if not isinstance(d, Dispatch):
                raise PolicyError(f"not a decision: {d!r}")
            known = [self.queued[i] for i in d.ids if i in self.queued]
            if self.strict and sum(it.size for it in known) > self.max_batch_size:
                raise PolicyError(
                    f"batch of {sum(it.size for it in known)} rows over max_batch_size {self.max_batch_size}"
                )
            if not slots.start(d, known, now):
                if self.strict:
                    raise PolicyError(f"dispatch to {d.variant!r} with no idle replica: {d!r}")
                return None if self.retry_s is None else now + self.retry_s
            self.remove(d.ids)
        return None


class _FixedSlots:
    """``replay``'s replicas: a fixed pool per variant, each queueing up to ``depth`` batches."""

    def __init__(
        self,
        n_rep: Mapping[str, int],
        depth: int,
        busy_until: bool,
        latency_fn,
        rows_of,
        outcomes,
        batches: list,
        completions: list,
    ):
        # a free slot is a replica id, listed once per batch it can still queue
        self.free: dict[str, list[int]] = {v: [r for r in range(n) for _ in range(depth)] for v, n in n_rep.items()}
        self.busy: dict[str, dict[int, float]] = {v: {} for v in n_rep}  # replica -> finish time (depth 1)
        self.last_fin: dict[str, dict[int, float]] = {v: {} for v in n_rep}  # replica -> its last batch's finish
        self.depth, self.busy_until, self.latency_fn = depth, busy_until, latency_fn
        self.rows_of, self.outcomes, self.batches, self.completions = rows_of, outcomes, batches, completions

    def state(self, now: float):
        idle = {v: len(f) for v, f in self.free.items()}
        return idle, ({v: tuple(b.values()) for v, b in self.busy.items()} if self.busy_until else None)

    def start(self, d: Dispatch, items: list[QueuedItem], now: float) -> bool:
        pool = self.free.get(d.variant)
        if not pool:
            return False
        rows = sum(it.size for it in items)
        if self.depth == 1:
            rep = pool.pop()
        else:  # the replica that frees first, as the in-process backend's queue of free replicas does
            lf = self.last_fin[d.variant]
            rep = min(set(pool), key=lambda r: (lf.get(r, 0.0), r))
            pool.remove(rep)
        start = max(now, self.last_fin[d.variant].get(rep, now))
        fin = start + self.latency_fn(d.variant, rows)
        self.last_fin[d.variant][rep] = fin
        bi = len(self.batches)
        self.batches.append(BatchRecord(bi, d.variant, rep, start, fin, rows, tuple(it.id for it in items), d.reason))
        if self.depth == 1:
            self.busy[d.variant][rep] = fin
        heapq.heappush(self.completions, (fin, bi, rep))
        for it in items:
            self.outcomes[it.id] = RequestOutcome(
                it.id, it.arrival_s, it.deadline_s, d.variant, now, fin, bi, reason=d.reason
            )
        return True

    def shed(self, d: Shed, items: list[QueuedItem], now: float) -> None:
        lates = d.late_by_s or (0.0,) * len(items)
        for it, late in zip(items, lates, strict=False):
            self.outcomes[it.id] = RequestOutcome(
                it.id, it.arrival_s, it.deadline_s, finish_s=now, shed=True, reason=d.reason, late_by_s=late
            )

    def complete(self, now: float, policy: BatchPolicy, model: str, device_type: str) -> None:
        """Free the replicas of the batches done by ``now`` and tell the policy."""
        while self.completions and self.completions[0][0] <= now:
            fin, bi, rep = heapq.heappop(self.completions)
            b = self.batches[bi]
            self.busy[b.variant].pop(rep, None)
            self.free[b.variant].append(rep)
            late = sum(self.rows_of[rid] for rid in b.ids if fin > self.outcomes[rid].deadline_s)  # rows, as live
            policy.observe(
                BatchResult(model, b.variant, b.rows, fin - b.start_s, fin, True, device_type, late_rows=late)
            )


def replay(
    policy: BatchPolicy,
    requests: Iterable[Request],
    latency_fn: Callable[[str, int], float],
    n_replicas_per_variant: Mapping[str, int] | int,
    *,
    model: str = "m",
    max_batch_size: int = 32,
    variants: Sequence[str] | None = None,
    admission: bool = False,
    busy_until: bool = False,
    device_type: str = "cpu",
    strict: bool = True,
    max_plans_per_instant: int = 100_000,
    depth: int = 1,
) -> ReplayResult:
    """Run ``policy`` on ``requests`` in virtual time.

    ``latency_fn(variant, rows) -> seconds`` is the *actual* service time of a batch (pass a
    seeded sampler for noise). ``n_replicas_per_variant``: an int gives every variant in
    ``variants`` (default: those the requests name) that many replicas. ``admission``: call
    ``policy.admit(view, item, now)`` before queueing. ``busy_until``: give the policy each busy
    replica's true finish time in ``QueueView.busy_until_s`` (the live batcher does not).
    ``depth``: batches each replica queues (the in-process backend's ``inprocess_pipeline_depth``):
    a batch in a queued slot starts when the replica's previous batch ends, and the view carries
    ``depth`` (``busy_until`` needs depth 1). ``strict``: see :class:`VirtualQueue`.
    """
    reqs = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    if variants is None:
        seen: dict[str, None] = {}
        for r in reqs:
            for v in r.variants:
                seen.setdefault(v)
        variants = list(seen) or [policy.context.default_variant or "default"]
    if isinstance(n_replicas_per_variant, int):
        n_replicas_per_variant = {v: n_replicas_per_variant for v in variants}
    if depth < 1 or (depth > 1 and busy_until):
        raise ValueError(
            f"depth must be >= 1 (got {depth}), and busy_until needs depth 1 (got busy_until={busy_until})"
        )
    outcomes: dict[int, RequestOutcome] = {}
    batches: list[BatchRecord] = []
    completions: list[tuple[float, int, int]] = []  # (finish_s, batch index, replica)
    slots = _FixedSlots(
        dict(n_replicas_per_variant),
        depth,
        busy_until,
        latency_fn,
        {r.id: r.size for r in reqs},
        outcomes,
        batches,
        completions,
    )
    q = VirtualQueue(
        policy,
        model,
        max_batch_size,
        depth=depth,
        strict=strict,
        retry_s=0.001,
        max_plans_per_instant=max_plans_per_instant,
    )
    timer_s: float | None = None
    i, n_req = 0, len(reqs)
    while True:
        # next event time: an arrival, a completion or the timer
        cands = [
            t
            for t in (reqs[i].arrival_s if i < n_req else None, completions[0][0] if completions else None, timer_s)
            if t is not None
        ]
        if not cands:
            break
        now = min(cands)
        timer_s = None  # any wake-up cancels the timer, as in the live loop
        slots.complete(now, policy, model, device_type)
        while i < n_req and reqs[i].arrival_s <= now:
            r = reqs[i]
            i += 1
            item = QueuedItem(r.id, r.arrival_s, r.arrival_s + r.slo_s, r.size, r.priority, r.variants)
            refused = q.admit(item, slots, now) if admission else None
            if refused is not None:
                late = refused.late_by_s[0] if refused.late_by_s else 0.0
                outcomes[r.id] = RequestOutcome(
                    r.id, r.arrival_s, item.deadline_s, finish_s=now, shed=True, reason=refused.reason, late_by_s=late
                )
                continue
            q.add(item)
        until = q.run(slots, now)
        if until is not None:
            timer_s = now + max(until - now, MIN_TIMER_S)
    stranded = tuple(it.id for it in q.items)
    for it in q.items:
        outcomes[it.id] = RequestOutcome(it.id, it.arrival_s, it.deadline_s, reason="stranded")
    return ReplayResult(tuple(outcomes[r.id] for r in reqs), tuple(batches), q.decisions, stranded)
