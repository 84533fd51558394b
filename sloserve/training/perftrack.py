"""What the live controller learns of each training job: its measured iteration times and losses.

The job reports them through its session (``session.should_stop(iteration=..., loss=...)`` a few
times a second, ``session.save(..., eval_loss=...)`` at each checkpoint); the controller turns the
progress it reads each round into measurements here: one iteration time per round the job ran
(seconds over iterations since the last round, on its current GPU type and gang) and one loss
point per new checkpoint (its ``eval_loss``, else the last reported ``loss``). :meth:`perf` gives
the predictive queue (``sloserve/autoscaler/placement/predictive.py``) the job's
``JobPerf``; the fit itself is the pure ``perfmodel``'s, the same code the simulator runs.

>>> t = PerfTracker()
>>> for k in range(1, 9):
...     t.observe("j", "T4", 1, iteration_s=0.1, loss_point=(50 * k, 1 / (0.01 * 50 * k + 1) + 0.1))
>>> p = t.perf("j", "resnet50", target_loss=0.2)
>>> len(p.iterations), len(p.losses), p.iterations[0]
(8, 8, ('T4', 1, 0.1))
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

from sloserve.autoscaler.placement.perfmodel import JobPerf, Prediction

MAX_ITERATION_SAMPLES = 32
MAX_LOSS_POINTS = 48


@dataclass
class _Seen:
    iterations: list[tuple[str, int, float]] = field(default_factory=list)
    losses: list[tuple[float, float]] = field(default_factory=list)
    slo: bool | None = None  # the admission's answer for a job with a deadline
    admission: str | None = None  # why: admitted, over-capacity, unpredictable
    deadline_at: float | None = None  # absolute, in the controller's clock


class PerfTracker:
    """Measurements per job, thinned to bounded lists (recent iteration times; loss points thinned
    towards the start, so a long job keeps its whole curve's shape)."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Seen] = {}

    def _get(self, job_id: str) -> _Seen:
        return self._jobs.setdefault(job_id, _Seen())

    def observe(
        self,
        job_id: str,
        gpu_type: str,
        workers: int,
        iteration_s: float | None = None,
        loss_point: tuple[float, float] | None = None,
    ) -> None:
        s = self._get(job_id)
        if iteration_s is not None and iteration_s > 0 and math.isfinite(iteration_s):
            s.iterations.append((gpu_type, max(int(workers), 1), float(iteration_s)))
            del s.iterations[:-MAX_ITERATION_SAMPLES]
        if loss_point is not None:
            k, v = float(loss_point[0]), float(loss_point[1])
            if not (v > 0 and math.isfinite(v)) or (s.losses and k == s.losses[-1][0]):
                return
            if s.losses and k < s.losses[-1][0]:  # resumed from an earlier checkpoint: forget the lost part
                s.losses = [q for q in s.losses if q[0] < k]
            s.losses.append((k, v))
            if len(s.losses) > MAX_LOSS_POINTS:  # drop every other point of the older half
                half = len(s.losses) // 2
                s.losses = s.losses[:half:2] + s.losses[half:]

    def admit(self, job_id: str, slo: bool, reason: str, deadline_at: float | None) -> None:
        s = self._get(job_id)
        s.slo, s.admission, s.deadline_at = slo, reason, deadline_at

    def admission(self, job_id: str) -> tuple[bool | None, str | None]:
        s = self._jobs.get(job_id)
        return (None, None) if s is None else (s.slo, s.admission)

    def forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)

    def perf(
        self,
        job_id: str,
        model_class: str,
        *,
        target_loss: float | None = None,
        max_iterations: int | None = None,
        min_workers: int | None = None,
        max_workers: int | None = None,
    ) -> JobPerf:
        s = self._get(job_id)
        return JobPerf(
            model_class,
            target_loss=target_loss,
            max_iterations=max_iterations,
            iterations=tuple(s.iterations),
            losses=tuple(s.losses),
            deadline_s=s.deadline_at,
            slo=s.slo,
            min_workers=min_workers,
            max_workers=max_workers,
        )


