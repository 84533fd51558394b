"""Harvest simulation: the pure placement policy drives typed GPUs shared by
guaranteed inference replicas and opportunistic training jobs, in virtual time.

:class:`HarvestPlacement` is a :class:`sloserve.sim.placement.PlacementHook`. Each autoscaling round the
simulator calls ``allocate(wants, holding, now_s)``; the hook

1. advances its training world to ``now_s`` (event by event: job arrivals, job completions, and
   preempted jobs releasing their GPUs), integrating GPUs by use (inference, training, idle);
2. builds a ``PlacementSnapshot`` (inventory, one ``ReplicaTarget`` per model on the model's GPU
   type, its replicas, queued and running ``TrainingJob``s with their progress) and calls the
   registered policy (``cost-aware``, ``static``, ``cost-blind``; ``none`` = no training at all,
   the inference baseline), whose training queue (``PlacementConfig.training_queue``: 2D-LAS, FIFO,
   SRTF) orders the jobs and may preempt one for a job ahead of it; the policy is called again when
   the queue says a job changes LAS queue, even if nothing else happened;
3. applies the decision with its delays: a preempted job keeps its GPUs for
   ``min(iteration + checkpoint write, grace)`` (a job preempted for one ahead of it in the queue
   gets the grace to checkpoint); if that fits in the grace period it checkpoints
   and loses nothing, else it is killed and loses its work since the last checkpoint; either way it
   goes back to the queue and resumes from its checkpoint (after ``restart_overhead_s``) when the
   policy places it again. A replica waiting for a preempted GPU starts that much later
   (``start_delay_s``, read by both drivers: fluid and request level).

A running job alternates ``checkpoint_every_s`` of work with a ``checkpoint_write_s`` pause, so
its progress and last checkpoint at any instant have a closed form (no per-iteration events).

>>> from sloserve.sim.training_trace import JobSpec
>>> h = HarvestPlacement("cost-aware", [JobSpec("j0", 0.0, 3600.0, 1)], {"m": "t4"},
...                      HarvestConfig(gpus={"t4": 4}))
>>> h.allocate({"m": 3}, {"m": 0}, now_s=0.0)  # the job takes the 4th GPU
{'m': 3}
>>> h.allocate({"m": 4}, {"m": 3}, now_s=60.0)  # inference first: the job is preempted for it
{'m': 4}
>>> h.report()["preemptions"], h.start_delay_s  # killed after the 1 s grace; the replica waits for it
(1, {'m': 1.0})
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sloserve.autoscaler.placement.policy import get_policy
from sloserve.autoscaler.placement.types import (
    Gpu,
    PlacementConfig,
    PlacementSnapshot,
    PlacementState,
    Replica,
    ReplicaTarget,
    TrainingJob,
)
from sloserve.sim.training_trace import JobSpec, checkpoint_interval_iterations

VARIANT = "default"
PLACEMENTS = ("none", "static", "cost-blind", "cost-aware")


class HarvestConfig(BaseModel):
    """The simulated cluster and how its training jobs behave."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: dict[str, int] = Field(
        default_factory=lambda: {"t4": 600, "a100": 400},
        description="GPUs of each type (type names as in sloserve/sim/profiles.py).",
    )
    gpu_memory_mib: dict[str, int] = Field(
        default_factory=lambda: {"t4": 16384, "a10g": 24576, "a100": 81920}, description="Device memory of each type."
    )
    replica_memory_mib: int = Field(default=4096, gt=0, description="Device memory one inference replica needs.")
    job_memory_mib: int = Field(default=15000, gt=0, description="Device memory a training job needs per GPU.")
    iteration_time_s: tuple[float, float] = Field(
        default=(0.2, 2.0), description="Per-job iteration time, log-uniform in [lo, hi] (seeded per job)."
    )
    checkpoint_every_s: float = Field(
        default=600.0, gt=0, description="Work between checkpoints (rounded down to whole iterations)."
    )
    checkpoint_write_s: float = Field(default=10.0, ge=0, description="A checkpoint write pauses the job this long.")
    known_durations: bool = Field(
        default=True,
        description="Tell the policy each job's total iterations (False: unknown durations, Tiresias ordering).",
    )
    seed: int = 0
    series_every_s: float = Field(default=300.0, gt=0, description="Sampling period of the GPUs-by-use series.")


