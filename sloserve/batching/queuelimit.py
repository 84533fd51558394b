"""Triton's queue policy for one request, as the batcher applies it: how long it may stay queued, what
happens then, and how many requests of its priority level may be queued at once.

The gateway resolves a model's ``dynamic_batching`` settings and a request's ``timeout`` and
``priority`` parameters into a :class:`QueueLimit` (``sloserve/gateway/queuepolicy.py``); the batcher
enforces it (``Batcher.submit``). ``QueuedItem.priority`` carries the request's level: lower levels are
served first (Triton's 1 is the highest), and :data:`DELAYED_LEVEL` is where a request whose timeout
passed under ``timeout_action: DELAY`` waits, behind every other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sloserve.batching.errors import Unavailable
from sloserve.batching.types import QueuedItem

# past every level a model can configure: a delayed request is served after all the others
DELAYED_LEVEL = 1 << 62


@dataclass(frozen=True, slots=True)
class QueueLimit:
    """``timeout_s``: time the request may wait in the queue (None: no bound); ``delay``: past it,
    move the request behind every other instead of failing it; ``max_queued``: requests of its level
    queued at most, itself included (0: unbounded)."""

    timeout_s: float | None = None
    delay: bool = False
    max_queued: int = 0

    @property
    def active(self) -> bool:
        return self.timeout_s is not None or self.max_queued > 0


class QueueTimeout(Unavailable):
    """Still queued when its timeout passed (Triton's ``timeout_action: REJECT``): 503 / UNAVAILABLE."""

    kind = "queue_timeout"


class QueueFull(Unavailable):
    """Its priority level's queue holds ``max_queue_size`` requests already: 503 / UNAVAILABLE."""

    kind = "queue_full"


def timeout_error(model: str, timeout_s: float) -> QueueTimeout:
    # Triton's own words first: clients match them
    return QueueTimeout(
        f"Request timeout expired: model '{model}' did not dispatch this request within its "
        f"{timeout_s * 1e6:.0f} us queue timeout"
    )


def level_full(items: Sequence[QueuedItem], level: int, limit: QueueLimit, model: str) -> QueueFull | None:
    """The error for a request of ``level`` arriving at a queue holding ``items``, or None if it fits."""
    if limit.max_queued <= 0:
        return None
    n = sum(1 for it in items if it.priority == level)
    if n < limit.max_queued:
        return None
    return QueueFull(
        f"Exceeds maximum queue size: model '{model}' has {n} requests queued at priority level {level} "
        f"(max_queue_size {limit.max_queued}); retry later",
        retry_after_s=1.0,
    )