def describe(p: Prediction | None, order_class: str | None, slo: bool | None, admission: str | None) -> dict:
    """A job's prediction as its status shows it (``sloserve train list``, the HTTP API)."""
    out: dict = {"order": order_class, "slo": slo, "admission": admission}
    if p is None:
        return {**out, "predictable": False, "reason": "no-model"}

    def r(x: float | None, n: int = 4) -> float | None:
        return None if x is None else round(x, n)

    return {
        **out,
        "predictable": p.predictable,
        "reason": p.reason,
        "remaining_s": r(p.remaining_s, 1),
        "remaining_iterations": r(p.remaining_iterations, 0),
        "iteration_s": r(p.iteration_s, 5),
        "iteration_error": r(p.iteration_error),
        "loss_error": r(p.loss_error),
    }


class LivePredictions:
    """The live controller's side of the predictive queue: measurements in, ``JobPerf`` out, the
    deadline admission at submit, each job's prediction for its status, and the metrics
    (``sloserve_training_predictable{job}``, ``sloserve_training_predicted_remaining_seconds{job}``,
    ``sloserve_training_prediction_error{job,model}``)."""

    def __init__(self, metrics=None, clock=None) -> None:
        import threading
        import time

        self.tracker = PerfTracker()
        self.clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._snap_jobs: tuple = ()
        self._capacity: dict[str, int] = {}
        self._shown: dict[str, dict] = {}
        self._gauges = _gauges(getattr(metrics, "registry", None))
        self.config: Any = None  # the controller's PlacementConfig, as of its last round
        self._seen: set[str] = set()  # jobs observed since the last decision

    # ------------------------------------------------------------ measurements
    def observe(self, job_id: str, gpu_type: str, workers: int, iteration_s: float) -> None:
        with self._lock:
            self.tracker.observe(job_id, gpu_type, workers, iteration_s=iteration_s)

    def observe_checkpoint(self, job_id: str, gpu_type: str, workers: int, progress: dict, before: int) -> None:
        """A new checkpoint since ``before``: its loss is a point of the job's curve."""
        ck = int(progress.get("checkpoint_iteration") or 0)
        loss = progress.get("eval_loss", progress.get("loss"))
        if ck != before and ck > 0 and loss is not None:
            with self._lock:
                self.tracker.observe(job_id, gpu_type, workers, loss_point=(ck, float(loss)))

    def observe_round(self, job_id: str, info, progress: dict, mem, now: float) -> None:
        """One controller round's view of a job (its ``JobInfo``, its driver's progress, what the
        controller remembers of it): the seconds per iteration since the last round, and the loss
        of a new checkpoint. Jobs no round has seen since the last decision are forgotten then."""
        workers = info.workers or info.num_gpus or 1
        it = max(int(progress.get("iteration") or 0), 0)
        if info.state == "running" and mem.seen_at is not None and it > mem.iteration:
            self.observe(job_id, info.gpu_type, workers, (now - mem.seen_at) / (it - mem.iteration))
        self.observe_checkpoint(job_id, info.gpu_type, workers, progress, mem.checkpoint_iteration)
        self._seen.add(job_id)

    def forget(self, job_id: str) -> None:
        with self._lock:
            self.tracker.forget(job_id)
            self._shown.pop(job_id, None)

    def perf_for(self, spec) -> JobPerf | None:
        if spec.model_class is None:
            return None
        with self._lock:
            return self.tracker.perf(
                spec.job_id,
                spec.model_class,
                target_loss=spec.target_loss,
                max_iterations=spec.total_iterations,
                min_workers=(spec.min_workers or spec.workers) if spec.max_workers is not None else None,
                max_workers=spec.max_workers,
            )

    # ------------------------------------------------------------ admission at submit
    def admit(self, spec, config=None) -> None:
        """A job with a deadline: SLO-bound if the model says it can make it beside the SLO-bound jobs
        already admitted; best-effort if not (its status says why); ``JobRejected`` naming
        ``deadline_s`` when it cannot make it even alone."""
        from sloserve.autoscaler.placement.predictive import admit
        from sloserve.autoscaler.placement.types import TrainingJob
        from sloserve.training.job import JobRejected

        if spec.deadline_s is None or spec.model_class is None:
            return
        if config is None:
            config = self.config or _default_config()
        now = self.clock()
        with self._lock:
            self.tracker.admit(spec.job_id, False, "pending", now + spec.deadline_s)
            jobs, cap = self._snap_jobs, dict(self._capacity)
        perf = self.perf_for(spec)
        view = TrainingJob(spec.job_id, spec.workers, spec.memory_mib, spec.iteration_time_s or 1.0, perf=perf)
        a = admit(
            view,
            [j for j in jobs if j.perf is not None and j.perf.slo],
            cap or {spec.gpu_type: spec.workers},
            config,
            now,
        )
        if a.reason == "impossible":
            self.forget(spec.job_id)
            raise JobRejected(
                f"deadline_s: {spec.deadline_s:g} s cannot be met: alone, on its best GPUs, the model predicts "
                f"{a.alone_s:.0f} s for its {spec.total_iterations} iterations"
            )
        with self._lock:
            self.tracker.admit(spec.job_id, a.slo, a.reason, now + spec.deadline_s)

    # ------------------------------------------------------------ after each round
    def after_decision(self, snap, decision, config) -> None:
        from sloserve.autoscaler.placement.predictive import job_prediction, job_speeds

        self.config = config
        with self._lock:
            for gone in set(self.tracker._jobs) - self._seen - {j.job_id for j in snap.jobs}:
                if self._seen:  # (a round that observed nothing, e.g. a test's, forgets nothing)
                    self.tracker.forget(gone)
            self._seen = set()
        gpu_type = {g.gpu_id: g.gpu_type for g in snap.gpus}
        types = sorted(set(gpu_type.values()))
        with_replica = {r.gpu_id for r in snap.replicas}
        cap: dict[str, int] = {}
        for g in snap.gpus:
            if g.gpu_id not in with_replica:
                cap[g.gpu_type] = cap.get(g.gpu_type, 0) + 1
        order = {e.job_id: e.order_class or None for e in decision.training_queue}
        shown: dict[str, dict] = {}
        for j in snap.jobs:
            if j.perf is None:
                continue
            t = gpu_type.get(j.gpu_ids[0], "") if j.gpu_ids else (j.gpu_type or "")
            if not t and types:  # any type: its fastest
                sp = job_speeds(j, types)
                t = max(types, key=lambda x: (sp[x], x))
            p = job_prediction(j, t, j.gang, config)
            with self._lock:
                slo, why = self.tracker.admission(j.job_id)
            shown[j.job_id] = describe(p, order.get(j.job_id), slo, why)
            if self._gauges is not None:
                g_pred, g_rem, g_err = self._gauges
                g_pred.labels(j.job_id).set(1 if p is not None and p.predictable else 0)
                if p is not None and p.remaining_s is not None:
                    g_rem.labels(j.job_id).set(p.remaining_s)
                for name, err in (("iteration", p and p.iteration_error), ("loss", p and p.loss_error)):
                    if err is not None:
                        g_err.labels(j.job_id, name).set(err)
        with self._lock:
            self._snap_jobs, self._capacity, self._shown = snap.jobs, cap, shown

    def annotations(self, attained: dict[str, float] | None = None) -> dict[str, dict]:
        """Per job its ``prediction`` (modeled jobs), with ``attained_gpu_s`` from ``attained``."""
        out: dict[str, dict] = {j: {"attained_gpu_s": round(a, 3)} for j, a in (attained or {}).items()}
        with self._lock:
            for j, d in self._shown.items():
                out.setdefault(j, {})["prediction"] = d
        return out


def _default_config():
    from sloserve.autoscaler.placement.types import PlacementConfig

    return PlacementConfig(training_queue="predictive")


_GAUGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _gauges(registry):
    """The prediction gauges on ``registry`` (one set per registry; None without one)."""
    if registry is None:
        return None
    got = _GAUGES.get(registry)
    if got is None:
        from prometheus_client import Gauge

        got = (
            Gauge(
                "sloserve_training_predictable",
                "1 when the job's performance model is trusted (held-out "
                "error under the threshold; the predictive queue orders it by predicted remaining time), else 0.",
                ["job"],
                registry=registry,
            ),
            Gauge(
                "sloserve_training_predicted_remaining_seconds",
                "The model's remaining time of the job on its current (or best) GPUs.",
                ["job"],
                registry=registry,
            ),
            Gauge(
                "sloserve_training_prediction_error",
                "Held-out relative error of the job's iteration-time and convergence models.",
                ["job", "model"],
                registry=registry,
            ),
        )
        _GAUGES[registry] = got
    return got
