"""``nexus``: Nexus's batch-size rule: the largest b with 2 * latency(b) <= SLO.

At steady state a batch of b is collected while the previous one runs, so a request may wait one
batch time and then run one: ``2 * l(b) <= SLO`` keeps it in budget. The policy dispatches when
``b`` rows are queued, or earlier when the earliest deadline forces it (its latest start for
the rows queued), and, like Nexus's early drop, sheds a head request that cannot make its
deadline even alone. Uses the same latency sources as ``slo`` (profile, calibrator, function).

>>> from sloserve.batching.types import QueuedItem, QueueView
>>> p = NexusPolicy(max_batch_size=16, latency_fn=lambda v, n: 0.001 * n, default_variant="v", slo_ms=10)
>>> p.target("v")
5
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sloserve.batching.latency import LatencyModel
from sloserve.batching.policies.timeout import first_variant, take_rows
from sloserve.batching.policy import PolicyBase, register_policy
from sloserve.batching.types import BatchResult, Decision, Dispatch, QueueView, Shed, Wait


class NexusSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slo_ms: float | None = Field(
        default=None, gt=0, description="The SLO batches are sized for (default: each head request's own budget)."
    )
    calibrate: bool = Field(default=True, description="Correct the profile online from observed batches.")
    drop: bool = Field(default=True, description="Shed a head request that cannot make its deadline even alone.")


@register_policy("nexus")
class NexusPolicy(PolicyBase):
    name = "nexus"
    Settings = NexusSettings
    settings: NexusSettings  # what PolicyBase.__init__ validated with Settings

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        c, s = self.context, self.settings
        self.max_batch_size = c.max_batch_size
        self.default_variant = c.default_variant
        self.slo_s = None if s.slo_ms is None else s.slo_ms / 1000.0
        self.drop = s.drop
        self.lat = LatencyModel(
            c.latency_fn if c.latency_fn is not None else c.profile,
            c.max_batch_size,
            model=c.model,
            device_type=c.device_type,
            calibrate=s.calibrate,
        )
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
