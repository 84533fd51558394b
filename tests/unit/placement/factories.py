"""Hypothesis strategies and small factories for placement tests: valid worlds of typed GPUs,
running replicas, running and queued training jobs, and replica targets."""

from __future__ import annotations

from hypothesis import strategies as st

from sloserve.autoscaler.placement.types import (
    Gpu,
    PlacementSnapshot,
    Replica,
    ReplicaTarget,
    TrainingJob,
)

TYPES = ("A100", "T4", "V100")
MEMORY = {"A100": 40960, "T4": 16384, "V100": 16384}
MODELS = (("digits", "small"), ("digits", "large"), ("heavy", "large"))


def job(
    job_id: str,
    gpu_ids=(),
    num_gpus: int | None = None,
    memory_mib: int = 4096,
    iteration_time_s: float = 0.1,
    done: int = 0,
    interval: int = 100,
    **kw,
) -> TrainingJob:
    n = num_gpus if num_gpus is not None else max(len(gpu_ids), 1)
    ckpt = kw.pop("checkpoint_iteration", (done // interval) * interval)
    return TrainingJob(
        job_id,
        n,
        memory_mib,
        iteration_time_s,
        iterations_done=done,
        checkpoint_iteration=ckpt,
        checkpoint_interval_iterations=interval,
        gpu_ids=tuple(gpu_ids),
        **kw,
    )


@st.composite
def worlds(draw, explicit_only: bool = True, feasible: bool = False, max_gpus: int = 12):
    """A valid snapshot. ``feasible``: per type, the targets' replicas fit the GPUs of that type."""
    n = draw(st.integers(1, max_gpus))
    gpus = tuple(
        Gpu(f"g{i:02d}", t, MEMORY[t])
        for i, t in enumerate(draw(st.lists(st.sampled_from(TYPES), min_size=n, max_size=n)))
    )
    free = {g.gpu_id for g in gpus}
    jobs: list[TrainingJob] = []
    k = 0
    for g in gpus:  # running gangs of one type
        if g.gpu_id not in free or not draw(st.booleans()):
            continue
        mates = [h.gpu_id for h in gpus if h.gpu_id in free and h.gpu_type == g.gpu_type]
        size = draw(st.integers(1, min(3, len(mates))))
        ids = mates[:size]
        free -= set(ids)
        interval = draw(st.integers(1, 50))
        done = draw(st.integers(0, 500))
        jobs.append(
            job(
                f"run{k}",
                ids,
                memory_mib=draw(st.sampled_from([2048, 8192, 12288])),
                iteration_time_s=draw(st.sampled_from([0.05, 0.5, 3.0])),
                done=done,
                interval=interval,
                total_iterations=draw(st.one_of(st.none(), st.integers(done + 1, done + 1000))),
                attained_gpu_s=draw(st.floats(0, 1e5)),
                started_s=float(draw(st.integers(0, 1000))),
            )
        )
        k += 1
    replicas: list[Replica] = []
    for i, g in enumerate(gpus):  # some replicas on free GPUs, some small ones beside training
        if draw(st.integers(0, 3)) == 0:
            m, v = draw(st.sampled_from(MODELS))
            beside = g.gpu_id not in free
            mem = 1024 if beside else draw(st.sampled_from([1024, 4096]))
            jm = sum(j.memory_mib for j in jobs if g.gpu_id in j.gpu_ids)
            if jm + mem <= g.memory_mib:
                replicas.append(Replica(f"old{i}", m, v, g.gpu_id, mem))
    queued = [
        job(
            f"q{i}",
            (),
            num_gpus=draw(st.integers(1, 3)),
            memory_mib=draw(st.sampled_from([2048, 8192])),
            attained_gpu_s=draw(st.floats(0, 1e4)),
            submit_time_s=float(i),
            checkpoint_iteration=draw(st.sampled_from([0, 10])),
        )
        for i in range(draw(st.integers(0, 5)))
    ]
    targets: list[ReplicaTarget] = []
    budget = {t: sum(1 for g in gpus if g.gpu_type == t) for t in TYPES}
    for m, v in MODELS:
        ty = draw(st.sampled_from(TYPES) if explicit_only else st.one_of(st.none(), st.sampled_from(TYPES)))
        cap = budget[ty] if (feasible and ty is not None) else 4
        c = draw(st.integers(0, max(cap, 0)))
        if feasible and ty is not None:
            budget[ty] -= c
        targets.append(ReplicaTarget(m, v, ty, c, draw(st.sampled_from([1024, 4096]))))
    thr = {(m, v, t): draw(st.sampled_from([50.0, 100.0, 300.0])) for m, v in MODELS for t in TYPES}
    return PlacementSnapshot(
        gpus=gpus,
        targets=tuple(targets),
        replicas=tuple(replicas),
        jobs=tuple(jobs + queued),
        replica_throughput_rps=thr,
    )
