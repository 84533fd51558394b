"""The walk every training queue shares, and the orders that need no performance model: Tiresias'
discretized two-dimensional least attained service (``las``), ``fifo`` and ``srtf``
(sloserve/autoscaler/placement/queue.py says what each does; :func:`walk` places a ranked queue on the
GPUs)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from sloserve.autoscaler.placement.types import PlacementConfig, QueueEntry, QueueState, TrainingJob

QUEUES = ("las", "fifo", "srtf", "predictive")


@dataclass(frozen=True, slots=True)
class QueuePlan:
    """The queue's answer: an entry per job (head first), its next state, and when a job changes
    LAS queue next without any other event (a driver should decide again by then)."""

    entries: tuple[QueueEntry, ...]
    state: QueueState
    next_change_s: float = math.inf


def las_level(attained_gpu_s: float, thresholds: tuple[float, ...]) -> int:
    """The LAS queue of a job with this much attained service (0 = top).

    >>> las_level(0.0, (3250.0,)), las_level(3250.0, (3250.0,)), las_level(4e4, (3250.0, 36000.0))
    (0, 1, 2)
    """
    return bisect.bisect_right(thresholds, attained_gpu_s)


def remaining_gpu_s(job: TrainingJob) -> float:
    """GPU-seconds a job that declares its length still needs (``inf`` when it does not)."""
    rem = job.remaining_iterations
    return math.inf if rem is None else rem * job.iteration_time_s * job.num_gpus


def _las(
    jobs: Iterable[TrainingJob], cfg: PlacementConfig, state: QueueState, now_s: float
) -> tuple[dict[str, int], QueueState, float]:
    """Each job's LAS queue after promotions, the queue's next state, and the next time a level changes."""
    th, k = cfg.las_thresholds_gpu_s, cfg.las_starvation_multiple
    promoted, last_run = {}, {}
    levels: dict[str, int] = {}
    nxt = math.inf
    for j in jobs:
        base = min(state.promoted_gpu_s.get(j.job_id, 0.0), j.attained_gpu_s)
        seen = now_s if j.running else state.last_run_s.get(j.job_id, now_s)
        since = j.attained_gpu_s - base  # service counted for its queue
        level = las_level(since, th)
        if not j.running and level > 0 and k > 0:
            ran_s = since / max(j.num_gpus, 1)
            starve_at = seen + k * ran_s
            if now_s >= starve_at:  # starvation guard: back to the top queue
                base, since, level = j.attained_gpu_s, 0.0, 0
            else:
                nxt = min(nxt, starve_at)
        if j.running and level < len(th):  # demoted when it reaches the next threshold
            nxt = min(nxt, now_s + (th[level] - since) / max(j.num_gpus, 1))
        promoted[j.job_id], last_run[j.job_id], levels[j.job_id] = base, seen, level
    return levels, QueueState(promoted, last_run), nxt


def order(
    jobs: Iterable[TrainingJob], cfg: PlacementConfig, state: QueueState, now_s: float
) -> tuple[list[tuple[TrainingJob, int]], QueueState, float]:
    """(job, level) head first, the queue's next state and when a level changes next."""
    jobs = list(jobs)
    if cfg.training_queue == "las":
        levels, state, nxt = _las(jobs, cfg, state, now_s)
        key = {j.job_id: (levels[j.job_id], not j.running, j.submit_time_s, j.job_id) for j in jobs}
        ranked = sorted(jobs, key=lambda j: key[j.job_id])
        return [(j, levels[j.job_id]) for j in ranked], state, nxt
    if cfg.training_queue == "srtf":
        ranked = sorted(jobs, key=lambda j: (remaining_gpu_s(j), j.submit_time_s, j.job_id))
    else:
        ranked = sorted(jobs, key=lambda j: (j.submit_time_s, j.job_id))
    return [(j, 0) for j in ranked], QueueState(), math.inf


Rate = Callable[[TrainingJob, str, int], float]


