"""Live harvest: preemptible training on the GPUs inference does not use, reclaimed when it does.

A small controller thread in every gateway process (started by :class:`sloserve.gateway.server.Gateway` when
``training.enabled``); of the processes that share ``training.jobs_dir`` one, the leader, places jobs
(``sloserve/training/leader.py``: a file lock), and the others serve the same jobs and the leader's
report. Every ``training.interval_s`` the leader

1. **observes** Ray: the typed-GPU inventory (``emulated_gpus``, else the nodes' ``GPU`` and
   ``accelerator_type:<T>`` resources), each GPU model's Serve replica target (replicas starting,
   including those pending for lack of a GPU, plus running) and the replica actors that hold a GPU
   (ALIVE in the actor table), and the training jobs of a :class:`TrainingManager` with their
   progress (``TrainingDriver.progress``);
2. builds a :class:`PlacementSnapshot` and calls the pure placement policy (``cost-aware``), whose
   training queue (``training.queue``: 2D-LAS by default; ``training.tenant_shares``) orders the jobs;
3. **carries out** the decision: ``preempt`` -> the job checkpoints at its next iteration boundary
   and stops (killed after ``grace_s``), so Ray schedules the pending replica on the freed GPU;
   ``start_training`` -> a queued or preempted job starts (resuming from its checkpoint) once Ray
   reports the GPU free. Replicas themselves are started and stopped by Ray Serve's autoscaler.

Training gangs (Ray Train workers) and GPU replicas ask Ray for the same resources: ``GPU`` plus
``accelerator_type:<T>`` (``sloserve/training/runtime.py``: one GPU per worker; a replica takes
``replica_gpu_fraction`` GPUs), so a GPU held by training is a GPU Serve cannot schedule a replica on.

GPU ids in the snapshot are the controller's own bookkeeping (``T4:0``, ``T4:1``...): on one node
Ray pools GPUs, so which physical GPU a job holds does not matter, only how many of each type.
Times are measured from the decision: ``freed_s`` (the job's driver dead and its gang's placement group removed: its GPUs released) and
``ready_s`` (the replica that waited for it RUNNING in Serve). ``GET /v2/training/placement``
returns them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace

from sloserve.autoscaler.placement.metrics import gpu_usage
from sloserve.autoscaler.placement.policy import get_policy
from sloserve.autoscaler.placement.types import (
    Gpu,
    PlacementConfig,
    PlacementDecision,
    PlacementSnapshot,
    PlacementState,
    Replica,
    ReplicaTarget,
    TrainingJob,
)
from sloserve.replica import tracing
from sloserve.training.harvest_jobs import HarvestJobs
from sloserve.training.job import TrainingSpec
from sloserve.training.leader import Leadership
from sloserve.training.manager import JobInfo, TrainingManager
from sloserve.training.perftrack import LivePredictions

log = logging.getLogger("sloserve.harvest")
TARGET_STATES = ("STARTING", "RUNNING", "UPDATING", "RECOVERING")
JOB_STATES = ("queued", "running", "checkpointing", "preempted", "finished", "cancelled", "failed")


@dataclass
class Reclaim:
    """One live preemption for inference; times in seconds from the decision."""

    job_id: str
    gpu_type: str
    model: str | None
    variant: str | None
    decided_at: float  # monotonic clock of the decision
    iteration_at_request: int = 0
    waited_s: float = 0.0  # how long the replica had been pending (target > replicas holding a GPU) before
    outcome: str | None = None  # checkpointed | killed
    stopped_s: float | None = None  # preempt protocol returned (checkpoint written, kill sent)
    freed_s: float | None = None  # training actor dead: its GPU is free for Ray to schedule on
    granted_s: float | None = None  # the waiting replica's actor holds the GPU (ALIVE in Ray)
    ready_s: float | None = None  # the replica that waited for the GPU is RUNNING
    checkpoint_iteration: int | None = None
    lost_iterations: int | None = None
    _baseline_running: int = field(default=0, repr=False)
    _baseline_holders: int = field(default=0, repr=False)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


@dataclass
class _Job:
    """What the controller remembers of a job between rounds."""

    spec: TrainingSpec
    gpu_ids: tuple[str, ...] = ()
    iteration: int = 0
    checkpoint_iteration: int = 0
    iteration_time_s: float | None = None
    attained_gpu_s: float = 0.0
    started_s: float | None = None
    seen_at: float | None = None
    submitted_s: float = 0.0  # when the controller first saw it: the queue's submit order
    completed: bool = False  # its completion time is recorded


class HarvestController:
    """Places training jobs on idle typed GPUs and preempts them when inference needs the GPU.

    >>> # Gateway does this when settings.training.enabled (backend "ray", after Ray is up):
    >>> # h = HarvestController(settings, backend, metrics); h.start()  # its HTTP API: sloserve/gateway/transports/training.py
    """

    def __init__(self, settings, backend, metrics, clock=time.monotonic, last_to_stop: bool = True):
        """``last_to_stop``: this process stops after the others that share the jobs directory (a lone
        gateway; worker 0 of ``--workers``): its ``stop`` checkpoints the running jobs."""
        from sloserve.training.runtime import RayLauncher

        t = settings.training
        self.settings, self.backend, self.metrics, self.clock = settings, backend, metrics, clock
        # emulated GPUs on a CPU box: the gang's collectives on gloo; real GPUs: Ray Train's choice (NCCL)
        launcher = RayLauncher(backend="gloo" if settings.emulated_gpus else None)
        self.manager = TrainingManager(
            t.jobs_dir,
            launcher=launcher,
            grace_s=t.grace_s,
            entries=t.entries,
            max_jobs=t.max_jobs,
            max_config_bytes=t.max_config_bytes,
            keep_checkpoints=t.keep_checkpoints,
            retain_ended_s=t.retain_ended_s,
        )
        self.lead, self.last_to_stop = Leadership(self.manager.dir), last_to_stop
        self._wake, self._stop = threading.Event(), threading.Event()
        self.predictions = LivePredictions(metrics, clock)  # the predictive queue's measurements and answers
        self.jobs_api = HarvestJobs(self.manager, lambda: self._wake.set(), self._annotate, self.predictions.admit)
        self.policy_name = t.policy
        self._policy = get_policy(t.policy)
        frac = settings.replica_gpu_fraction
        self.replica_memory_mib = max(1, round(min(frac, 1.0) * t.gpu_memory_mib))
        self.config = PlacementConfig(
            preempt_grace_s=t.grace_s,
            restart_overhead_s=1.0,
            pack_small_replicas=False,
            substitute_types=False,
            max_replicas_per_gpu=max(1, math.floor(1 / frac + 1e-9)),
            training_queue=t.queue,
            tenant_shares=t.tenant_shares,
        )
        self.state = PlacementState()
        self.reclaims: list[Reclaim] = []
        self.last_decision: PlacementDecision | None = None
        self._jobs: dict[str, _Job] = {}
        self._preempting: dict[str, Reclaim] = {}
        self._starting: set[str] = set()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="harvest")
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_tick: float | None = None
        self.round_s = 0.0  # how long the last round took (observe + decide + act)
        self._usage: dict[tuple[str, str], int] = {}
        self._pending_since: dict[tuple[str, str], float] = {}
        self._tput: dict = {}
        self._tput_for: tuple = ()

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="sloserve-harvest")
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop, then, in the last process to stop (``last_to_stop``, and no other leads),
        checkpoint and stop every running job (resumable on the next start); a process whose siblings
        keep serving leaves the jobs running."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
        self._pool.shutdown(wait=True)
        final = self.last_to_stop and self.lead.try_lead()
        self.lead.resign()
        for j in self.manager.list() if final else ():
            if j.state == "running":
                try:
                    self.manager.preempt(j.job_id)
                except Exception:  # shutting down: best effort, the checkpoint is on disk
                    log.warning("could not checkpoint training job %s on shutdown", j.job_id, exc_info=True)

    def _loop(self) -> None:
        interval = self.settings.training.interval_s
        while not self._stop.is_set():
            try:
                if self.lead.try_lead():  # one process places; the others take over when it dies
                    self.tick()
                    self.lead.publish(self._report(), self._annotations())
            except Exception:  # Ray or Serve restarting: try again next round
                log.warning("harvest round failed", exc_info=True)
            self._wake.wait(interval)
            self._wake.clear()

    def _annotations(self) -> dict[str, dict]:
        """Per job what only the placing controller knows: attained service and queue place."""
        out = self.predictions.annotations({j: m.attained_gpu_s for j, m in self._jobs.items()})  # (+ predictions)
        d = self.last_decision
        for e in d.training_queue if d is not None else ():
            out.setdefault(e.job_id, {}).update(queue_position=e.position, queue_reason=e.reason)
        return out

    def _annotate(self, info: JobInfo) -> JobInfo:
        """A job's status with the leader's annotations (its own, or the ones it published)."""
        extra = dict(
            (self._annotations() if self.lead.leads else self.lead.view().get("jobs", {})).get(info.job_id, {})
        )
        if info.state == "preempted" and self.jobs_api.is_held(info.job_id):
            extra["queue_reason"] = "held"  # preempted by hand: resumed only by hand
        return replace(info, **extra)

    def report(self) -> dict:
        """The placement report: the leader's own, or the one it published last."""
        return self._report() if self.lead.leads else (self.lead.view().get("report") or self._report())

    def _report(self) -> dict:
        d = self.last_decision
        with self._lock:
            reclaims = [r.to_dict() for r in self.reclaims]
        return {
            "policy": self.policy_name,
            "round": self.state.round,
            "round_s": round(self.round_s, 4),
            "gpus": [{"gpu_type": t, "use": u, "count": n} for (t, u), n in sorted(self._usage.items())],
            "reclaims": reclaims,
            "last_decision": None
            if d is None
            else {
                "preempt": [p.job_id for p in d.preempt],
                "start_training": [s.job_id for s in d.start_training],
                "start_replicas": [f"{s.model}/{s.variant}@{s.gpu_id}" for s in d.start_replicas],
                "unplaced": [f"{u.model}/{u.variant}x{u.count}" for u in d.unplaced],
                "training_queue": [
                    {
                        "job_id": e.job_id,
                        "position": e.position,
                        "level": e.level,
                        "action": e.action,
                        "reason": e.reason,
                        "tenant": e.tenant,
                        "gpus": e.gpus,
                    }
                    for e in d.training_queue
                ],
            },
        }

    # ------------------------------------------------------------------ one round
    def tick(self) -> PlacementDecision:
        now = self.clock()
        serve_view, holders = self._observe_serve()
        infos = {j.job_id: j for j in self.manager.list()}
        self._observe_jobs(infos, now)
        snap = self._snapshot(serve_view, holders, infos, now)
        decision, self.state = self._policy(snap, self.config, self.state, now)
        self.last_decision = decision
        self.predictions.after_decision(snap, decision, self.config)
        self._export(snap, infos, now)
        for key, (_dev, target, _running) in serve_view.items():
            if target > holders.get(key, 0):
                self._pending_since.setdefault(key, now)
            else:
                self._pending_since.pop(key, None)
        self._apply(decision, serve_view, holders, now)
        self._track_ready(serve_view, holders)
        self._last_tick = now
        self.round_s = self.clock() - now
        return decision

    def inventory(self) -> tuple[Gpu, ...]:
        mem = self.settings.training.gpu_memory_mib
        types = dict(self.settings.emulated_gpus)
        if not types:
            import ray

            for node in ray.nodes():
                res = node.get("Resources", {}) if node.get("Alive") else {}
                for k in res:
                    if k.startswith("accelerator_type:"):
                        t = k.split(":", 1)[1]
                        types[t] = types.get(t, 0) + int(res.get("GPU", 0))
        return tuple(Gpu(f"{t}:{i}", t, mem) for t, n in sorted(types.items()) for i in range(n))

    def _gpu_models(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(model, variant) -> (Serve app, GPU type) for every model whose replicas take a GPU."""
        out = {}
        apps = self.backend.applications()
        for key, app in apps.items():
            dev = self.backend.device_of(key[0], key[1])  # (a model on several device types: the option's)
            if dev.lower() != "cpu":
                out[key] = (app, dev)
        return out

    def _observe_serve(self) -> tuple[dict, dict]:
        """{(model, variant): (gpu type, target, running)} and {(model, variant): replica actors holding a GPU}."""
        import ray._private.state as ray_state

        models = self._gpu_models()
        # the controller's details as a dict, not serve.status(): that one holds the GIL for 25-45 ms
        details = self.backend.read_serve_details()
        view, holders = {}, {}
        alive = [a["ActorClassName"] for a in ray_state.actors(actor_state_name="ALIVE").values()]
        for key, (app, dev) in models.items():
            states = self.backend.replica_states(app, details)
            view[key] = (dev, sum(states.get(s, 0) for s in TARGET_STATES), states.get("RUNNING", 0))
            holders[key] = sum(1 for c in alive if c.startswith(f"ServeReplica:{app}:"))
        return view, holders

    def _observe_jobs(self, infos: dict[str, JobInfo], now: float) -> None:
        import ray

        for job_id in [j for j in self._jobs if j not in infos and j not in self._preempting]:
            del self._jobs[job_id]  # removed (training.retain_ended_s)
        for job_id in infos:
            if job_id not in self._jobs:
                d = self.manager.dir / job_id / "spec.json"
                self._jobs[job_id] = _Job(
                    TrainingSpec.model_validate_json(d.read_text()),
                    iteration=infos[job_id].iteration,
                    checkpoint_iteration=infos[job_id].checkpoint_iteration,
                    submitted_s=now - max(time.time() - (infos[job_id].submitted_at or time.time()), 0.0),
                    completed=infos[job_id].state == "finished",  # (finished before this gateway started)
                    # service attained under an earlier leader, as it published it
                    attained_gpu_s=float(self.lead.view().get("jobs", {}).get(job_id, {}).get("attained_gpu_s") or 0),
                )
        running = {j: h for j in infos if infos[j].state == "running" and (h := self.manager.handle(j)) is not None}
        refs = {j: h.actor.progress.remote() for j, h in running.items() if hasattr(h, "actor")}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0.2) if refs else ([], [])
        got = {}
        for j, ref in refs.items():
            if ref in ready:
                try:
                    got[j] = ray.get(ref)
                except Exception:
                    pass
        for job_id, info in infos.items():
            mem = self._jobs[job_id]
            p = got.get(job_id) or {"iteration": info.iteration, "checkpoint_iteration": info.checkpoint_iteration}
            it = max(int(p["iteration"]), 0)
            if info.state == "running" and mem.seen_at is not None and it > mem.iteration:
                per = (now - mem.seen_at) / (it - mem.iteration)
                mem.iteration_time_s = per if mem.iteration_time_s is None else 0.7 * mem.iteration_time_s + 0.3 * per
            if it > mem.iteration:  # also the last steps before a preemption, read from status.json
                self.metrics.training_steps.labels(job_id).inc(it - mem.iteration)
                every = mem.spec.checkpoint_every
                new_ck = int(p["checkpoint_iteration"]) // every - mem.checkpoint_iteration // every
                if new_ck > 0:
                    self.metrics.checkpoints.labels("periodic").inc(new_ck)
            self.predictions.observe_round(job_id, info, p, mem, now)  # (before mem moves on)
            mem.iteration, mem.checkpoint_iteration = it, int(p["checkpoint_iteration"])
            if info.state == "finished" and not mem.completed:
                mem.completed = True
                if info.submitted_at is not None and info.finished_at is not None:
                    jct = max(info.finished_at - info.submitted_at, 0.0)
                    self.metrics.training_jct.labels(mem.spec.gpu_type.lower()).observe(jct)
            mem.seen_at = now if info.state == "running" else None
            if info.state != "running" and job_id not in self._preempting:
                mem.gpu_ids, mem.started_s = (), None

    def _snapshot(self, serve_view, holders, infos, now) -> PlacementSnapshot:
        gpus = self.inventory()
        by_type: dict[str, list[str]] = {}
        for g in gpus:
            by_type.setdefault(g.gpu_type, []).append(g.gpu_id)
        taken: set[str] = {
            g
            for j in self._jobs.values()
            if infos.get(j.spec.job_id, None) is not None and infos[j.spec.job_id].state == "running"
            for g in j.gpu_ids
        }
        jobs = []
        for job_id, info in infos.items():
            mem = self._jobs[job_id]
            if info.state not in ("queued", "preempted", "running"):
                continue
            if info.state != "running" and (not self.settings.training.auto_fill or self.jobs_api.is_held(job_id)):
                continue  # held by hand, or auto-fill off: placement does not start it
            if info.state == "running" and not mem.gpu_ids:  # started by hand: book free GPUs of its type
                free = [g for g in by_type.get(mem.spec.gpu_type, []) if g not in taken]
                mem.gpu_ids = tuple(free[: info.workers or mem.spec.num_gpus])
                mem.started_s = now
                taken.update(mem.gpu_ids)
            s = mem.spec
            it_s = mem.iteration_time_s or s.iteration_time_s or 0.01
            if info.state == "running" and self._last_tick is not None:
                mem.attained_gpu_s += (now - self._last_tick) * max(len(mem.gpu_ids), 1)
            jobs.append(
                TrainingJob(
                    job_id,
                    s.num_gpus,
                    self.settings.training.gpu_memory_mib,
                    it_s,
                    iterations_done=mem.iteration,
                    checkpoint_iteration=mem.checkpoint_iteration,
                    checkpoint_interval_iterations=s.checkpoint_every,
                    checkpoint_write_s=0.05,
                    total_iterations=s.total_iterations,
                    attained_gpu_s=mem.attained_gpu_s,
                    submit_time_s=mem.submitted_s,
                    gpu_type=s.gpu_type,
                    gpu_ids=mem.gpu_ids if info.state == "running" else (),
                    started_s=mem.started_s,
                    preempting=job_id in self._preempting,
                    tenant=s.tenant or "default",
                    min_gpus=s.min_workers,
                    perf=self.predictions.perf_for(s),
                )
            )
        replicas, targets = [], []
        per_gpu = self.config.max_replicas_per_gpu
        for (model, variant), (dev, target, _running) in serve_view.items():
            targets.append(ReplicaTarget(model, variant, dev, target, self.replica_memory_mib))
            slots = [g for g in by_type.get(dev, []) if g not in taken for _ in range(per_gpu)]
            for i in range(min(holders.get((model, variant), 0), len(slots))):
                replicas.append(Replica(f"{model}/{variant}#{i}", model, variant, slots[i], self.replica_memory_mib))
            taken.update(slots[: holders.get((model, variant), 0)])
        return PlacementSnapshot(
            gpus=gpus,
            targets=tuple(targets),
            replicas=tuple(replicas),
            jobs=tuple(jobs),
            replica_throughput_rps=self._throughputs(serve_view, by_type),
        )

    def _throughputs(self, serve_view, by_type) -> dict:
        """Gavel's table for the served (model, variant or option) on every GPU type, from the
        repository's profiles (cached per set of keys): placement ranks types by requests/s per cost."""
        keys = tuple(sorted(serve_view))
        types = tuple(sorted(by_type))
        if self._tput_for != (keys, types):
            from sloserve.autoscaler.placement.cost import throughputs_from_profile
            from sloserve.batching.profile import ProfileTable

            table = ProfileTable.load(self.backend.repo.root)
            overrides = self.settings.models
            slo = {
                m: ((o.slo_ms if (o := overrides.get(m)) is not None and o.slo_ms else lm.config.slo_ms) / 1e3)
                for m, lm in self.backend.models.items()
            }
            tput = throughputs_from_profile(
                table, [k for k in keys if k[0] in slo], types, slo, device_type_of={t: t.lower() for t in types}
            )
            # only rows with a profile on every type: a missing one would read as 1 request/s beside
            # measured hundreds, and substitution would trade one replica for hundreds (or none)
            self._tput = {
                (m, k, t): tput[(m, k, t)] for m, k in keys if all((m, k, u) in tput for u in types) for t in types
            }
            self._tput_for = (keys, types)
        return self._tput

    # ------------------------------------------------------------------ carrying out a decision
    def _apply(self, decision: PlacementDecision, serve_view, holders, now: float) -> None:
        waiting = {s.after_preempt: s for s in decision.start_replicas if s.after_preempt}
        for p in decision.preempt:
            if p.job_id in self._preempting:
                continue
            mem = self._jobs[p.job_id]
            s = waiting.get(p.job_id)
            key = (s.model, s.variant) if s else None
            rec = Reclaim(
                p.job_id,
                mem.spec.gpu_type,
                s.model if s else None,
                s.variant if s else None,
                now,
                iteration_at_request=mem.iteration,
                waited_s=now - self._pending_since.get(key, now) if key is not None else 0.0,
                _baseline_running=serve_view.get(key, (None, 0, 0))[2] if s else 0,
                _baseline_holders=holders.get(key, 0) if s else 0,
            )
            with self._lock:
                self._preempting[p.job_id] = rec
                self.reclaims.append(rec)
            self.metrics.preemptions.labels(mem.spec.gpu_type.lower(), p.reason).inc()
            self._pool.submit(self._preempt, rec, p.grace_s)
        if not self.settings.training.auto_fill or not decision.start_training:
            return
        import ray

        free_gpus = ray.available_resources().get("GPU", 0.0)
        for st in decision.start_training:
            job = self._jobs[st.job_id]
            n = len(st.gpu_ids)
            if st.job_id in self._starting or free_gpus + 1e-6 < n:
                continue  # the GPU is still held (a replica stopping): next round
            free_gpus -= n
            job.gpu_ids, job.started_s = st.gpu_ids, now
            self._starting.add(st.job_id)
            self._pool.submit(self._start, st.job_id, n, st.reason)

    def _start(self, job_id: str, workers: int | None = None, reason: str = "idle-gpus") -> None:
        span = tracing.start_operation(  # (None while tracing is off: sloserve/replica/tracing.py)
            "sloserve.training",
            "sloserve.training.resume" if reason == "resume" else "sloserve.training.place",
            {
                "sloserve.training.job": job_id,
                "sloserve.training.reason": reason,
                "sloserve.training.gpus": self._gpus(job_id),
            },
        )
        try:
            self.manager.start(job_id, workers)
        except Exception as e:
            tracing.end_span(span, f"{type(e).__name__}: {e!s:.200}")
            span = None
            log.warning("could not start training job %s", job_id, exc_info=True)
        finally:
            tracing.end_span(span)
            self._starting.discard(job_id)
            self._wake.set()

    def _preempt(self, rec: Reclaim, grace_s: float) -> None:
        import ray._private.state as ray_state

        h = self.manager.handle(rec.job_id)
        actor_id = h.actor._actor_id.hex() if h is not None and hasattr(h, "actor") else None
        span = tracing.start_operation(
            "sloserve.training",
            "sloserve.training.preempt",
            {
                "sloserve.training.job": rec.job_id,
                "sloserve.training.gpus": self._gpus(rec.job_id),
                "sloserve.training.for": f"{rec.model}/{rec.variant}" if rec.model else "",
            },
        )
        try:
            info = self.manager.preempt(rec.job_id, grace_s)
            rec.stopped_s = self.clock() - rec.decided_at
            rec.outcome = self.manager.last_stop(rec.job_id)
            deadline = self.clock() + 10.0
            while actor_id is not None and self.clock() < deadline:
                if ray_state.actors(actor_id=actor_id).get("State") in (None, "DEAD"):
                    break
                time.sleep(0.005)
            rec.freed_s = self.clock() - rec.decided_at
            self.metrics.training_reclaim.labels(rec.gpu_type.lower()).observe(rec.freed_s)
            rec.checkpoint_iteration = info.checkpoint_iteration
            done = max(self._jobs[rec.job_id].iteration, info.iteration, rec.iteration_at_request)
            rec.lost_iterations = max(done - info.checkpoint_iteration, 0)
            mem = self._jobs[rec.job_id]
            gang = max(len(mem.gpu_ids), 1)
            lost_s = rec.lost_iterations * (mem.iteration_time_s or 0.0) * gang
            if rec.outcome == "killed":
                lost_s += grace_s * gang
            else:
                self.metrics.checkpoints.labels("preemption").inc()
            self.metrics.training_lost_seconds.labels(rec.gpu_type.lower()).inc(lost_s)
            log.info(
                "reclaimed %s for %s/%s: %s, GPU free after %.3f s",
                rec.job_id,
                rec.model,
                rec.variant,
                rec.outcome,
                rec.freed_s,
            )
        except Exception as e:
            tracing.end_span(span, f"{type(e).__name__}: {e!s:.200}")
            span = None
            log.warning("preempting %s failed", rec.job_id, exc_info=True)
        finally:
            tracing.end_span(span, attributes={"sloserve.training.outcome": rec.outcome or ""})
            with self._lock:
                self._preempting.pop(rec.job_id, None)
            self._wake.set()

    def _gpus(self, job_id: str) -> list[str]:
        job = self._jobs.get(job_id)
        return [str(g) for g in job.gpu_ids] if job is not None else []

    def _track_ready(self, serve_view, holders) -> None:
        now = self.clock()
        with self._lock:
            pending = [r for r in self.reclaims if r.ready_s is None and r.model is not None]
        for r in pending:
            if r.granted_s is None and holders.get((r.model, r.variant), 0) > r._baseline_holders:
                r.granted_s = now - r.decided_at
            running = serve_view.get((r.model, r.variant), (None, 0, 0))[2]
            if running > r._baseline_running:
                r.ready_s = now - r.decided_at
                self.metrics.replica_start.labels(r.model, r.gpu_type.lower()).observe(r.ready_s)

    def _export(self, snap: PlacementSnapshot, infos: dict[str, JobInfo], now: float) -> None:
        self._usage = gpu_usage(snap)
        for (t, use), n in self._usage.items():
            self.metrics.gpus.labels(t.lower(), use).set(n)
        counts = dict.fromkeys(JOB_STATES, 0)
        for job_id, info in infos.items():
            state = "checkpointing" if job_id in self._preempting else info.state
            counts[state] = counts.get(state, 0) + 1
        for state, n in counts.items():
            self.metrics.training_jobs.labels(state).set(n)
        if self._last_tick is not None:
            dt = now - self._last_tick
            for j in snap.jobs:
                if j.running:
                    self.metrics.training_gpu_seconds.labels((j.gpu_type or "").lower()).inc(dt * j.num_gpus)
