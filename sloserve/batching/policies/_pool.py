"""The replicas of one variant as the ``slo`` policy sees them when it plans: slots free now, when
each replica frees, and when a batch dispatched now would start (later than now only in a
pipelined slot, behind the replica's running batch)."""

from __future__ import annotations


class Pool:
    __slots__ = ("begin_s", "free_s", "idle", "replicas", "start_s")

    def __init__(self, idle: int, replicas: int, start_s: float, free_s: list[float], begin_s: float | None = None):
        self.idle = idle  # slots free now (replicas, times the backend's pipeline depth)
        self.replicas = replicas
        self.start_s = start_s  # earliest a new batch could start (for shedding: never speculative)
        self.free_s = free_s  # when each replica frees (for capacity estimates)
        # when a batch dispatched now would start computing: later than now only in a pipelined
        # slot, behind the replica's running batch (QueueView.depth > 1)
        self.begin_s = start_s if begin_s is None else begin_s


def pipelined_pool(idle: int, busy: list[float], depth: int, now: float, known: bool = False) -> Pool:
    """Replicas that each queue up to ``depth`` batches; ``busy``: this policy's predicted
    finishes of the batches in flight (chained: a queued batch ends its latency after the one
    before it). The backend spreads batches evenly, so a replica with nothing in flight is free
    now and the others free at their last batch's finish: the latest ``replicas`` finishes."""
    replicas = max(1, -(-(idle + len(busy)) // depth))
    empty = max(0, replicas - len(busy))
    if replicas > empty:
        free = [now] * empty + sorted(busy)[len(busy) - (replicas - empty) :]
    else:
        free = [now] * replicas
    # shedding: as if the slot computed at once unless the busy times are known, as at depth 1
    start = now if idle > 0 or not busy or not known else min(busy)
    return Pool(idle, replicas, start, free, begin_s=min(free) if idle > 0 else start)