def walk(
    ranked: list[tuple[TrainingJob, int]],
    state: QueueState,
    nxt: float,
    capacity: Mapping[str, int],
    gpu_types: Mapping[str, str],
    cfg: PlacementConfig,
    preempt: bool = True,
    rate: Rate | None = None,
) -> QueuePlan:
    """Walk ``ranked`` head first over ``capacity`` (see :func:`plan`). ``rate(job, type, gpus)``
    scores a start on ``gpus`` GPUs of a type (default: the GPUs; the predictive queue gives the
    job's predicted throughput there, relative to the queue's, Gavel's comparative advantage)."""
    left = dict(capacity)  # GPUs not yet given to a job ahead
    held: dict[str, int] = {}
    used: dict[str, int] = {}  # tenant -> GPUs its running and started jobs hold
    for j, _ in ranked:
        if j.running:
            t = gpu_types[j.gpu_ids[0]]
            held[t] = held.get(t, 0) + j.gang
            used[j.tenant] = used.get(j.tenant, 0) + j.gang
    idle = {t: max(n - held.get(t, 0), 0) for t, n in left.items()}  # GPUs no running job holds
    if not preempt:  # running jobs keep theirs; the waiting ones share the idle GPUs
        left = dict(idle)
    total = sum(capacity.values())
    entries: list[QueueEntry] = []
    growing: list[tuple[int, TrainingJob, int, str]] = []  # elastic jobs below their gang that kept theirs
    for pos, (j, level) in enumerate(ranked):
        if j.running:
            t, n = gpu_types[j.gpu_ids[0]], j.gang
            keep = n if not preempt else min(n, left.get(t, 0))
            if preempt:
                left[t] -= keep
            if keep == n:
                entries.append(QueueEntry(j.job_id, pos, level, "run", "running", j.tenant, t, n))
                if n < j.num_gpus:
                    growing.append((len(entries) - 1, j, level, t))
            elif keep >= j.fewest:
                used[j.tenant] -= n - keep
                entries.append(QueueEntry(j.job_id, pos, level, "resize", "shrink", j.tenant, t, keep))
            else:
                left[t] += keep
                used[j.tenant] -= n
                entries.append(QueueEntry(j.job_id, pos, level, "preempt", "priority", j.tenant, t))
            continue
        share = cfg.tenant_share(j.tenant)
        room = j.num_gpus if share is None else math.floor(share * total + 1e-9) - used.get(j.tenant, 0)
        if room < j.fewest:
            entries.append(QueueEntry(j.job_id, pos, level, "wait", "tenant-share", j.tenant))
            continue
        types = [j.gpu_type] if j.gpu_type is not None else sorted(left)
        fits = [t for t in types if min(left.get(t, 0), room) >= j.fewest]
        if not fits:
            entries.append(QueueEntry(j.job_id, pos, level, "wait", "no-capacity", j.tenant))
            continue

        # best fit: the whole gang before a smaller one, idle GPUs before preemptions, then the type
        # with the fewest GPUs left
        def fit(t: str, j: TrainingJob = j, room: int = room) -> int:
            return min(j.num_gpus, left[t], room)

        def score(t: str, j: TrainingJob = j) -> float:
            return float(fit(t)) if rate is None else rate(j, t, fit(t))

        t = min(fits, key=lambda t: (-score(t), idle.get(t, 0) < fit(t), left[t], t))
        n = fit(t)
        left[t] -= n
        idle[t] = max(idle.get(t, 0) - n, 0)
        used[j.tenant] = used.get(j.tenant, 0) + n
        entries.append(QueueEntry(j.job_id, pos, level, "start", "start", j.tenant, t, n))
    for i, j, level, t in growing if preempt else ():  # GPUs nobody took: elastic jobs grow into them
        extra = min(j.num_gpus - j.gang, idle.get(t, 0), left.get(t, 0))
        share = cfg.tenant_share(j.tenant)
        if share is not None:
            extra = min(extra, math.floor(share * total + 1e-9) - used.get(j.tenant, 0))
        if extra > 0:
            idle[t] -= extra
            used[j.tenant] = used.get(j.tenant, 0) + extra
            entries[i] = QueueEntry(j.job_id, entries[i].position, level, "resize", "grow", j.tenant, t, j.gang + extra)
    return QueuePlan(tuple(entries), state, nxt)
