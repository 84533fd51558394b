"""The live driver of a batching policy: one queue and dispatch loop per model.

The mechanism owns the queue, the futures and the replicas' busy counts; the policy owns every
decision. The loop asks ``policy.plan(view, now)`` whenever the queue or a replica changes, or
when the policy's ``Wait.until_s`` comes, and carries out the answer:

* ``Dispatch`` pops the requests, concatenates their inputs along dim 0 and hands the whole batch
  to the runner (one call per batch, never per request); each request then gets its own slice;
* ``Shed`` fails the requests at once with 503 + Retry-After;
* ``Wait`` parks the loop until the time comes or something changes.

Outcomes are reported to ``on_event`` lazily (the metrics hook), never formatted on the hot path.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from sloserve.batching.clock import Clock, MonotonicClock
from sloserve.batching.errors import (
    DeadlineUnreachable,
    InternalError,
    ReplicaFailed,
    ServingError,
    TooManyRequests,
    Unavailable,
)
from sloserve.batching.policy import BatchPolicy
from sloserve.batching.queuelimit import DELAYED_LEVEL, QueueLimit, level_full, timeout_error
from sloserve.batching.types import BatchResult, Dispatch, QueuedItem, QueueView, Shed, Wait

log = logging.getLogger("sloserve.batching")


def _ms(seconds: float) -> str:
    """Milliseconds for an error text: one decimal, more below 0.1 ms (never "0.0 ms" for 10 us).

    >>> _ms(0.02), _ms(0.00001), _ms(0.0)
    ('20.0', '0.010', '0.000')
    """
    ms = seconds * 1e3
    return f"{ms:.1f}" if abs(ms) >= 0.1 else f"{ms:.3f}"


class BatchRunner(Protocol):
    """Runs one batch on one replica of ``variant``; the Backend of the gateway implements it.

    ``round_trip_latency``: the batcher calibrates the policy on each batch's round trip (True: the
    hand-off is part of what a deadline pays) or on the replica's own compute time (False), in which
    case the policy also models ``pipeline_depth`` (batches queued per replica, ``QueueView.depth``).
    ``shared(model)``: the model's replicas hold every variant, so their slots are one set."""

    round_trip_latency: bool
    pipeline_depth: int

    def slots(self, model: str, variant: str) -> int: ...

    def shared(self, model: str) -> bool: ...

    def run(
        self, model: str, variant: str, inputs: dict[str, np.ndarray], timeout_s: float | None = None
    ) -> Awaitable[RunResult]: ...


