"""``timeout``: Ray Serve ``@serve.batch``-style batching (max batch size + max wait).

Dispatch as soon as ``max_batch_size`` rows are queued for an idle variant, or when the oldest
request has waited ``max_wait_ms``. Deadlines are ignored: this is the baseline the SLO policy
is compared with.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sloserve.batching.policy import PolicyBase, register_policy
from sloserve.batching.types import Decision, Dispatch, QueuedItem, QueueView, Wait


def take_rows(items, variant: str, max_rows: int) -> tuple[tuple[int, ...], int]:
    """Ids of the oldest items that allow ``variant``, up to ``max_rows`` rows in all."""
    ids: list[int] = []
    rows = 0
    for item in items:
        if item.variants and variant not in item.variants:
            continue
        if rows + item.size > max_rows:
            break
        ids.append(item.id)
        rows += item.size
    return tuple(ids), rows


def first_variant(item: QueuedItem, default: str) -> str:
    return item.variants[0] if item.variants else default


def fill_or_wait(view: QueueView, now: float, default_variant: str, cap: int, max_wait_s: float) -> Decision:
    """The head-of-line batch shared by the size + wait baselines (timeout, aimd): the oldest
    request's variant, the oldest rows that fit ``cap``; dispatch when full or when the oldest has
    waited ``max_wait_s``, else wait for that moment."""
    items = view.items
    if not items:
        return Wait(None, "empty")
    oldest = items[0]
    variant = first_variant(oldest, default_variant)
    if view.idle.get(variant, 0) <= 0:
        return Wait(None, "no_replica")
    limit = min(max(cap, oldest.size), view.max_batch_size)
    ids, rows = take_rows(items, variant, limit)
    if rows >= limit:
        return Dispatch(ids, variant, "full")
    due = oldest.arrival_s + max_wait_s
    if now >= due:
        return Dispatch(ids, variant, "timeout")
    return Wait(due, "filling")


class TimeoutSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_wait_ms: float = Field(default=2.0, ge=0, description="Longest the oldest request waits for a fuller batch.")


@register_policy("timeout")
class TimeoutPolicy(PolicyBase):
    name = "timeout"
    Settings = TimeoutSettings
    settings: TimeoutSettings  # what PolicyBase.__init__ validated with Settings

    def plan(self, view: QueueView, now: float) -> Decision:
        return fill_or_wait(
            view, now, self.context.default_variant, self.context.max_batch_size, self.settings.max_wait_ms / 1000.0
        )
