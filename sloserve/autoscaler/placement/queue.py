"""The training queue on harvested GPUs: which jobs run, which start, which are preempted, which wait.

A pure policy with an explicit ``now``: :func:`plan` orders the waiting and running training jobs of a
snapshot and walks them head first over the GPUs training may use (``capacity``, per type). A running
job keeps its GPUs while they are not needed by a job ahead of it; a waiting job starts when enough
GPUs of one type are left (idle ones first, else those of running jobs behind it, which are then
preempted); a job whose tenant holds its share of the harvested GPUs waits, with the reason.

Orders (``PlacementConfig.training_queue``):

* ``las`` (default): Tiresias' discretized two-dimensional least attained service (Gu et al.,
  NSDI'19). Attained service is GPUs x seconds run; thresholds (``las_thresholds_gpu_s``) cut it into
  queues, the top queue first; inside a queue running jobs first (no preemption inside a queue), then
  submit order. A job that has waited longer than ``las_starvation_multiple`` times its run time since
  its last promotion goes back to the top queue, its attained service counted from there.
* ``fifo``: submit order.
* ``srtf``: least remaining GPU-seconds first, for jobs that declare their length; the others after
  them, in submit order.

>>> from sloserve.autoscaler.placement.types import PlacementConfig, QueueState, TrainingJob
>>> old = TrainingJob("old", 1, 1, 1.0, attained_gpu_s=5000.0, gpu_ids=("g0",), submit_time_s=0.0)
>>> new = TrainingJob("new", 1, 1, 1.0, submit_time_s=60.0)
>>> p = plan([old, new], {"T4": 1}, {"g0": "T4"}, PlacementConfig(), QueueState(), now_s=60.0)
>>> [(e.job_id, e.action, e.reason) for e in p.entries]
[('new', 'start', 'start'), ('old', 'preempt', 'priority')]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sloserve.autoscaler.placement.las import QUEUES, QueuePlan, Rate, _las, las_level, order, remaining_gpu_s, walk
from sloserve.autoscaler.placement.predictive import plan as predictive_plan
from sloserve.autoscaler.placement.types import PlacementConfig, QueueState, TrainingJob

__all__ = ["QUEUES", "QueuePlan", "Rate", "_las", "las_level", "order", "remaining_gpu_s", "walk", "plan"]


def plan(
    jobs: Iterable[TrainingJob],
    capacity: Mapping[str, int],
    gpu_types: Mapping[str, str],
    cfg: PlacementConfig,
    state: QueueState,
    now_s: float,
    preempt: bool = True,
) -> QueuePlan:
    """Walk the queue head first over ``capacity`` (GPUs training may use, per type, counting those
    its running jobs hold); ``gpu_types`` maps a GPU id to its type (where running jobs run).
    ``preempt=False`` keeps every running job where it is, on its gang (the queue only orders the
    waiting ones).

    An elastic job (``min_gpus``) starts on as many GPUs as are left, from ``min_gpus`` up to its
    gang; running, it is resized (``resize``: checkpoint, restart on the new gang) down to what is
    left when a job ahead needs the rest, and up into GPUs nobody else takes.

    ``predictive`` (sloserve/autoscaler/placement/predictive.py) orders, sizes and types the jobs
    with their performance models, then walks the same way."""
    if cfg.training_queue == "predictive":
        return predictive_plan(list(jobs), capacity, gpu_types, cfg, state, now_s, preempt)
    ranked, state, nxt = order(jobs, cfg, state, now_s)
    return walk(ranked, state, nxt, capacity, gpu_types, cfg, preempt)
