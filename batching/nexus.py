"""``nexus``: Nexus's batch-size rule: the largest b with 2 * latency(b) <= SLO.

At steady state a batch of b is collected while the previous one runs, so a request may wait one
batch time and then run one: ``2 * l(b) <= SLO`` keeps it in budget. The policy dispatches when
``b`` rows are queued, or earlier when the earliest deadline forces it (its latest start for
the rows queued), and, like Nexus's early drop, sheds a head request that cannot make its
deadline even alone. Uses the same latency sources as ``slo`` (profile, calibrator, function).

>>> from batching.types import QueuedItem, QueueView
>>> p = NexusPolicy(max_batch_size=16, latency_fn=lambda v, n: 0.001 * n, default_variant="v", slo_ms=10)
>>> p.target("v")
5
"""

from __future__ import annotations

from batching.latency import LatencyFn, LatencyModel, LatencySource
from batching.policy import register_policy
from batching.timeout import first_variant, take_rows
from batching.types import BatchResult, Decision, Dispatch, QueueView, Shed, Wait


@register_policy("nexus")
class NexusPolicy:
    name = "nexus"

    def __init__(self, *, max_batch_size: int = 32, default_variant: str = "", slo_ms: float | None = None,
                 profile: LatencySource = None, latency_fn: LatencyFn | None = None, model: str = "",
                 device_type: str = "cpu", calibrate: bool = True, drop: bool = True):
        self.max_batch_size = max_batch_size
        self.default_variant = default_variant
        self.slo_s = None if slo_ms is None else slo_ms / 1000.0
        self.drop = drop
        self.lat = LatencyModel(latency_fn if latency_fn is not None else profile, max_batch_size,
                                model=model, device_type=device_type, calibrate=calibrate)
        self._targets: dict[tuple[str, float], int] = {}

    def target(self, variant: str, slo_s: float | None = None) -> int:
        slo = slo_s if slo_s is not None else self.slo_s
        key = (variant, slo)
        b = self._targets.get(key)
        if b is None or self.lat.calibrator is not None:
            b = max(1, self.lat.max_rows_within(variant, slo / 2.0))
            self._targets[key] = b
        return b

    def plan(self, view: QueueView, now: float) -> Decision:
        items = view.items
        if not items:
            return Wait(None, "empty")
        if not self.lat.model:
            self.lat.model = view.model
        head = items[0]
        variant = first_variant(head, self.default_variant)
        if self.drop and now + self.lat.latency_s(variant, head.size) > head.deadline_s:
            return Shed((head.id,), "deadline", (now + self.lat.latency_s(variant, head.size) - head.deadline_s,))
        if view.idle.get(variant, 0) <= 0:
            return Wait(None, "no_replica")
        slo = self.slo_s if self.slo_s is not None else head.deadline_s - head.arrival_s
        b = min(max(self.target(variant, slo), head.size), view.max_batch_size)
        ids, rows = take_rows(items, variant, b)
        if rows >= b:
            return Dispatch(ids, variant, "full")
        chosen = set(ids)
        earliest = min(it.deadline_s for it in items if it.id in chosen)
        latest = earliest - self.lat.latency_s(variant, rows)
        if now >= latest:
            return Dispatch(ids, variant, "deadline")
        return Wait(latest, "filling")

    def observe(self, result: BatchResult) -> None:
        self.lat.observe(result)
