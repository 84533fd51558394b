"""Placement of inference replicas and preemptible training jobs on typed GPUs.

Inference is guaranteed, training opportunistic: every policy places the autoscaler's replica
targets first (preempting training where needed), then gives what is left to queued training jobs.
Policies are pure and share one signature::

    decide(snapshot, config, state, now_s) -> (PlacementDecision, PlacementState)

Registry (``POLICIES`` / ``get_policy(name)``):

* ``cost-aware`` (ours): replicas go to the GPU type with the best profile throughput per unit of
  price (Gavel), onto a free GPU, else beside a training job when the replica is small (AntMan),
  else onto the GPUs of the training job whose preemption costs least (``placement_cost``);
  training jobs are ordered by the training queue (``sloserve.autoscaler.placement.queue``: 2D-LAS as in
  Tiresias, FIFO or shortest-remaining-first; tenant shares), start on a best-fit GPU type and are
  preempted for a job ahead of them in the queue.
* ``static``: a fixed share of each GPU type for inference, the rest for training; no sharing,
  no preemption.
* ``cost-blind``: as cost-aware, but preempts the most recently started job (or a random one,
  ``blind_choice="random"``), ignoring its cost.

>>> from sloserve.autoscaler.placement.types import *
>>> snap = PlacementSnapshot(
...     gpus=(Gpu("g0", "T4", 16384), Gpu("g1", "T4", 16384)),
...     targets=(ReplicaTarget("digits", "small", "T4", count=1, memory_mib=4096),),
...     jobs=(TrainingJob("a", 1, 8192, 0.1, iterations_done=90, checkpoint_iteration=0, gpu_ids=("g0",)),
...           TrainingJob("b", 1, 8192, 5.0, iterations_done=10, checkpoint_iteration=0, gpu_ids=("g1",))))
>>> d, s = decide("cost-aware", snap, PlacementConfig(), PlacementState(), now_s=0.0)
>>> [p.job_id for p in d.preempt], [r.gpu_id for r in d.start_replicas]
(['a'], ['g0'])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from sloserve.autoscaler.placement.cost import preemption_cost, rank_types
from sloserve.autoscaler.placement.engine import Cluster, Mode
from sloserve.autoscaler.placement.queue import plan as queue_plan
from sloserve.autoscaler.placement.types import (
    PlacementConfig,
    PlacementDecision,
    PlacementSnapshot,
    PlacementState,
    QueueEntry,
    QueueState,
    Replica,
    ReplicaTarget,
    StartTraining,
    StopReplica,
    TrainingJob,
    Unplaced,
)

Policy = Callable[[PlacementSnapshot, PlacementConfig, PlacementState, float], tuple[PlacementDecision, PlacementState]]


# ------------------------------------------------------------------ the shared algorithm


def _run(
    mode: Mode, snap: PlacementSnapshot, cfg: PlacementConfig, state: PlacementState, now_s: float
) -> tuple[PlacementDecision, PlacementState]:
    running = {j.job_id for j in snap.jobs if j.running}
    in_flight = {j: t for j, t in state.preempt_requested_s.items() if j in running}
    c = Cluster(snap, cfg, mode, in_flight)
    types = c.types()
    explicit = [t for t in snap.targets if t.gpu_type is not None and t.count > 0]
    anytype = [t for t in snap.targets if t.gpu_type is None and t.count > 0]

    # 1. keep replicas claimed by explicit targets on their own type; everything else is stopped
    #    provisionally (and re-claimed below when still wanted and its GPU still has room).
    claimed, vacated = _claim(c, snap, explicit)

    unplaced: list[Unplaced] = []
    deficits: list[tuple[ReplicaTarget, str, int]] = []  # (target, its gpu type, replicas missing)
    # 2. explicit targets on their own type
    for t in explicit:
        gpu_type = t.gpu_type
        assert gpu_type is not None  # explicit targets name their type (filtered above)
        have = sum(
            1
            for r in snap.replicas
            if r.replica_id in claimed
            and (r.model, r.variant) == (t.model, t.variant)
            and c.gpus[r.gpu_id].gpu_type == gpu_type
        )
        missing = 0
        for _ in range(t.count - have):
            if c.place_replica(t.model, t.variant, t.memory_mib, [gpu_type]) is None:
                missing += 1
        if missing:
            deficits.append((t, gpu_type, missing))

    def reclaim(model: str, variant: str, mem: int, gpu_type: str) -> bool:
        return _reclaim(c, vacated, model, variant, mem, gpu_type)

    # 3. targets of any type: keep existing replicas on the best types, then place the rest
    for t in anytype:
        ranked = rank_types(snap, cfg, t.model, t.variant, types)
        left = t.count
        for ty in ranked:
            while left and reclaim(t.model, t.variant, t.memory_mib, ty):
                left -= 1
        while left and c.place_replica(t.model, t.variant, t.memory_mib, ranked) is not None:
            left -= 1
        if left:
            unplaced.append(Unplaced(t.model, t.variant, None, left, "capacity"))

    # 4. substitution: what a type could not host goes to other types, throughput-equivalent
    for t, gpu_type, missing in deficits:
        others = [ty for ty in rank_types(snap, cfg, t.model, t.variant, types) if ty != gpu_type]
        need = float(missing)  # in replicas of the requested type
        if cfg.substitute_types:
            for ty in others:
                ratio = snap.throughput(t.model, t.variant, ty) / max(
                    snap.throughput(t.model, t.variant, gpu_type), 1e-12
                )
                if ratio <= 0:
                    continue
                while need > 1e-9 and (
                    reclaim(t.model, t.variant, t.memory_mib, ty)
                    or c.place_replica(t.model, t.variant, t.memory_mib, [ty], substitute=True)
                ):
                    need -= ratio
        if need > 1e-9:
            unplaced.append(Unplaced(t.model, t.variant, gpu_type, math.ceil(need - 1e-9), "capacity"))

    wanted = {(t.model, t.variant) for t in snap.targets if t.count > 0}
    stops = tuple(
        StopReplica(r.replica_id, r.gpu_id, "scale-in" if (r.model, r.variant) in wanted else "no-target")
        for r in sorted(vacated, key=lambda r: r.replica_id)
    )

    # 5. training: the queue (2D-LAS by default) on what inference leaves idle
    started, queue, qstate, next_change = _schedule_training(c, snap, cfg, types, state.queue, now_s)

    requested = dict(in_flight)
    requested.update({p.job_id: now_s for p in c.preempts})
    decision = PlacementDecision(
        policy=mode.name,
        stop_replicas=stops,
        preempt=tuple(c.preempts),
        start_replicas=tuple(c.starts),
        start_training=tuple(started),
        unplaced=tuple(unplaced),
        training_queue=queue,
        queue_next_change_s=next_change,
    )
    return decision, PlacementState(round=state.round + 1, preempt_requested_s=requested, queue=qstate)


def _claim(c: Cluster, snap: PlacementSnapshot, explicit: list[ReplicaTarget]) -> tuple[set[str], list[Replica]]:
    """The replicas explicit targets keep on their own type (fewest beside training first), and the
    rest, taken off their GPUs provisionally."""
    vacated: list[Replica] = []
    claimed: set[str] = set()
    for t in explicit:
        mine = [
            r
            for r in snap.replicas
            if (r.model, r.variant) == (t.model, t.variant)
            and r.replica_id not in claimed
            and r.gpu_id in c.gpus
            and c.gpus[r.gpu_id].gpu_type == t.gpu_type
        ]
        mine.sort(key=lambda r: (c.slots[r.gpu_id].job is not None, r.gpu_id, r.replica_id))
        claimed.update(r.replica_id for r in mine[: t.count])
    for r in snap.replicas:
        if r.replica_id not in claimed and r.gpu_id in c.gpus:
            c.remove_replica(r.gpu_id, r.model, r.variant, r.memory_mib)
            vacated.append(r)
    return claimed, vacated


def _reclaim(c: Cluster, vacated: list[Replica], model: str, variant: str, mem: int, gpu_type: str) -> bool:
    """Put back one vacated replica of (model, variant) on a GPU of ``gpu_type`` that still has room."""
    for r in sorted(vacated, key=lambda r: r.gpu_id):
        if (
            (r.model, r.variant, r.memory_mib) == (model, variant, mem)
            and c.gpus[r.gpu_id].gpu_type == gpu_type
            and c.reclaim_replica(r.gpu_id, r.model, r.variant, r.memory_mib)
        ):
            vacated.remove(r)
            return True
    return False


def _schedule_training(
    c: Cluster, snap: PlacementSnapshot, cfg: PlacementConfig, types, state: QueueState, now_s: float
) -> tuple[list[StartTraining], tuple[QueueEntry, ...], QueueState, float]:
    """The training queue (``sloserve.autoscaler.placement.queue``) on what inference leaves idle: jobs start
    where it says (on the type it chose), jobs behind a higher-priority one are preempted for it."""
    headroom = {ty: cfg.training_headroom_gpus for ty in types}
    leaving = {p.job_id for p in c.preempts} | {
        j.job_id for j in snap.jobs if j.running and any(c.slots[g].job != j.job_id for g in j.gpu_ids if g in c.slots)
    }
    jobs = [j for j in snap.jobs if j.job_id not in leaving and all(g in c.slots for g in j.gpu_ids)]
    gpu_types = {g: c.gpus[g].gpu_type for g in c.gpus}
    qp = queue_plan(
        jobs, c.training_capacity(headroom), gpu_types, cfg, state, now_s, preempt=c.mode.choose_victim is not None
    )
    by_id = {j.job_id: j for j in jobs}
    for e in qp.entries:
        if e.action == "preempt":
            c.preempt(by_id[e.job_id], reason="priority")
        elif e.action == "resize":  # elastic: checkpoint now, restart on e.gpus when the queue next starts it
            c.preempt(by_id[e.job_id], reason="resize")
    started: list[StartTraining] = []
    entries: list[QueueEntry] = []
    for e in qp.entries:
        if e.action == "start":
            j = by_id[e.job_id]
            gids = c.place_training(j, headroom, [e.gpu_type] if e.gpu_type is not None else None, e.gpus or None)
            if gids is None:  # its GPUs are still held by the jobs preempted for it
                e = replace(e, action="wait", reason="waiting-for-gpus")
            else:
                started.append(StartTraining(j.job_id, gids, "resume" if j.checkpoint_iteration > 0 else "idle-gpus"))
        entries.append(e)
    return started, tuple(entries), qp.state, qp.next_change_s


# ------------------------------------------------------------------ the policies


def cost_aware(
    snap: PlacementSnapshot, cfg: PlacementConfig, state: PlacementState, now_s: float
) -> tuple[PlacementDecision, PlacementState]:
    """Ours: preempt the job whose preemption costs least (``placement_cost.preemption_cost``)."""
    keys: dict[str, tuple] = {}

    def key(j: TrainingJob) -> tuple:
        k = keys.get(j.job_id)
        if k is None:
            k = keys[j.job_id] = (preemption_cost(j, cfg).key, j.job_id)
        return k

    def least_cost(jobs: list[TrainingJob]) -> TrainingJob:
        return min(jobs, key=key)

    return _run(Mode("cost-aware", least_cost, pack=True), snap, cfg, state, now_s)


def cost_blind(
    snap: PlacementSnapshot, cfg: PlacementConfig, state: PlacementState, now_s: float
) -> tuple[PlacementDecision, PlacementState]:
    """Sharing without a cost model: preempt the most recently started job (or a random one)."""
    if cfg.blind_choice == "random":
        rng = np.random.default_rng([cfg.seed, state.round])

        def choose(jobs: list[TrainingJob]) -> TrainingJob:
            return jobs[int(rng.integers(len(jobs)))]
    else:

        def choose(jobs: list[TrainingJob]) -> TrainingJob:
            return max(jobs, key=lambda j: (j.started_s if j.started_s is not None else -math.inf, j.job_id))

    return _run(Mode("cost-blind", choose, pack=True), snap, cfg, state, now_s)


def static_partition(snap: PlacementSnapshot, cfg: PlacementConfig) -> tuple[frozenset[str], frozenset[str]]:
    """(inference GPUs, training GPUs): the first share of each type, by GPU id, serves inference."""
    inference: set[str] = set()
    for ty in sorted({g.gpu_type for g in snap.gpus}):
        ids = sorted(g.gpu_id for g in snap.gpus if g.gpu_type == ty)
        n = cfg.static_inference_gpus.get(ty, math.ceil(cfg.static_inference_fraction * len(ids)))
        inference.update(ids[: min(n, len(ids))])
    return frozenset(inference), frozenset(g.gpu_id for g in snap.gpus) - frozenset(inference)


def static(
    snap: PlacementSnapshot, cfg: PlacementConfig, state: PlacementState, now_s: float
) -> tuple[PlacementDecision, PlacementState]:
    """Static partitioning: no sharing, no preemption."""
    inf, train = static_partition(snap, cfg)
    return _run(Mode("static", None, pack=False, inference_gpus=inf, training_gpus=train), snap, cfg, state, now_s)


POLICIES: dict[str, Policy] = {"cost-aware": cost_aware, "static": static, "cost-blind": cost_blind}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; known: {sorted(POLICIES)}") from None


def decide(
    name: str, snapshot: PlacementSnapshot, config: PlacementConfig, state: PlacementState, now_s: float
) -> tuple[PlacementDecision, PlacementState]:
    """Run the policy registered as ``name``."""
    return get_policy(name)(snapshot, config, state, now_s)


# ------------------------------------------------------------------ applying a decision


def apply_decision(
    snapshot: PlacementSnapshot,
    decision: PlacementDecision,
    config: PlacementConfig,
    now_s: float,
    replica_id_prefix: str = "r",
) -> PlacementSnapshot:
    """The snapshot once ``decision`` has taken effect, as if instantly: stopped replicas gone,
    preempted jobs back in the queue (at their checkpoint: graceful ones at their current
    iteration, killed ones at their last checkpoint), new replicas and training jobs running.

    A simulator may use this directly, or model the delays (grace period, replica start-up) itself.
    """
    from sloserve.autoscaler.placement.cost import checkpoints_in_grace

    stopped = {s.replica_id for s in decision.stop_replicas}
    replicas = [r for r in snapshot.replicas if r.replica_id not in stopped]
    for i, s in enumerate(decision.start_replicas):
        replicas.append(Replica(f"{replica_id_prefix}{now_s:.3f}-{i}", s.model, s.variant, s.gpu_id, s.memory_mib))
    preempted = {p.job_id for p in decision.preempt}
    starts = {s.job_id: s.gpu_ids for s in decision.start_training}
    jobs = []
    for j in snapshot.jobs:
        if j.job_id in preempted:
            done = j.iterations_done if checkpoints_in_grace(j, config) else j.checkpoint_iteration
            j = replace(
                j, gpu_ids=(), started_s=None, preempting=False, iterations_done=done, checkpoint_iteration=done
            )
        elif j.job_id in starts:
            j = replace(j, gpu_ids=starts[j.job_id], started_s=now_s, preempting=False)
        jobs.append(j)
    return replace(snapshot, replicas=tuple(replicas), jobs=tuple(jobs))


def check_capacity(snapshot: PlacementSnapshot, config: PlacementConfig) -> list[str]:
    """Violations of GPU and memory capacity in a snapshot (empty when it is valid)."""
    errors: list[str] = []
    on: dict[str, list[Replica]] = {g.gpu_id: [] for g in snapshot.gpus}
    jobs_on: dict[str, list[TrainingJob]] = {g.gpu_id: [] for g in snapshot.gpus}
    for r in snapshot.replicas:
        on.setdefault(r.gpu_id, []).append(r)
    for j in snapshot.jobs:
        for gid in j.gpu_ids:
            jobs_on.setdefault(gid, []).append(j)
    for g in snapshot.gpus:
        rs, js = on[g.gpu_id], jobs_on[g.gpu_id]
        mem = sum(r.memory_mib for r in rs) + sum(j.memory_mib for j in js)
        if mem > g.memory_mib:
            errors.append(f"{g.gpu_id}: {mem} MiB > {g.memory_mib} MiB")
        if len(rs) > config.max_replicas_per_gpu:
            errors.append(f"{g.gpu_id}: {len(rs)} replicas > {config.max_replicas_per_gpu}")
        if len(js) > 1:
            errors.append(f"{g.gpu_id}: {len(js)} training jobs")
        if js and any(r.memory_mib > config.pack_max_replica_memory_mib for r in rs):
            errors.append(f"{g.gpu_id}: a large replica beside training")
    for j in snapshot.jobs:
        if j.gpu_ids and len(j.gpu_ids) != j.num_gpus:
            errors.append(f"{j.job_id}: runs on {len(j.gpu_ids)} GPUs, needs {j.num_gpus}")
    return errors
