"""Training workload of the harvest simulation: jobs from a CSV trace (Philly by default).

A job is (submit time, duration, GPU count). ``load_training_jobs`` takes the jobs submitted in
``[start_s, start_s + window_s)`` and, with ``backlog=True``, also the jobs submitted earlier that
the trace shows still running at ``start_s``: they arrive at time 0 with their remaining duration
and the service they have had (GPUs x time run), so the cluster starts loaded instead of empty.
``tenant_col`` names a column that says whose job it is (Philly's ``vc``, its virtual cluster). Submit times are shifted to the window
(``submit_s - start_s``) and may be compressed by ``time_scale`` (0.5 = arrivals twice as dense);
GPU counts are capped at ``max_gpus`` (a gang never larger than one GPU type's pool).

Durations are treated as pure work on any GPU type (the trace has no per-type speed).

>>> import io
>>> csv_text = "submit_s,duration_s,num_gpus\\n0,100,1\\n50,500,2\\n200,10,1\\n"
>>> jobs = load_training_jobs(io.StringIO(csv_text), start_s=100, window_s=200)
>>> [(j.job_id, j.submit_s, j.work_s, j.num_gpus) for j in jobs]
[('b1', 0.0, 450.0, 2), ('j2', 100.0, 10.0, 1)]
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from typing import IO


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One training job of the workload: when it arrives, how much work, how many GPUs."""

    job_id: str
    submit_s: float  # arrival in simulated time
    work_s: float  # seconds of computation on its GPUs (the trace's duration, or what is left of it)
    num_gpus: int
    tenant: str = "default"  # the trace's tenant column (e.g. Philly's virtual cluster), if read
    attained_gpu_s: float = 0.0  # service received before the slice (backlog jobs: GPUs x time run)


def load_training_jobs(
    source: str | IO[str],
    *,
    start_s: float = 0.0,
    window_s: float = 86_400.0,
    submit_col: str = "submit_s",
    duration_col: str = "duration_s",
    gpus_col: str = "num_gpus",
    tenant_col: str | None = None,
    backlog: bool = True,
    time_scale: float = 1.0,
    max_gpus: int | None = None,
    min_duration_s: float = 1.0,
) -> list[JobSpec]:
    """Jobs of ``source`` (a path or a file) for a window of the trace, sorted by arrival."""
    if isinstance(source, str):
        with open(source, newline="") as f:
            rows = list(csv.DictReader(f))
    else:
        rows = list(csv.DictReader(source))
    need = {submit_col, duration_col, gpus_col} | ({tenant_col} if tenant_col else set())
    if rows and not need <= set(rows[0]):
        raise ValueError(f"training trace needs columns {sorted(need)}; has {sorted(rows[0])}")
    end_s = start_s + window_s
    jobs: list[JobSpec] = []
    for i, r in enumerate(rows):
        sub, dur, g = float(r[submit_col]), float(r[duration_col]), int(float(r[gpus_col]))
        if g <= 0 or dur < min_duration_s:
            continue
        if max_gpus is not None:
            g = min(g, max_gpus)
        tenant = (r[tenant_col] or "default") if tenant_col else "default"
        if start_s <= sub < end_s:
            jobs.append(JobSpec(f"j{i}", (sub - start_s) * time_scale, dur, g, tenant))
        elif backlog and sub < start_s and sub + dur > start_s:
            jobs.append(JobSpec(f"b{i}", 0.0, sub + dur - start_s, g, tenant, (start_s - sub) * g))
    jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    return jobs


def demand_gpu_hours(jobs: list[JobSpec], horizon_s: float) -> float:
    """GPU-hours the jobs would use within ``horizon_s`` if each ran at once on arrival."""
    return sum(j.num_gpus * max(min(j.work_s, horizon_s - j.submit_s), 0.0) for j in jobs) / 3600.0


def checkpoint_interval_iterations(iteration_time_s: float, checkpoint_every_s: float) -> int:
    """Iterations per checkpoint interval for a job that checkpoints every ``checkpoint_every_s`` of work."""
    return max(1, math.floor(checkpoint_every_s / iteration_time_s + 1e-9))
