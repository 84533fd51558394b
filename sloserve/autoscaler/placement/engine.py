"""Private machinery of the placement policies: a mutable working copy of the cluster and the
greedy steps (place a replica, start a training job) that the policies in ``placement`` compose.

Nothing here is public API; ``sloserve.autoscaler.placement.policy`` is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sloserve.autoscaler.placement.types import (
    Gpu,
    PlacementConfig,
    PlacementSnapshot,
    Preempt,
    PreemptReason,
    StartReplica,
    TrainingJob,
)

# chooses the job to preempt among candidates (never empty)
VictimChooser = Callable[[list[TrainingJob]], TrainingJob]


@dataclass
class _Slot:
    replicas: list[tuple[str, str, int]] = field(default_factory=list)  # (model, variant, memory_mib)
    job: str | None = None  # live training job
    freeing: str | None = None  # job being preempted (its memory is counted as released)
    vacated: int = 0  # replicas provisionally stopped here this round (re-claimable)


@dataclass
class Mode:
    """What distinguishes the policies: victim choice, sharing and partitions."""

    name: str
    choose_victim: VictimChooser | None  # None: never preempt
    pack: bool
    inference_gpus: frozenset[str] | None = None  # None: any GPU
    training_gpus: frozenset[str] | None = None


class Cluster:
    """A working copy of the snapshot that the greedy steps mutate, recording what they did."""

    def __init__(self, snap: PlacementSnapshot, cfg: PlacementConfig, mode: Mode, in_flight: Iterable[str]):
        self.snap, self.cfg, self.mode = snap, cfg, mode
        self.gpus: dict[str, Gpu] = {g.gpu_id: g for g in snap.gpus}
        self.slots: dict[str, _Slot] = {g.gpu_id: _Slot() for g in snap.gpus}
        self.jobs: dict[str, TrainingJob] = {j.job_id: j for j in snap.jobs}
        self.preempts: list[Preempt] = []
        self.starts: list[StartReplica] = []
        in_flight = set(in_flight)
        self._by_type: dict[str, list[str]] = {}
        self._no_fit: set[tuple] = set()
        for g in sorted(self.gpus):
            self._by_type.setdefault(self.gpus[g].gpu_type, []).append(g)
        for r in snap.replicas:
            if r.gpu_id in self.slots:
                self.slots[r.gpu_id].replicas.append((r.model, r.variant, r.memory_mib))
        for j in snap.jobs:
            for g in j.gpu_ids:
                if g in self.slots:
                    if j.preempting or j.job_id in in_flight:
                        self.slots[g].freeing = j.job_id
                    else:
                        self.slots[g].job = j.job_id

    # ------------------------------------------------------------ queries
    def of_type(self, gpu_type: str) -> list[str]:
        return self._by_type.get(gpu_type, [])

    def types(self) -> list[str]:
        return sorted(self._by_type)

    def used_mib(self, gid: str) -> int:
        s = self.slots[gid]
        used = sum(m for _, _, m in s.replicas)
        if s.job is not None:
            used += self.jobs[s.job].memory_mib
        return used

    def _small(self, mem: int) -> bool:
        return self.mode.pack and self.cfg.pack_small_replicas and mem <= self.cfg.pack_max_replica_memory_mib

    def replica_fits(self, gid: str, mem: int, beside_job: bool) -> bool:
        s = self.slots[gid]
        if self.mode.inference_gpus is not None and gid not in self.mode.inference_gpus:
            return False
        if len(s.replicas) >= self.cfg.max_replicas_per_gpu:
            return False
        if self.used_mib(gid) + mem > self.gpus[gid].memory_mib:
            return False
        if s.job is not None:  # packing beside training: the replica and all others must be small
            return beside_job and self._small(mem) and all(self._small(m) for _, _, m in s.replicas)
        return True

    def training_fits(self, gid: str, job: TrainingJob) -> bool:
        s = self.slots[gid]
        if s.job is not None or s.freeing is not None:
            return False
        if self.mode.training_gpus is not None and gid not in self.mode.training_gpus:
            return False
        if job.gpu_type is not None and self.gpus[gid].gpu_type != job.gpu_type:
            return False
        if s.replicas and not all(self._small(m) for _, _, m in s.replicas):
            return False
        return self.used_mib(gid) + job.memory_mib <= self.gpus[gid].memory_mib

    # ------------------------------------------------------------ replica steps
    def remove_replica(self, gid: str, model: str, variant: str, mem: int) -> None:
        s = self.slots[gid]
        s.replicas.remove((model, variant, mem))
        s.vacated += 1

    def reclaim_replica(self, gid: str, model: str, variant: str, mem: int) -> bool:
        """Keep a provisionally stopped replica if its GPU still has room for it."""
        if not self.replica_fits(gid, mem, beside_job=True):
            return False
        self.slots[gid].replicas.append((model, variant, mem))
        self.slots[gid].vacated -= 1
        return True

    def _add(self, gid: str, model: str, variant: str, mem: int, reason, after=None, beside=None) -> str:
        self.slots[gid].replicas.append((model, variant, mem))
        self.starts.append(StartReplica(model, variant, gid, mem, reason, after_preempt=after, beside_job=beside))
        return gid

    def place_replica(
        self, model: str, variant: str, mem: int, types: list[str], substitute: bool = False
    ) -> str | None:
        """Place one replica on the first of ``types`` that has room, cheapest way first:
        a free GPU, a GPU beside a training job, a GPU freed by preempting the least-cost job."""
        for t in types:  # 1. no training job on it: already freed > shared > idle > just vacated
            cands = [g for g in self.of_type(t) if self.slots[g].job is None and self.replica_fits(g, mem, False)]
            if cands:
                s = self.slots
                g = min(cands, key=lambda g: (s[g].freeing is None, -len(s[g].replicas), s[g].vacated > 0, g))
                reason = (
                    "substitute-type"
                    if substitute
                    else ("after-preemption" if s[g].freeing else "shared-gpu" if s[g].replicas else "idle-gpu")
                )
                return self._add(g, model, variant, mem, reason, after=s[g].freeing)
        for t in types if self._small(mem) else ():  # 2. beside a training job (AntMan)
            cands = [g for g in self.of_type(t) if self.slots[g].job is not None and self.replica_fits(g, mem, True)]
            if cands:
                g = min(cands, key=lambda g: (-self.used_mib(g), g))
                return self._add(g, model, variant, mem, "packed-beside-training", beside=self.slots[g].job)
        if self.mode.choose_victim is None:
            return None
        for t in types:  # 3. preempt: the least-cost job whose GPU would then fit the replica
            victims = self._victims(t, mem)
            if victims:
                job = self.mode.choose_victim(victims)
                self.preempt(job)
                cands = [
                    g
                    for g in job.gpu_ids
                    if g in self.slots and self.gpus[g].gpu_type == t and self.replica_fits(g, mem, False)
                ]
                g = min(cands, key=lambda g: (-len(self.slots[g].replicas), g))
                return self._add(
                    g, model, variant, mem, "substitute-type" if substitute else "after-preemption", after=job.job_id
                )
        return None

    def _victims(self, gpu_type: str, mem: int) -> list[TrainingJob]:
        ids: set[str] = set()
        for g in self.of_type(gpu_type):
            j = self.slots[g].job
            if j is not None and self._fits_without_job(g, mem):
                ids.add(j)
        return [self.jobs[j] for j in sorted(ids)]

    def _fits_without_job(self, gid: str, mem: int) -> bool:
        s = self.slots[gid]
        if self.mode.inference_gpus is not None and gid not in self.mode.inference_gpus:
            return False
        used = sum(m for _, _, m in s.replicas)
        return len(s.replicas) < self.cfg.max_replicas_per_gpu and used + mem <= self.gpus[gid].memory_mib

    def preempt(self, job: TrainingJob, reason: PreemptReason = "reclaim-for-inference") -> None:
        from sloserve.autoscaler.placement.cost import preemption_cost

        for g in job.gpu_ids:
            if g in self.slots:
                self.slots[g].job = None
                self.slots[g].freeing = job.job_id
        cfg = self.cfg
        if reason in ("priority", "resize"):  # no replica waits: the job may finish its iteration and checkpoint
            grace = max(cfg.preempt_grace_s, job.iteration_time_s + job.checkpoint_write_s)
            cfg = cfg.model_copy(update={"preempt_grace_s": grace})
        self.preempts.append(Preempt(job.job_id, job.gpu_ids, reason, cfg.preempt_grace_s, preemption_cost(job, cfg)))

    # ------------------------------------------------------------ training steps
    def training_capacity(self, headroom: dict[str, int]) -> dict[str, int]:
        """GPUs of each type that training may use now: those its running jobs hold, plus the idle ones
        beyond ``headroom`` and those shared with small replicas (GPUs being freed are not counted)."""
        out: dict[str, int] = {}
        for t in self.types():
            held = idle = shared = 0
            for g in self.of_type(t):
                s = self.slots[g]
                if self.mode.training_gpus is not None and g not in self.mode.training_gpus:
                    continue
                if s.job is not None:
                    held += 1
                elif s.freeing is None and not s.replicas:
                    idle += 1
                elif s.freeing is None and all(self._small(m) for _, _, m in s.replicas):
                    shared += 1
            out[t] = held + max(idle - headroom.get(t, 0), 0) + shared
        return out

    def place_training(
        self, job: TrainingJob, headroom: dict[str, int], types: list[str] | None = None, gpus: int | None = None
    ) -> tuple[str, ...] | None:
        """``gpus`` GPUs (default the whole gang) of one type (of ``types``, default all), or None.
        Best fit: the type with the fewest spare GPUs that still fit the job, fully idle GPUs before
        GPUs shared with small replicas."""
        want = job.num_gpus if gpus is None else gpus
        shape = (want, job.memory_mib, job.gpu_type, tuple(types or ()))
        if shape in self._no_fit:  # capacity only shrinks within a round
            return None
        best: tuple[int, str, list[str]] | None = None
        for t in types if types is not None else self.types():
            ok = [
                g
                for g in self.of_type(t)
                if self.slots[g].job is None and self.slots[g].freeing is None and self.training_fits(g, job)
            ]
            idle = [g for g in ok if not self.slots[g].replicas]
            spare_idle = len(idle) - headroom.get(t, 0)
            usable = idle[: max(spare_idle, 0)] + [g for g in ok if self.slots[g].replicas]
            if len(usable) >= want and (best is None or len(usable) < best[0]):
                best = (len(usable), t, usable)
        if best is None:
            self._no_fit.add(shape)
            return None
        gids = tuple(best[2][:want])
        for g in gids:
            self.slots[g].job = job.job_id
        self.jobs[job.job_id] = job
        return gids