@dataclass
class _Job:
    spec: JobSpec
    iter_s: float
    n_ckpt: int  # iterations per checkpoint interval
    write_s: float
    base_s: float = 0.0  # progress (work seconds) at the start of the current run = its checkpoint
    s0: float | None = None  # start of the current run (None: queued)
    overhead_s: float = 0.0  # restart overhead of the current run
    gpu_ids: tuple[str, ...] = ()
    attained_gpu_s: float = 0.0  # GPU-seconds held in finished runs (and before the slice)
    release_s: float | None = None  # preempting: when its GPUs are released
    run: int = 0
    finished_s: float | None = None
    rate: float = 1.0  # reference work seconds per wall second in the current run (a modelled job's speed)

    @property
    def interval_s(self) -> float:
        return self.n_ckpt * self.iter_s

    def progress(self, t: float) -> tuple[float, float]:
        """(work done, work checkpointed) at ``t`` during the current run."""
        if self.s0 is None:
            return self.base_s, self.base_s
        w, c = self.interval_s, self.interval_s + self.write_s
        e = t - self.s0 - self.overhead_s
        if e <= 0:
            return self.base_s, self.base_s
        k = math.floor(e / c)
        rem = e - k * c
        done = self.base_s + (k * w + min(rem, w)) * self.rate
        return min(done, self.spec.work_s), min(self.base_s + k * w * self.rate, self.spec.work_s)

    def finish_time(self) -> float:
        if self.s0 is None:
            raise RuntimeError(f"job {self.spec.job_id} is not running: no finish time")
        left = (self.spec.work_s - self.base_s) / self.rate
        w = self.interval_s
        full = max(math.ceil(left / w - 1e-9) - 1, 0)
        return self.s0 + self.overhead_s + full * (w + self.write_s) + (left - full * w)


