"""Prometheus metrics of placement and training (not wired into the gateway yet).

Created on a registry the caller passes, so tests, the simulator and the gateway each own theirs.
``gpu_usage`` is pure and also what the simulator integrates into GPU-hours by use.

Catalogue:

================================================  =======  ===========================================
``sloserve_gpus{gpu_type,use}``                   gauge    GPUs by use: inference, training, shared
                                                           (replica beside training), idle
``sloserve_training_preemptions_total``           counter  preemptions by policy, reason, outcome
``{policy,reason,outcome}``                                (planned | checkpointed | killed)
``sloserve_training_lost_work_gpu_seconds_total`` counter  work to redo after preemptions
``sloserve_training_reclaim_seconds``             hist.    preemption decision -> GPU freed
``sloserve_training_iterations{job}``             gauge    iterations done
``sloserve_training_checkpoint_iteration{job}``   gauge    iteration of the latest checkpoint
``sloserve_training_jobs{state}``                 gauge    jobs by state (queued, running, ...)
``sloserve_placement_unplaced_replicas{model}``   gauge    replicas the last decision could not place
================================================  =======  ===========================================
"""

from __future__ import annotations

from collections import Counter as _Counter
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from autoscaler.placement_types import PlacementDecision, PlacementSnapshot

USES = ("inference", "training", "shared", "idle")
RECLAIM_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0, 30.0)


def gpu_usage(snapshot: PlacementSnapshot) -> dict[tuple[str, str], int]:
    """{(gpu_type, use): count} for every type and use (zeros included)."""
    with_replica = {r.gpu_id for r in snapshot.replicas}
    with_job = {g for j in snapshot.jobs for g in j.gpu_ids}
    out = {(g.gpu_type, u): 0 for g in snapshot.gpus for u in USES}
    for g in snapshot.gpus:
        r, j = g.gpu_id in with_replica, g.gpu_id in with_job
        use = "shared" if (r and j) else "inference" if r else "training" if j else "idle"
        out[(g.gpu_type, use)] += 1
    return out


class PlacementMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.gpus = Gauge("sloserve_gpus", "GPUs by type and use (inference, training, shared, idle).",
                          ["gpu_type", "use"], registry=r)
        self.preemptions = Counter("sloserve_training_preemptions", "Training-job preemptions.",
                                   ["policy", "reason", "outcome"], registry=r)
        self.lost_work = Counter("sloserve_training_lost_work_gpu_seconds",
                                 "GPU-seconds of training work to redo after preemptions.", ["policy"], registry=r)
        self.reclaim = Histogram("sloserve_training_reclaim_seconds",
                                 "Time from a preemption decision to the GPU being free.",
                                 buckets=RECLAIM_BUCKETS, registry=r)
        self.iterations = Gauge("sloserve_training_iterations", "Iterations a training job has done.", ["job"],
                                registry=r)
        self.checkpoint_iteration = Gauge("sloserve_training_checkpoint_iteration",
                                          "Iteration of a training job's latest checkpoint.", ["job"], registry=r)
        self.jobs = Gauge("sloserve_training_jobs", "Training jobs by state.", ["state"], registry=r)
        self.unplaced = Gauge("sloserve_placement_unplaced_replicas",
                              "Replicas the last placement decision could not place.", ["model"], registry=r)
        self._models_seen: set[str] = set()

    def observe_snapshot(self, snapshot: PlacementSnapshot) -> None:
        for (t, use), n in gpu_usage(snapshot).items():
            self.gpus.labels(t, use).set(n)
        for j in snapshot.jobs:
            self.iterations.labels(j.job_id).set(j.iterations_done)
            self.checkpoint_iteration.labels(j.job_id).set(j.checkpoint_iteration)

    def observe_decision(self, decision: PlacementDecision) -> None:
        for p in decision.preempt:
            self.preemptions.labels(decision.policy, p.reason, "planned").inc()
            self.lost_work.labels(decision.policy).inc(p.cost.lost_gpu_s)
        per_model = _Counter()
        for u in decision.unplaced:
            per_model[u.model] += u.count
        self._models_seen |= set(per_model)
        for m in self._models_seen:
            self.unplaced.labels(m).set(per_model.get(m, 0))

    def observe_preemption(self, policy: str, reason: str, outcome: str, reclaim_s: float) -> None:
        """What a live driver measured: checkpointed or killed, and how long the GPU took to free."""
        self.preemptions.labels(policy, reason, outcome).inc()
        self.reclaim.observe(reclaim_s)

    def observe_jobs(self, states: Iterable[str]) -> None:
        c = _Counter(states)
        for s in ("queued", "running", "preempted", "finished", "cancelled", "failed"):
            self.jobs.labels(s).set(c.get(s, 0))
