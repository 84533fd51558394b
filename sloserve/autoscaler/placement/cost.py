"""The cost model of placement: what a preemption costs, and which GPU type suits a replica.

Preemption cost (GPU-seconds, lower is cheaper to preempt):

* **lost work**: a job whose next iteration boundary plus a checkpoint write fits in the grace
  period checkpoints and loses nothing it finished; otherwise it is killed at the end of the grace
  period and loses all work since its last checkpoint, plus the grace period it ran in vain.
* **restart overhead**: the checkpoint write (if it gets to write one) and reloading on restart.
* **ties** (costs within ``cost_tie_gpu_s``) are broken by expected remaining service, largest
  first: the remaining work of a predictable job (SRPT keeps short jobs running), or, for a job of
  unknown duration, its attained service, as Tiresias' least-attained-service does (with heavy-tailed
  durations such as Philly's, a job that has run long is expected to run long still).

Type choice is Gavel's throughput matrix normalised by price: one replica of (model, variant) on type
``t`` sustains ``throughput[t]`` requests/s; placement prefers the type with the most requests/s per
unit of cost.

>>> from sloserve.autoscaler.placement.types import PlacementConfig, TrainingJob
>>> j = TrainingJob("j", num_gpus=2, memory_mib=1, iteration_time_s=0.1, iterations_done=50,
...                 checkpoint_iteration=40, checkpoint_write_s=0.2)
>>> preemption_cost(j, PlacementConfig(restart_overhead_s=5)).total_gpu_s
10.4
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from sloserve.autoscaler.placement.types import (
    PlacementConfig,
    PlacementSnapshot,
    PreemptionCost,
    TrainingJob,
)
from sloserve.batching.options import variant_of


def checkpoints_in_grace(job: TrainingJob, config: PlacementConfig) -> bool:
    """True when the job reaches an iteration boundary and writes a checkpoint within the grace period."""
    return job.iteration_time_s + job.checkpoint_write_s <= config.preempt_grace_s


def lost_work_gpu_s(job: TrainingJob, config: PlacementConfig) -> float:
    """Work that must be redone after preempting ``job`` now."""
    if checkpoints_in_grace(job, config):
        return 0.0
    since = max(job.iterations_done - job.checkpoint_iteration, 0) * job.iteration_time_s
    return job.num_gpus * (since + config.preempt_grace_s)


def preemption_cost(job: TrainingJob, config: PlacementConfig) -> PreemptionCost:
    lost = lost_work_gpu_s(job, config)
    write = job.checkpoint_write_s if checkpoints_in_grace(job, config) else 0.0
    restart = job.num_gpus * (config.restart_overhead_s + write)
    rem = job.remaining_iterations
    remaining = None if rem is None else job.num_gpus * rem * job.iteration_time_s
    expected_remaining = remaining if remaining is not None else job.attained_gpu_s
    bucket = math.floor((lost + restart) / config.cost_tie_gpu_s)
    return PreemptionCost(
        lost_gpu_s=lost,
        restart_gpu_s=restart,
        remaining_gpu_s=remaining,
        attained_gpu_s=job.attained_gpu_s,
        key=(float(bucket), -float(expected_remaining), float(lost + restart)),
    )


def type_score(snapshot: PlacementSnapshot, config: PlacementConfig, model: str, variant: str, gpu_type: str) -> float:
    """Requests/s per unit of price of one replica of (model, variant) on ``gpu_type``."""
    return snapshot.throughput(model, variant, gpu_type) / config.cost_per_hour(gpu_type)


def rank_types(
    snapshot: PlacementSnapshot, config: PlacementConfig, model: str, variant: str, types: Iterable[str]
) -> list[str]:
    """GPU types best first (highest throughput per cost; name breaks ties)."""
    return sorted(set(types), key=lambda t: (-type_score(snapshot, config, model, variant, t), t))


def throughputs_from_profile(
    table,
    keys: Iterable[tuple[str, str]],
    gpu_types: Iterable[str],
    slo_s: Mapping[str, float],
    max_batch: int = 64,
    device_type_of: Mapping[str, str] | None = None,
) -> dict[tuple[str, str, str], float]:
    """Gavel's throughput matrix from a ``sloserve.batching.profile.ProfileTable``.

    One replica's throughput is ``b / latency(b)`` at the largest batch ``b`` whose p99 latency fits
    half the model's SLO (a request may wait one batch and then run in the next, as Nexus assumes).
    ``device_type_of`` maps a GPU type to the profile's device-type name (identity by default). A
    variant may be a serving option key (``sloserve.batching.options``, ``"large@t4"``): its variant's profile is
    read for each type, and the entry stays keyed as given.
    """
    out: dict[tuple[str, str, str], float] = {}
    types = list(gpu_types)
    for model, key in keys:
        variant = variant_of(key)
        for t in types:
            dev = (device_type_of or {}).get(t, t)
            if table.curve(model, variant, dev) is None:
                continue
            budget = slo_s[model] / 2
            best = 0.0
            b = 1
            while b <= max_batch:
                lat = table.latency_s(model, variant, dev, b)
                if lat > budget and b > 1:
                    break
                best = max(best, b / lat)
                b *= 2
            out[(model, key, t)] = best
    return out
