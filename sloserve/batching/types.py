"""Snapshots in, decisions out: the data a batching policy sees and returns.

A policy is called with a :class:`QueueView` of one model's queue and an explicit ``now``
(seconds on the driver's clock) and answers with one :class:`Decision`:

* :class:`Dispatch` -- run these queued requests now, as one batch, on ``variant``;
* :class:`Wait` -- nothing to do until ``until`` (or until the queue or a replica changes);
* :class:`Shed` -- fail these requests at once; they cannot make their deadlines.

Every decision carries a ``reason`` (a short constant string) that metrics and logs read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import final


@dataclass(frozen=True, slots=True)
class QueuedItem:
    """One queued request, as a policy sees it.

    ``size`` is the number of batch rows the request carries (its leading dimension).
    ``variants`` lists the variants allowed to serve it, most accurate first: the variant the
    client pinned, or every variant with accuracy >= its ``min_accuracy``.
    ``best_effort``: the client named no deadline. Its ``deadline_s`` is then only how long it may
    wait (``best_effort_wait_s``), far behind every deadline: it is never refused at admission and
    sorts behind deadline traffic, which it must not hold up.
    ``priority``: its priority level, the lower served first (Triton's level, 1 the highest; 0 for a
    model without levels, so one level for all).
    """

    id: int
    arrival_s: float
    deadline_s: float
    size: int = 1
    priority: int = 0
    variants: tuple[str, ...] = ()
    best_effort: bool = False


@dataclass(frozen=True, slots=True)
class QueueView:
    """One model's queue at one instant.

    ``items`` are in arrival order and must not be mutated by a policy.
    ``idle`` maps each variant to the number of its replicas free to take a batch now;
    ``busy_until_s`` maps each variant to the predicted finish times of its busy replicas.
    ``depth`` is how many batches the backend queues per replica (its pipelining): with depth 2,
    ``idle`` counts two slots per replica, and a batch in the second starts only when the
    replica's running batch ends. Backends that calibrate on round trips fold their pipelining
    into the latency they measure and report depth 1.
    ``shared``: every replica holds every variant (a smaller variant loaded beside the larger one)
    and runs whichever a batch asks for, so ``idle`` and ``busy_until_s`` list the same replicas
    under each variant; when false (the gateway's deployments), each variant has its own replicas.
    """

    model: str
    items: Sequence[QueuedItem]
    idle: Mapping[str, int]
    max_batch_size: int
    busy_until_s: Mapping[str, Sequence[float]] | None = None
    depth: int = 1
    shared: bool = False

    @property
    def queued_rows(self) -> int:
        return sum(item.size for item in self.items)


@final  # drivers match decisions by exact type (`type(d) is Wait`)
@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run the requests ``ids`` (queue ids) as one batch on a replica of ``variant``."""

    ids: tuple[int, ...]
    variant: str
    reason: str = "full"


@final
@dataclass(frozen=True, slots=True)
class Wait:
    """Do nothing until ``until_s`` (None: until the queue or a replica changes)."""

    until_s: float | None
    reason: str = "idle"


@final
@dataclass(frozen=True, slots=True)
class Shed:
    """Fail ``ids`` now; ``late_by_s`` says by how much each would have missed its deadline."""

    ids: tuple[int, ...]
    reason: str = "deadline"
    late_by_s: tuple[float, ...] = ()


Decision = Dispatch | Wait | Shed


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What a replica reported for one batch: fed back to ``policy.observe``."""

    model: str
    variant: str
    rows: int
    latency_s: float
    finished_s: float
    ok: bool = True
    device_type: str = "cpu"
    late_rows: int = 0  # rows of the batch answered after their deadline (the driver's clock)
