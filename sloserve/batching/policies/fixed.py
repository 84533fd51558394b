"""``fixed``: Triton-style dynamic batching (preferred batch sizes + max queue delay).

Like Triton's dynamic batcher: when a replica is idle, a batch of ``max_batch_size`` rows goes at
once; else the largest *preferred* size that the queue can fill goes at once; else the policy
waits until the oldest request has waited ``max_queue_delay_ms`` and then sends what is queued.
Deadlines are ignored (Triton's queue policy can time requests out, but only after the fact).

>>> from sloserve.batching.types import QueuedItem, QueueView
>>> p = FixedPolicy(max_batch_size=8, preferred_batch_sizes=(2, 4), default_variant="v")
>>> items = [QueuedItem(i, 0.0, 1.0) for i in range(3)]
>>> p.plan(QueueView("m", items, {"v": 1}, 8), now=0.0)
Dispatch(ids=(0, 1), variant='v', reason='preferred')
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sloserve.batching.policies.timeout import first_variant, take_rows
from sloserve.batching.policy import PolicyBase, register_policy
from sloserve.batching.types import Decision, Dispatch, QueueView, Wait


class FixedSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    preferred_batch_sizes: tuple[int, ...] = Field(
        default=(), description="Sizes sent at once when the queue fills them."
    )
    max_queue_delay_ms: float = Field(default=1.0, ge=0, description="Longest the oldest request waits.")


@register_policy("fixed")
class FixedPolicy(PolicyBase):
    name = "fixed"
    Settings = FixedSettings
    settings: FixedSettings  # what PolicyBase.__init__ validated with Settings

    def plan(self, view: QueueView, now: float) -> Decision:
        items = view.items
        if not items:
            return Wait(None, "empty")
        variant = first_variant(items[0], self.context.default_variant)
        if view.idle.get(variant, 0) <= 0:
            return Wait(None, "no_replica")
        limit = min(self.context.max_batch_size, view.max_batch_size)
        ids, rows = take_rows(items, variant, limit)
        if rows >= limit:
            return Dispatch(ids, variant, "full")
        fits = [b for b in self.settings.preferred_batch_sizes if b <= rows]
        if fits:
            want = max(fits)
            pref, _ = take_rows(items, variant, want)
            if pref:
                return Dispatch(pref, variant, "preferred")
        due = items[0].arrival_s + self.settings.max_queue_delay_ms / 1000.0
        if now >= due:
            return Dispatch(ids, variant, "timeout")
        return Wait(due, "filling")
