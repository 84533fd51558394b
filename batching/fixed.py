"""``fixed``: Triton-style dynamic batching (preferred batch sizes + max queue delay).

Like Triton's dynamic batcher: when a replica is idle, a batch of ``max_batch_size`` rows goes at
once; else the largest *preferred* size that the queue can fill goes at once; else the policy
waits until the oldest request has waited ``max_queue_delay_ms`` and then sends what is queued.
Deadlines are ignored (Triton's queue policy can time requests out, but only after the fact).

>>> from batching.types import QueuedItem, QueueView
>>> p = FixedPolicy(max_batch_size=8, preferred_batch_sizes=(2, 4), default_variant="v")
>>> items = [QueuedItem(i, 0.0, 1.0) for i in range(3)]
>>> p.plan(QueueView("m", items, {"v": 1}, 8), now=0.0)
Dispatch(ids=(0, 1), variant='v', reason='preferred')
"""

from __future__ import annotations

from dataclasses import dataclass

from batching.policy import register_policy
from batching.timeout import first_variant, take_rows
from batching.types import BatchResult, Decision, Dispatch, QueueView, Wait


@register_policy("fixed")
@dataclass(slots=True)
class FixedPolicy:
    max_batch_size: int = 32
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ms: float = 1.0
    default_variant: str = ""
    name: str = "fixed"

    def plan(self, view: QueueView, now: float) -> Decision:
        items = view.items
        if not items:
            return Wait(None, "empty")
        variant = first_variant(items[0], self.default_variant)
        if view.idle.get(variant, 0) <= 0:
            return Wait(None, "no_replica")
        limit = min(self.max_batch_size, view.max_batch_size)
        ids, rows = take_rows(items, variant, limit)
        if rows >= limit:
            return Dispatch(ids, variant, "full")
        fits = [b for b in self.preferred_batch_sizes if b <= rows]
        if fits:
            want = max(fits)
            pref, _ = take_rows(items, variant, want)
            if pref:
                return Dispatch(pref, variant, "preferred")
        due = items[0].arrival_s + self.max_queue_delay_ms / 1000.0
        if now >= due:
            return Dispatch(ids, variant, "timeout")
        return Wait(due, "filling")

    def observe(self, result: BatchResult) -> None:
        return None
