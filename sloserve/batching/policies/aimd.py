"""``aimd``: Clipper's adaptive batching (additive increase, multiplicative decrease).

Per variant, a batch-size cap starts at ``initial_batch_size``; each observed batch whose latency
stays under the SLO (``slo_ms``; else the tightest budget seen in the queue) raises it by
``increase``, a batch over the SLO multiplies it by ``backoff`` (Clipper: 10% decrease). An idle
replica takes the oldest requests up to the cap at once, or after ``max_wait_ms`` if set
(Clipper's optional delayed batching). No request is shed.

>>> from sloserve.batching.types import BatchResult
>>> p = AIMDPolicy(max_batch_size=16, slo_ms=10.0, default_variant="v")
>>> p.observe(BatchResult("m", "v", 1, 0.002, 0.0)); p.cap("v")
2
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sloserve.batching.policies.timeout import fill_or_wait, first_variant
from sloserve.batching.policy import PolicyBase, register_policy
from sloserve.batching.types import BatchResult, Decision, QueueView, Wait


class AIMDSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slo_ms: float | None = Field(
        default=None,
        gt=0,
        description="Latency a batch must stay under (default: the tightest budget seen in the queue).",
    )
    initial_batch_size: int = Field(default=1, ge=1)
    increase: int = Field(default=1, ge=1, description="Cap increase after a full batch within the SLO.")
    backoff: float = Field(default=0.9, gt=0, lt=1, description="Cap factor after a batch over the SLO.")
    max_wait_ms: float = Field(default=0.0, ge=0, description="Clipper's optional delayed batching.")


@register_policy("aimd")
class AIMDPolicy(PolicyBase):
    name = "aimd"
    Settings = AIMDSettings
    settings: AIMDSettings  # what PolicyBase.__init__ validated with Settings

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        s = self.settings
        self.max_batch_size = self.context.max_batch_size
        self.default_variant = self.context.default_variant
        self.slo_ms, self.initial_batch_size, self.increase = s.slo_ms, s.initial_batch_size, s.increase
        self.backoff, self.max_wait_ms = s.backoff, s.max_wait_ms
        self._caps: dict[str, float] = {}
        self._slo_s = 0.0

    def cap(self, variant: str) -> int:
        c = self._caps.get(variant, float(self.initial_batch_size))
        return max(1, min(self.max_batch_size, int(c)))

    def plan(self, view: QueueView, now: float) -> Decision:
        items = view.items
        if not items:
            return Wait(None, "empty")
        oldest = items[0]
        if self.slo_ms is None:
            budget = oldest.deadline_s - oldest.arrival_s
            self._slo_s = budget if self._slo_s == 0.0 else min(self._slo_s, budget)
        cap = self.cap(first_variant(oldest, self.default_variant))
        return fill_or_wait(view, now, self.default_variant, cap, self.max_wait_ms / 1000.0)

    def observe(self, result: BatchResult) -> None:
        slo_s = self.slo_ms / 1000.0 if self.slo_ms is not None else self._slo_s
        if slo_s <= 0.0 or not result.ok:
            return
        c = self._caps.get(result.variant, float(self.initial_batch_size))
        if result.latency_s <= slo_s:
            if result.rows >= int(c):  # only a full batch says the cap can grow
                c = min(float(self.max_batch_size), c + self.increase)
        else:
            c = max(1.0, c * self.backoff)
        self._caps[result.variant] = c