@dataclass(slots=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    compute_s: float
    device_type: str = "cpu"


@dataclass(slots=True)
class Outcome:
    """What one request gets back: its slice of the batch outputs and how it was served."""

    outputs: dict[str, np.ndarray]
    variant: str
    batch_rows: int
    queue_s: float
    compute_s: float
    device_type: str = "cpu"


@dataclass(slots=True)
class _Entry:
    item: QueuedItem
    inputs: dict[str, np.ndarray]
    future: asyncio.Future
    enqueued_s: float
    on_shed: ShedHook | None = None
    trace: Any = None  # the request's trace when it is sampled (sloserve/gateway/tracing.py)


EventHook = Callable[[str, object], None]
_SHUTTING_DOWN = "the server is shutting down; retry"
# A caller's hook that answers a shed request at once, from inside the decision, without waiting for
# the request's coroutine to be scheduled again (True when it answered).
ShedHook = Callable[[Exception], bool]


class Batcher:
    """Queue + dispatch loop for one model.

    >>> # b = Batcher("digits", policy, runner, variants=["large", "medium"], max_batch_size=64)
    >>> # outcome = await b.submit(inputs, rows=1, deadline_s=now + 0.02, variants=("large",))
    """

    def __init__(
        self,
        model: str,
        policy: BatchPolicy,
        runner: BatchRunner,
        variants: list[str],
        max_batch_size: int,
        max_queue_rows: int = 4096,
        clock: Clock | None = None,
        on_event: EventHook | None = None,
        late_grace_s: float | None = None,
        no_replica_wait_s: float = 2.0,
        uniform_inputs: bool = False,
    ):
        self.model = model
        # every request's tensors have the same per-row shapes (no variable dimension): any requests
        # share a batch, and the per-batch shape check is skipped
        self.uniform_inputs = uniform_inputs
        self.policy = policy
        self.runner = runner
        self.variants = list(variants)
        self.max_batch_size = max_batch_size
        self.max_queue_rows = max_queue_rows
        self.clock = clock or MonotonicClock()
        self.on_event = on_event or (lambda kind, rec: None)
        # A dispatched batch is awaited at most until its latest deadline + late_grace_s (None: no bound).
        self.late_grace_s = late_grace_s
        # A request whose every allowed variant has had no replica for this long fails (503), queued or new.
        self.no_replica_wait_s = no_replica_wait_s
        self._no_slots_since: dict[str, float] = {}
        self._starve_timer: asyncio.TimerHandle | None = None
        self.round_trip_latency = runner.round_trip_latency
        # A runner that reports pure compute tells the policy how it pipelines (QueueView.depth).
        self._depth = 1 if self.round_trip_latency else max(1, runner.pipeline_depth)
        self._shared = runner.shared(model) and len(self.variants) > 1  # one set of replicas for every variant
        self._entries: dict[int, _Entry] = {}
        self._items: list[QueuedItem] = []
        self._rows = 0
        self._busy: dict[str, int] = {v: 0 for v in variants}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._due_s: float | None = None  # when the policy's last Wait comes due
        self._freed = False  # a replica finished a batch since the last plan
        self._task: asyncio.Task | None = None
        self._batches: set[asyncio.Task] = set()
        self._closed = False
        self._closing_why = _SHUTTING_DOWN  # what a request refused on the way out is told
        # tracing (sloserve/gateway/tracing.py's BatchTracer): start(model, key, rows, requests, traces,
        # reason) -> handle, end(handle, device_type, compute_s, error); None: tracing is off
        self.tracer: Any = None

    # ---- public surface -------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.model}")

    async def drain(self, timeout_s: float, why: str) -> None:
        """Stop taking requests (``submit`` raises :class:`Unavailable` saying ``why``), let the queued
        ones and the batches in flight finish for at most ``timeout_s``, then :meth:`close`: a request
        still queued then gets 503 saying ``why``."""
        self._closing_why = why
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while (self._entries or self._batches) and loop.time() < end:
            await asyncio.sleep(0.01)
        await self.close()

    def capacity_changed(self) -> None:
        """The runner's slots changed outside a batch's end (a replica came or went, a lease grew or ran
        out): plan again. When no variant has a slot left (every replica gone, or this gateway's lease lapsed)
        the ``no_replica_wait_s`` starts now, not when the next request finds them empty (that request
        would wait the whole of it, after a quiet spell too)."""
        slots = self._slots()
        if not any(slots.values()):  # (one variant without a slot is a lease's normal state: not a loss)
            self._starved(self.clock.now(), slots)
        self._wake.set()

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        if self._batches:
            await asyncio.gather(*self._batches, return_exceptions=True)
        for e in self._entries.values():
            if not e.future.done():
                e.future.set_exception(Unavailable(self._closing_why, retry_after_s=1.0))
        self._entries.clear()
        self._items.clear()

    @property
    def queued_rows(self) -> int:
        return self._rows

    @property
    def queued_requests(self) -> int:
        return len(self._items)

    def in_flight(self) -> Mapping[str, int]:
        return dict(self._busy)

    async def submit(
        self,
        inputs: dict[str, np.ndarray],
        rows: int,
        deadline_s: float,
        variants: tuple[str, ...],
        priority: int = 0,
        arrival_s: float | None = None,
        on_shed: ShedHook | None = None,
        best_effort: bool = False,
        limit: QueueLimit | None = None,
        trace: Any = None,
    ) -> Outcome:
        """Queue one request and wait for its outcome (raises :class:`ServingError`).

        ``best_effort`` (the client named no deadline): never refused at admission; ``deadline_s``
        is only how long it may wait behind deadline traffic.

        ``on_shed``, when given, is called with the error the moment the policy sheds this request,
        so the caller can answer it before the event loop gets back to the waiting coroutine (on a
        saturated loop that wait is milliseconds). The future still gets the error.

        ``limit``: Triton's queue policy for it (``sloserve/batching/queuelimit.py``); ``priority`` is
        then its level, lower served first."""
        if self._closed or self._closing_why != _SHUTTING_DOWN:
            raise Unavailable(self._closing_why, retry_after_s=1.0)
        if self._rows + rows > self.max_queue_rows:
            raise TooManyRequests(
                f"model '{self.model}' queue is full ({self._rows} rows queued, limit "
                f"{self.max_queue_rows}); retry later",
                retry_after_s=1.0,
            )
        if limit is not None and (full := level_full(self._items, priority, limit, self.model)) is not None:
            raise full
        now = self.clock.now()
        allowed = variants or self.variants
        slots = self.runner.slots  # (one call in the common case: the first allowed variant has a slot)
        if slots(self.model, allowed[0]) <= 0 and not any(slots(self.model, v) > 0 for v in allowed[1:]):
            gone = self._starved(now)
            if all(v in gone for v in allowed):
                raise self._no_replica_error(tuple(allowed))
        arrival = now if arrival_s is None else arrival_s
        item = QueuedItem(next(self._ids), arrival, deadline_s, rows, priority, variants, best_effort)
        refused = None if best_effort else self.policy.admit(self._view(), item, now)
        if trace is not None:  # a sampled request: its admission span
            trace.admitted(now, arrival, deadline_s, refused, getattr(self.policy, "predicted_finish_s", None))
        if refused is not None:
            late = refused.late_by_s[0] if refused.late_by_s else 0.0
            self.on_event("shed", (refused, 1))
            raise DeadlineUnreachable(
                f"refused at admission: model '{self.model}' cannot meet this request's "
                f"{_ms(deadline_s - arrival)} ms deadline at the current load (predicted late by "
                f"{_ms(late)} ms); retry later or raise slo_ms / lower min_accuracy",
                retry_after_s=max(0.05, late),
                reason="admission",
            )
        fut = asyncio.get_running_loop().create_future()
        self._entries[item.id] = _Entry(item, inputs, fut, now, on_shed, trace)
        self._items.append(item)
        self._rows += rows
        self._wake.set()
        if limit is None or limit.timeout_s is None:
            return await fut
        expiry = asyncio.get_running_loop().call_later(limit.timeout_s, self._expire, item.id, limit)
        try:
            return await fut
        finally:
            expiry.cancel()

    def _expire(self, item_id: int, limit: QueueLimit) -> None:
        """A request's queue timeout passed: if it is still queued, fail it (Triton's REJECT) or move
        it behind every other request (DELAY); a dispatched one is left to finish."""
        e = self._entries.get(item_id)
        if e is None or e.future.done() or limit.timeout_s is None:
            return
        self._pop((item_id,))
        if limit.delay:
            item = replace(e.item, id=next(self._ids), priority=DELAYED_LEVEL)
            self._entries[item.id] = replace(e, item=item)
            self._items.append(item)
            self._rows += item.size
        else:
            e.future.set_exception(timeout_error(self.model, limit.timeout_s))
        self._wake.set()

    # ---- the loop -------------------------------------------------------------------------
    def _slots(self) -> dict[str, int]:
        """The runner's slots per variant, read once per pass of the loop."""
        return {v: self.runner.slots(self.model, v) for v in self.variants}

    def _idle(self, slots: dict[str, int] | None = None) -> dict[str, int]:
        """Free slots per variant; a shared model's are one set, so a batch of any variant takes one from all."""
        slots = self._slots() if slots is None else slots
        if self._shared:
            busy = sum(self._busy.values())
            return {v: n - busy for v, n in slots.items()}
        return {v: n - self._busy[v] for v, n in slots.items()}

    def _view(self, slots: dict[str, int] | None = None) -> QueueView:
        return QueueView(
            self.model, self._items, self._idle(slots), self.max_batch_size, depth=self._depth, shared=self._shared
        )

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            self._wake.clear()
            slots = self._slots() if self._items else {}
            if self._items and self._fail_starved(loop, slots):
                continue
            if self._items and self._should_plan(slots):
                self._freed = False
                now = self.clock.now()
                try:
                    decision = self.policy.plan(self._view(slots), now)
                except Exception:  # a policy bug must not take the model down silently
                    log.exception("batching policy %s failed; dispatching FIFO", self.policy.name)
                    decision = Dispatch((self._items[0].id,), self._fallback_variant(), "policy_error")
                if type(decision) is Dispatch:
                    if decision.ids and self._busy.get(decision.variant, -1) >= 0:
                        self._dispatch(decision, now)
                        continue
                    log.error("policy %s returned an unusable %r", self.policy.name, decision)
                    decision = Wait(now + 0.001, "bad_decision")
                elif type(decision) is Shed:
                    self._shed(decision, now)
                    continue
                self._arm(loop, decision.until_s, now)
            await self._wake.wait()

    # ---- variants without a replica ------------------------------------------------------------
    def _starved(self, now: float, slots: dict[str, int] | None = None) -> set[str]:
        """Variants that have had no replica (no slot at all) for ``no_replica_wait_s``: Ray lost, or
        every replica of the variant gone and none back yet."""
        slots = self._slots() if slots is None else slots
        gone: set[str] = set()
        for v in self.variants:
            if slots[v] > 0:
                self._no_slots_since.pop(v, None)
            elif now - self._no_slots_since.setdefault(v, now) >= self.no_replica_wait_s:
                gone.add(v)
        return gone

    def _no_replica_error(self, variants: tuple[str, ...]) -> Unavailable:
        return Unavailable(
            f"model '{self.model}' has no running replica for {'/'.join(variants)} (none for "
            f"{self.no_replica_wait_s:g} s: the backend lost them or is replacing them); retry after Retry-After",
            retry_after_s=self.no_replica_wait_s,
        )

    def _fail_starved(self, loop, slots: dict[str, int]) -> bool:
        """Fail the queued requests that no replica can take (every variant they allow starved); arm a
        wake-up for when a variant without replicas now would starve. True when any failed."""
        if self._starve_timer is None and not self._no_slots_since and all(slots.values()):
            return False  # every variant has a slot, and none was without: the common case, at no cost
        now = self.clock.now()
        gone = self._starved(now, slots)
        if self._starve_timer is not None:
            self._starve_timer.cancel()
            self._starve_timer = None
        pending = [t for v, t in self._no_slots_since.items() if v not in gone]
        if pending:
            due = min(pending) + self.no_replica_wait_s
            self._starve_timer = loop.call_later(max(due - now, 1e-3), self._wake.set)
        if not gone:
            return False
        dead = tuple(it.id for it in self._items if all(v in gone for v in (it.variants or self.variants)))
        if not dead:
            return False
        for e in self._pop(dead):
            if not e.future.done():
                e.future.set_exception(self._no_replica_error(e.item.variants or tuple(self.variants)))
        return True

    def _should_plan(self, slots: dict[str, int] | None = None) -> bool:
        """Plan when something can be dispatched or a decision is due: a replica is idle or just
        finished, or the policy's Wait has come. An arrival while every replica is busy only joins
        the queue (admission already judged it), which keeps decision cost off the saturated path.
        (An idle replica of another variant still plans: the policy may shed queued requests then.)"""
        if self._freed:
            return True
        if self._due_s is not None and self.clock.now() >= self._due_s:
            return True
        return any(n > 0 for n in self._idle(slots).values())

    def _arm(self, loop, until_s: float | None, now: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._due_s = until_s
        if until_s is not None:
            self._timer = loop.call_later(max(until_s - now, 20e-6), self._wake.set)

    def _fallback_variant(self) -> str:
        first = self._items[0]
        return first.variants[0] if first.variants else self.variants[0]

    def _pop(self, ids: tuple[int, ...]) -> list[_Entry]:
        n = len(ids)
        items = self._items
        if items[:n] and all(items[i].id == ids[i] for i in range(n)):
            del items[:n]
        else:
            drop = set(ids)
            self._items = [it for it in items if it.id not in drop]
        out = []
        for i in ids:
            e = self._entries.pop(i, None)
            if e is not None:
                self._rows -= e.item.size
                out.append(e)
        return out

    def _shed(self, d: Shed, now: float) -> None:
        entries = self._pop(d.ids)
        lates = d.late_by_s or (0.0,) * len(entries)
        for e, late in zip(entries, lates, strict=False):
            if not e.future.done():
                waited = e.item.deadline_s - e.item.arrival_s
                if e.item.best_effort:
                    err = DeadlineUnreachable(
                        f"model '{self.model}' is busy with deadline traffic: this request names no slo_ms and "
                        f"waited {waited:.3g} s (best_effort_wait_s) without a free replica; retry later, "
                        f"or name an slo_ms to be served by its deadline",
                        retry_after_s=1.0,
                        reason="best_effort",
                    )
                else:
                    err = DeadlineUnreachable(
                        f"shed: model '{self.model}' cannot meet this request's "
                        f"{_ms(waited)} ms deadline (predicted late by {_ms(late)} ms at "
                        f"the current load); retry later or "
                        f"raise slo_ms / lower min_accuracy",
                        retry_after_s=max(0.05, late),
                    )
                if e.on_shed is not None:
                    try:
                        e.on_shed(err)
                    except Exception:  # the transport's bug must not stop the batcher
                        log.exception("answering a shed request at once failed; it is answered normally")
                e.future.set_exception(err)
        self.on_event("shed", (d, len(entries)))

    def _dispatch(self, d: Dispatch, now: float) -> None:
        entries = [e for e in self._pop(d.ids) if not e.future.done()]
        if not entries:
            return
        self._busy[d.variant] += 1
        task = asyncio.get_running_loop().create_task(self._run(entries, d, now))
        self._batches.add(task)
        task.add_done_callback(self._batches.discard)

    async def _run(self, entries: list[_Entry], d: Dispatch, started: float) -> None:
        """Run a dispatched batch on one slot of ``d.variant``. Requests whose tensors cannot share a
        batch (a model with a variable dimension, asked at different sizes) run as consecutive
        batches on the same slot, so one request's shape never fails another's."""
        try:
            for group in [entries] if self.uniform_inputs else _compatible_groups(entries):
                await self._run_group(group, d, started if group is entries else self.clock.now())
        finally:
            self._busy[d.variant] -= 1
            self._freed = True
            self._wake.set()

    async def _run_group(self, entries: list[_Entry], d: Dispatch, started: float) -> None:
        variant = d.variant
        traced: Any = None
        traced_out: tuple = (None, None, None)  # (device type, compute_s, error) for the batch's span
        try:
            if len(entries) == 1:
                inputs = entries[0].inputs
            else:
                names = entries[0].inputs.keys()
                inputs = {n: np.concatenate([e.inputs[n] for e in entries]) for n in names}
            rows = sum(e.item.size for e in entries)
            if self.tracer is not None:  # one span per batch with a sampled member, linked to each
                sampled = [e.trace for e in entries if e.trace is not None]
                if sampled:
                    traced = self.tracer.start(self.model, variant, rows, len(entries), sampled, d.reason)
            attempt = 0
            err: ServingError  # what every request of the batch gets when it failed (ok is False)
            while True:
                try:
                    timeout = None
                    if self.late_grace_s is not None:
                        latest = max(ent.item.deadline_s for ent in entries)
                        timeout = max(latest + self.late_grace_s - self.clock.now(), 1e-3)
                    res = await self.runner.run(self.model, variant, inputs, timeout)
                    ok = True
                except ReplicaFailed as e:
                    earliest = min(ent.item.deadline_s for ent in entries)
                    if attempt == 0 and self.clock.now() < earliest:
                        attempt += 1
                        self.on_event("retry", (variant, rows))
                        continue
                    why = "retried once" if attempt else "its deadline had passed, so it was not retried"
                    err = ReplicaFailed(f"{e.message}; {why}", retry_after_s=1.0)
                    ok = False
                except ServingError as e:
                    err = e
                    ok = False
                except Exception as e:
                    log.warning("batch of %d on %s/%s failed: %r", rows, self.model, variant, e)
                    err = InternalError(f"replica for '{self.model}/{variant}' failed on this batch: {e}")
                    ok = False
                break
            finished = self.clock.now()
            if not ok:
                traced_out = (None, None, err)
                for ent in entries:
                    if not ent.future.done():
                        ent.future.set_exception(err)
                self.policy.observe(BatchResult(self.model, variant, rows, finished - started, finished, ok=False))
                self.on_event("batch_failed", (variant, rows))
                return
            # Calibrate on what a deadline pays for a batch: over Ray, the round trip (the hand-off
            # is real, 2-6 ms); in-process, the replica's compute (a round trip measured on a
            # saturated event loop would also count the loop's own lateness, inflate the estimate,
            # shrink the batches and feed back into more lateness).
            observed = finished - started if self.round_trip_latency else res.compute_s
            late = sum(e.item.size for e in entries if finished > e.item.deadline_s)
            self.policy.observe(
                BatchResult(self.model, variant, rows, observed, finished, device_type=res.device_type, late_rows=late)
            )
            self.on_event("batch", (variant, rows, res.compute_s, d.reason))
            traced_out = (res.device_type, res.compute_s, None)
            off = 0
            for ent in entries:
                n = ent.item.size
                if not ent.future.done():
                    sl = {k: v[off : off + n] for k, v in res.outputs.items()}
                    ent.future.set_result(
                        Outcome(sl, variant, rows, started - ent.item.arrival_s, res.compute_s, res.device_type)
                    )
                off += n
        except Exception as e:  # a bug: every request of the batch gets an explicit error, none hangs
            log.exception("batch on %s/%s failed before reaching a replica", self.model, variant)
            traced_out = (None, None, e)
            for ent in entries:
                if not ent.future.done():
                    ent.future.set_exception(InternalError(f"batch assembly failed: {e}"))
        finally:
            if traced is not None:
                self.tracer.end(traced, *traced_out)


def _shape_key(e: _Entry) -> tuple:
    return tuple((n, a.shape[1:], a.dtype) for n, a in e.inputs.items())


def _compatible_groups(entries: list[_Entry]) -> list[list[_Entry]]:
    """``entries`` itself when every request's tensors share their per-row shapes and dtypes (the
    common case, and the only one for a model without variable dimensions); else one group per
    shape, in order of first appearance."""
    first = _shape_key(entries[0])
    if all(_shape_key(e) == first for e in entries[1:]):
        return [entries]
    groups: dict[tuple, list[_Entry]] = {}
    for e in entries:
        groups.setdefault(_shape_key(e), []).append(e)
    return list(groups.values())