class HarvestPlacement:
    """A placement hook that shares typed GPUs between inference and training (see module doc)."""

    def __init__(
        self,
        policy: str,
        jobs: list[JobSpec],
        model_types: Mapping[str, str],
        config: HarvestConfig | None = None,
        placement_config: PlacementConfig | None = None,
    ):
        if policy not in PLACEMENTS:
            raise ValueError(f"unknown placement {policy!r}; known: {list(PLACEMENTS)}")
        self.name = policy
        self.cfg = config or HarvestConfig()
        self.pcfg = placement_config or PlacementConfig(pack_small_replicas=False, substitute_types=False)
        self.policy = get_policy("cost-aware" if policy == "none" else policy)
        self.state = PlacementState()
        self.model_types = dict(model_types)
        self.gpus = tuple(
            Gpu(f"{ty}:{i:04d}", ty, self.cfg.gpu_memory_mib[ty])
            for ty in sorted(self.cfg.gpus)
            for i in range(self.cfg.gpus[ty])
        )
        self.gpu_type = {g.gpu_id: g.gpu_type for g in self.gpus}
        rng = np.random.default_rng(self.cfg.seed)
        lo, hi = self.cfg.iteration_time_s
        specs = [] if policy == "none" else list(jobs)
        iters = np.exp(rng.uniform(math.log(lo), math.log(hi), len(specs))) if specs else np.empty(0)
        self.arrivals = [
            _Job(
                s,
                float(it),
                checkpoint_interval_iterations(float(it), self.cfg.checkpoint_every_s),
                self.cfg.checkpoint_write_s,
                attained_gpu_s=s.attained_gpu_s,
            )
            for s, it in zip(specs, iters, strict=True)
        ]
        self.arrivals.sort(key=lambda j: (j.spec.submit_s, j.spec.job_id))
        self._next_arrival = 0
        self.jobs: dict[str, _Job] = {}  # arrived, not finished
        self.done: list[_Job] = []
        self.replicas: dict[str, Replica] = {}  # replica id -> replica
        self._rid = 0
        self._events: list[tuple[float, int, str, int]] = []  # (time, kind 0=release 1=finish, job, run)
        self.t = 0.0
        self.gpu_s = {"inference": 0.0, "training": 0.0, "idle": 0.0}
        self.gpu_s_by_type = {ty: {"inference": 0.0, "training": 0.0} for ty in self.cfg.gpus}
        self.preemptions = 0
        self.preempted_gpus = 0  # GPUs freed by preemptions (a gang counts all its GPUs)
        self.lost_gpu_s = 0.0
        self.lost_intervals: list[float] = []  # per preemption, in checkpoint intervals
        self.killed = 0
        self.start_delay_s: dict[str, float] = {}
        self.peak_inference_gpus: dict[str, int] = {ty: 0 for ty in self.cfg.gpus}
        self.series: dict[str, list] = {"t_s": [], "inference": [], "training": [], "idle": [], "preemptions": []}
        self._next_sample = 0.0
        self._preempt_mark = 0
        self._last_wants: dict[str, int] | None = None
        self._dirty = True
        self._usage = self._count()
        self.rounds = 0
        self._queue_change_s = math.inf  # the queue moves a job between LAS queues then
        self.priority_preemptions = 0

    # ------------------------------------------------------------ the hook
    def allocate(self, wants: Mapping[str, int], holding: Mapping[str, int], now_s: float) -> dict[str, int]:
        self.advance(now_s)
        self.start_delay_s = {}
        if self._dirty or dict(wants) != self._last_wants or now_s >= self._queue_change_s:
            self._round(wants, now_s)
        self._last_wants = dict(wants)
        self._dirty = False
        self._sample(now_s)
        grant = {m: 0 for m in wants}
        for r in self.replicas.values():
            if r.model in grant:
                grant[r.model] += 1
        return grant

    def _round(self, wants: Mapping[str, int], now_s: float) -> None:
        targets = tuple(
            ReplicaTarget(m, VARIANT, self.model_types[m], int(n), self.cfg.replica_memory_mib)
            for m, n in sorted(wants.items())
        )
        snap = PlacementSnapshot(
            gpus=self.gpus,
            targets=targets,
            replicas=tuple(self.replicas.values()),
            jobs=tuple(self._job_view(j, now_s) for j in self.jobs.values()),
        )
        decision, self.state = self.policy(snap, self.pcfg, self.state, now_s)
        self.rounds += 1
        self._queue_change_s = decision.queue_next_change_s
        self.priority_preemptions += sum(1 for p in decision.preempt if p.reason == "priority")
        for stop in decision.stop_replicas:
            del self.replicas[stop.replica_id]
        for p in decision.preempt:
            self._preempt(self.jobs[p.job_id], now_s, p.grace_s)
        for s in decision.start_replicas:
            self._rid += 1
            rid = f"r{self._rid}"
            self.replicas[rid] = Replica(rid, s.model, s.variant, s.gpu_id, s.memory_mib)
            if s.after_preempt is not None:
                rel = self.jobs[s.after_preempt].release_s
                delay = max((rel or now_s) - now_s, 0.0)
                self.start_delay_s[s.model] = max(self.start_delay_s.get(s.model, 0.0), delay)
        for st in decision.start_training:
            self._start(self.jobs[st.job_id], st.gpu_ids, now_s)
        self._usage = self._count()
        for ty, n in self._inference_by_type().items():
            self.peak_inference_gpus[ty] = max(self.peak_inference_gpus[ty], n)

    def _job_view(self, j: _Job, now_s: float) -> TrainingJob:
        done, ckpt = j.progress(now_s)
        held = (now_s - j.s0) * j.spec.num_gpus if j.s0 is not None else 0.0
        return TrainingJob(
            j.spec.job_id,
            j.spec.num_gpus,
            self.cfg.job_memory_mib,
            j.iter_s,
            iterations_done=int(done / j.iter_s + 1e-9),
            checkpoint_iteration=int(ckpt / j.iter_s + 1e-9),
            checkpoint_interval_iterations=j.n_ckpt,
            checkpoint_write_s=j.write_s,
            total_iterations=math.ceil(j.spec.work_s / j.iter_s) if self.cfg.known_durations else None,
            attained_gpu_s=j.attained_gpu_s + held,
            submit_time_s=j.spec.submit_s,
            tenant=j.spec.tenant,
            gpu_ids=j.gpu_ids,
            started_s=j.s0,
            preempting=j.release_s is not None,
        )

    # ------------------------------------------------------------ training mechanics
    def _start(self, j: _Job, gpu_ids: tuple[str, ...], now_s: float) -> None:
        j.gpu_ids, j.s0, j.run = tuple(gpu_ids), now_s, j.run + 1
        j.overhead_s = self.pcfg.restart_overhead_s if j.base_s > 0 else 0.0
        heapq.heappush(self._events, (j.finish_time(), 1, j.spec.job_id, j.run))

    def _preempt(self, j: _Job, now_s: float, grace: float) -> None:
        graceful = j.iter_s + j.write_s <= grace
        j.release_s = now_s + (j.iter_s + j.write_s if graceful else grace)
        if graceful:
            lost = 0.0
            j.base_s = j.progress(now_s)[0]
        else:
            done, ckpt = j.progress(j.release_s)
            lost = done - ckpt
            j.base_s = ckpt
            self.killed += 1
        self.preemptions += 1
        self.preempted_gpus += j.spec.num_gpus
        self.lost_gpu_s += lost * j.spec.num_gpus
        self.lost_intervals.append(lost / j.interval_s)
        heapq.heappush(self._events, (j.release_s, 0, j.spec.job_id, j.run))

    def _stop_run(self, j: _Job, t: float) -> None:
        if j.s0 is None:
            raise RuntimeError(f"job {j.spec.job_id} is not running: nothing to stop")
        j.attained_gpu_s += (t - j.s0) * j.spec.num_gpus
        j.gpu_ids, j.s0, j.release_s = (), None, None

    def advance(self, t_to: float) -> None:
        """Run the training world forward to ``t_to``, integrating GPUs by use."""
        while True:
            t_arr = (
                self.arrivals[self._next_arrival].spec.submit_s if self._next_arrival < len(self.arrivals) else math.inf
            )
            t_ev = self._events[0][0] if self._events else math.inf
            te = min(t_arr, t_ev)
            if te > t_to:
                break
            self._integrate(te)
            if t_ev <= t_arr:
                _, kind, jid, run = heapq.heappop(self._events)
                j = self.jobs.get(jid)
                if j is None or j.run != run or j.s0 is None:
                    continue
                if kind == 0:  # preempted job releases its GPUs, back to the queue
                    self._stop_run(j, te)
                elif j.release_s is None or te < j.release_s:  # finished (before any release)
                    self._stop_run(j, te)
                    j.base_s, j.finished_s = j.spec.work_s, te
                    self.done.append(self.jobs.pop(jid))
                else:
                    continue
            else:
                j = self.arrivals[self._next_arrival]
                self._next_arrival += 1
                self.jobs[j.spec.job_id] = j
            self._dirty = True
            self._usage = self._count()
        self._integrate(t_to)

    def _count(self) -> tuple[int, int]:
        train = {g for j in self.jobs.values() for g in j.gpu_ids}
        inf = {r.gpu_id for r in self.replicas.values()} - train
        return len(inf), len(train)

    def _inference_by_type(self) -> dict[str, int]:
        out = {ty: 0 for ty in self.cfg.gpus}
        for g in {r.gpu_id for r in self.replicas.values()}:
            out[self.gpu_type[g]] += 1
        return out

    def _integrate(self, t: float) -> None:
        dt = t - self.t
        if dt <= 0:
            return
        inf, train = self._usage
        self.gpu_s["inference"] += inf * dt
        self.gpu_s["training"] += train * dt
        self.gpu_s["idle"] += (len(self.gpus) - inf - train) * dt
        self.t = t

    def _sample(self, now_s: float) -> None:
        if now_s + 1e-9 < self._next_sample:
            return
        inf, train = self._usage
        self.series["t_s"].append(now_s)
        self.series["inference"].append(inf)
        self.series["training"].append(train)
        self.series["idle"].append(len(self.gpus) - inf - train)
        self.series["preemptions"].append(self.preemptions - self._preempt_mark)
        self._preempt_mark = self.preemptions
        self._next_sample = now_s + self.cfg.series_every_s

    def finish(self, end_s: float) -> None:
        """The simulation ends at ``end_s``: account for the time since the last round."""
        self.advance(end_s)

    # ------------------------------------------------------------ results
    def report(self) -> dict:
        h = {k: v / 3600.0 for k, v in self.gpu_s.items()}
        harvestable = h["training"] + h["idle"]  # GPU-hours inference did not use
        work = sum(j.spec.work_s * j.spec.num_gpus for j in self.done)
        work += sum(
            j.progress(self.t)[0] * j.spec.num_gpus if j.s0 is not None else j.base_s * j.spec.num_gpus
            for j in self.jobs.values()
        )
        window = [j for j in self.done if j.spec.job_id.startswith("j")]
        jct = np.array([j.finished_s - j.spec.submit_s for j in window if j.finished_s is not None])  # all done
        # every job submitted in the window, those still running or queued counted up to the end (a lower bound)
        open_jct = [self.t - j.spec.submit_s for j in self.jobs.values() if j.spec.job_id.startswith("j")]
        jct_all = np.concatenate([jct, np.array(open_jct)]) if len(jct) or open_jct else np.empty(0)
        li = np.array(self.lost_intervals)
        return {
            "placement": self.name,
            "training_queue": None if self.name == "none" else self.pcfg.training_queue,
            "gpus": dict(self.cfg.gpus),
            "inference_gpu_hours": h["inference"],
            "training_gpu_hours": h["training"],
            "idle_gpu_hours": harvestable,
            "unused_gpu_hours": h["idle"],
            "harvest_fraction": h["training"] / harvestable if harvestable > 0 else 0.0,
            "training_work_gpu_hours": work / 3600.0,
            "preemptions": self.preemptions,
            "preemptions_killed": self.killed,
            "preempted_gpus": self.preempted_gpus,
            "lost_work_gpu_hours": self.lost_gpu_s / 3600.0,
            "lost_per_preemption_intervals_mean": float(li.mean()) if len(li) else 0.0,
            "lost_per_preemption_intervals_max": float(li.max()) if len(li) else 0.0,
            "jobs_submitted": len(self.arrivals),
            "jobs_finished": len(self.done),
            "jct_jobs_finished": len(window),
            "jct_mean_s": float(jct.mean()) if len(jct) else None,
            "jct_median_s": float(np.median(jct)) if len(jct) else None,
            "jct_p95_s": float(np.percentile(jct, 95)) if len(jct) else None,
            "jct_jobs_submitted": len(jct_all),
            "jct_all_mean_s": float(jct_all.mean()) if len(jct_all) else None,
            "jct_all_p95_s": float(np.percentile(jct_all, 95)) if len(jct_all) else None,
            "priority_preemptions": self.priority_preemptions,
            "peak_inference_gpus_by_type": dict(self.peak_inference_gpus),
            "placement_rounds": self.rounds,
            "series": self.series,
        }

    def check(self) -> list[str]:
        """Violations of the hook's own books (over-allocation); empty when consistent."""
        errs = []
        owner: dict[str, str] = {}
        for j in self.jobs.values():
            if j.gpu_ids and len(j.gpu_ids) != j.spec.num_gpus:
                errs.append(f"{j.spec.job_id} holds {len(j.gpu_ids)} GPUs, needs {j.spec.num_gpus}")
            for g in j.gpu_ids:
                if g in owner:
                    errs.append(f"{g} held by {owner[g]} and {j.spec.job_id}")
                owner[g] = j.spec.job_id
        per_gpu: dict[str, int] = {}
        for r in self.replicas.values():
            per_gpu[r.gpu_id] = per_gpu.get(r.gpu_id, 0) + 1
            if self.gpu_type[r.gpu_id] != self.model_types[r.model]:
                errs.append(f"{r.replica_id} of {r.model} on a {self.gpu_type[r.gpu_id]}")
            holder = self.jobs.get(owner.get(r.gpu_id, ""))
            if holder is not None and holder.release_s is None:
                errs.append(f"replica {r.replica_id} on {r.gpu_id} beside running job {holder.spec.job_id}")
        errs += [f"{g}: {n} replicas" for g, n in per_gpu.items() if n > self.pcfg.max_replicas_per_gpu]
        return errs


def static_config(
    base: PlacementConfig, peak_inference_gpus: Mapping[str, int], margin: float = 0.0
) -> PlacementConfig:
    """A ``static`` partition sized to inference's peak per type (e.g. measured by the ``none`` run)."""
    sizes = {ty: math.ceil(n * (1 + margin)) for ty, n in peak_inference_gpus.items()}
    return base.model_copy(update={"static_inference_gpus": sizes})
