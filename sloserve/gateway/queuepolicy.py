"""A model's queue policy, Triton's way: priority levels and, per level, a request's queue timeout, what
happens when it passes, and the level's queue size (``dynamic_batching`` of a config.pbtxt, or the same
key in a config.json).

A model with a ``dynamic_batching`` block follows it as written: its ``default_queue_policy`` (and
``priority_queue_policy`` per level), ``priority_levels`` and ``default_priority_level``. A model without
one gets :data:`SLOSERVE_QUEUE`: no default timeout, a request's own ``timeout`` honoured, no queue size
per level (``max_queue_rows`` still bounds the queue), no priority levels.

A request's ``priority`` takes Triton's numbering: 1 is the highest level, ``priority_levels`` the lowest;
0, or anything outside 1..priority_levels, takes ``default_priority_level``. Its ``timeout``
(microseconds) applies when the level's policy allows overrides and it is shorter than the default (any
is shorter than no default).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sloserve.batching.queuelimit import QueueLimit
from sloserve.models.schema import DynamicBatching, QueuePolicy

SLOSERVE_QUEUE = QueuePolicy(allow_timeout_override=True)


@dataclass(frozen=True)
class QueueRules:
    levels: int = 0
    default_level: int = 0
    default: QueuePolicy = SLOSERVE_QUEUE
    per_level: dict[int, QueuePolicy] = field(default_factory=dict)

    @classmethod
    def of(cls, db: DynamicBatching | None) -> QueueRules:
        if db is None:
            return cls()
        levels = db.priority_levels
        default_level = min(max(db.default_priority_level, 1), levels) if levels else 0
        return cls(levels, default_level, db.default_queue_policy, dict(db.priority_queue_policy))

    def level(self, priority: int) -> int:
        """The request's level (1 first); 0 when the model has no levels."""
        if not self.levels:
            return 0
        return priority if 1 <= priority <= self.levels else self.default_level

    def limit(self, level: int, timeout_us: int | None) -> QueueLimit | None:
        """What the batcher enforces for a request of ``level`` asking ``timeout_us`` (None: nothing)."""
        pol = self.per_level.get(level, self.default) if level else self.default
        t = pol.default_timeout_us
        if pol.allow_timeout_override and timeout_us and (t == 0 or timeout_us < t):
            t = timeout_us
        if t == 0 and pol.max_queue_size == 0:
            return None
        return QueueLimit(t / 1e6 if t else None, pol.timeout_action == "DELAY", pol.max_queue_size)
