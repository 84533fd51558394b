"""Modeled training jobs for the harvest simulation: model classes, loss curves, deadlines, widths.

:class:`ModeledHarvest` is :class:`sloserve.sim.harvest.HarvestPlacement` on a richer job world,
drawn per job from the distributions of :class:`JobModelConfig` (seeded; the same for every
queue compared):

* **model class**: drawn by ``class_weights`` from the classes of
  ``sloserve.autoscaler.placement.perfmodel`` (Gavel's measured per-type throughputs and scaling);
  the job's true speed on each GPU generation is its class's times a per-job log-normal factor
  (``speed_spread``), so the class prior is close but not exact.
* **work**: the trace's duration is the job's run time on its requested gang on
  ``reference_type``; on another type or width it runs at the true speed ratio. Its iteration
  time on the reference is the harvest config's log-uniform draw; ``K`` = duration / that.
* **convergence**: Optimus' curve ``1/(b0 k + b1) + b2`` with ``b2`` ~ U(``asymptote``), the start
  loss ~ U(``start_loss``) and the target a fraction ~ log-U(``target_gap``) of the way from the
  asymptote to the start, ``b0`` set so the target is reached at iteration ``K`` (the job stops
  there). A ``diverging_fraction`` of jobs has an asymptote above the target (its curve never
  gets there; the user's hidden budget ``K`` stops it), a ``noisy_fraction`` reports losses and
  iteration times with large noise; the others with small noise.
* **deadline**: a ``deadline_fraction`` of the window's jobs has one, ``submit + U(deadline_slack)
  x`` its duration alone on its requested gang; those declare their iteration budget ``K``
  (Chronus' jobs declare their length) and no target loss.
* **width**: an ``elastic_fraction`` of jobs runs on any width in [max(1, n/2), min(2n, max_gpus)].

The job reports a loss point and an iteration time at iterations ``10 * report_growth^i`` (what
it has run up to now; never its ``K`` or its true speeds). The SRTF oracle is told ``K``
(``HarvestConfig.known_durations``); the predictive queue only sees the reports.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sloserve.autoscaler.placement.fairness import isolated_completion_s, tenant_rho
from sloserve.autoscaler.placement.perfmodel import GPU_GENERATION, MODEL_CLASSES, JobPerf, speedup
from sloserve.autoscaler.placement.predictive import admit, job_prediction
from sloserve.autoscaler.placement.types import PlacementConfig, TrainingJob
from sloserve.sim.harvest import HarvestConfig, HarvestPlacement, _Job
from sloserve.sim.training_trace import JobSpec, checkpoint_interval_iterations


class JobModelConfig(BaseModel):
    """Distributions the modeled jobs are drawn from (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    class_weights: dict[str, float] = Field(
        default_factory=lambda: {
            "resnet50": 0.2,
            "resnet18": 0.15,
            "transformer": 0.2,
            "lm": 0.15,
            "recommendation": 0.1,
            "a3c": 0.1,
            "cyclegan": 0.1,
        }
    )
    reference_type: str = "t4"
    speed_spread: float = Field(default=0.15, ge=0, description="Log-normal sigma of a job's speed around its class's.")
    asymptote: tuple[float, float] = (0.05, 0.5)
    start_loss: tuple[float, float] = (2.0, 5.0)
    target_gap: tuple[float, float] = (0.03, 0.3)
    loss_noise: tuple[float, float] = (0.002, 0.01)
    iteration_noise: float = 0.03
    noisy_fraction: float = 0.1
    noisy_loss_noise: float = 0.3
    noisy_iteration_noise: float = 0.5
    diverging_fraction: float = 0.1
    deadline_fraction: float = 0.2
    deadline_slack: tuple[float, float] = (1.5, 4.0)
    elastic_fraction: float = 0.5
    report_growth: float = 1.15


@dataclass
class _Truth:
    model_class: str
    speed: dict[str, float]  # true relative speed per generation
    sigma: float
    base_s: float  # seconds per iteration, one worker, speed 1
    total_iterations: int
    ref_iter_s: float  # seconds per iteration on the requested gang on the reference type
    kind: str  # normal, noisy, diverging
    report_k: np.ndarray  # iterations at which it reports
    report_loss: np.ndarray
    iter_noise: np.ndarray
    target_loss: float | None
    deadline_s: float | None
    lo: int
    hi: int
    elastic: bool

    def iteration_s(self, gpu_type: str, w: int) -> float:
        return self.base_s / (self.speed[GPU_GENERATION[gpu_type.lower()]] * speedup(max(w, 1), self.sigma))


@dataclass
class _MJob(_Job):
    truth: _Truth | None = None
    segments: list[tuple[float, str, int]] = field(default_factory=list)  # (iteration, type, width) of each run
    obs_n: int = -1
    obs: tuple[tuple, tuple] = ((), ())
    slo: bool | None = None
    admitted_finish_s: float | None = None


def draw_truths(specs: list[JobSpec], hcfg: HarvestConfig, mcfg: JobModelConfig, max_gpus: int) -> list[_Truth]:
    rng = np.random.default_rng([hcfg.seed, 7])
    names = sorted(mcfg.class_weights)
    wts = np.array([mcfg.class_weights[n] for n in names], dtype=float)
    wts /= wts.sum()
    lo_it, hi_it = hcfg.iteration_time_s
    out = []
    for s in specs:
        cls = names[int(rng.choice(len(names), p=wts))]
        prior = MODEL_CLASSES[cls]
        speed = {g: v * float(np.exp(rng.normal(0.0, mcfg.speed_spread))) for g, v in prior.speed.items()}
        sigma = prior.sigma
        ref_it = float(np.exp(rng.uniform(math.log(lo_it), math.log(hi_it))))
        gen = GPU_GENERATION[mcfg.reference_type]
        base = ref_it * speed[gen] * speedup(s.num_gpus, sigma)
        total = max(1, math.ceil(s.work_s / ref_it))
        u = rng.uniform()
        kind = (
            "noisy"
            if u < mcfg.noisy_fraction
            else "diverging"
            if u < mcfg.noisy_fraction + mcfg.diverging_fraction
            else "normal"
        )
        deadline = None
        if s.job_id.startswith("j") and rng.uniform() < mcfg.deadline_fraction:
            deadline = s.submit_s + float(rng.uniform(*mcfg.deadline_slack)) * s.work_s
        b2 = float(rng.uniform(*mcfg.asymptote))
        l0 = float(rng.uniform(*mcfg.start_loss))
        gap = float(np.exp(rng.uniform(*np.log(mcfg.target_gap))))
        target = b2 + gap * (l0 - b2)
        b1 = 1.0 / (l0 - b2)
        b0 = (1.0 / (target - b2) - b1) / total
        if kind == "diverging":  # the curve levels off above the target
            b2 = target + 0.5 * (l0 - target)
            b1 = 1.0 / (l0 - b2)
        n_rep = int(math.log(max(total, 10) / 10.0) / math.log(mcfg.report_growth)) + 2
        ks = np.unique(np.minimum(np.ceil(10.0 * mcfg.report_growth ** np.arange(n_rep)), total)).astype(float)
        ln = mcfg.noisy_loss_noise if kind == "noisy" else float(rng.uniform(*mcfg.loss_noise))
        loss = (1.0 / (b0 * ks + b1) + b2) * (1.0 + ln * rng.standard_normal(len(ks)))
        loss = np.maximum(loss, 1e-3)
        itn = mcfg.noisy_iteration_noise if kind == "noisy" else mcfg.iteration_noise
        inoise = np.exp(itn * rng.standard_normal(len(ks)))
        elastic = rng.uniform() < mcfg.elastic_fraction
        lo, hi = (max(1, s.num_gpus // 2), min(2 * s.num_gpus, max_gpus)) if elastic else (s.num_gpus, s.num_gpus)
        out.append(
            _Truth(
                cls,
                speed,
                sigma,
                base,
                total,
                ref_it,
                kind,
                ks,
                loss,
                inoise,
                None if deadline is not None else target,
                deadline,
                lo,
                hi,
                elastic,
            )
        )
    return out


class ModeledHarvest(HarvestPlacement):
    """The harvest hook on modeled jobs (see the module doc)."""

    def __init__(
        self,
        policy: str,
        jobs: list[JobSpec],
        model_types: Mapping[str, str],
        config: HarvestConfig | None = None,
        placement_config: PlacementConfig | None = None,
        models: JobModelConfig | None = None,
    ):
        super().__init__(policy, jobs, model_types, config, placement_config)
        self.mcfg = models or JobModelConfig()
        specs = [] if policy == "none" else list(jobs)
        truths = draw_truths(specs, self.cfg, self.mcfg, max(self.cfg.gpus.values()))
        self.arrivals = []
        for s, tr in zip(specs, truths, strict=True):
            self.arrivals.append(
                _MJob(
                    s,
                    tr.ref_iter_s,
                    checkpoint_interval_iterations(tr.ref_iter_s, self.cfg.checkpoint_every_s),
                    self.cfg.checkpoint_write_s,
                    attained_gpu_s=s.attained_gpu_s,
                    truth=tr,
                )
            )
        self.arrivals.sort(key=lambda j: (j.spec.submit_s, j.spec.job_id))
        self.pred_errors: list[float] = []
        self.predictable_samples = [0, 0]  # (predictable, all) running-job samples
        self._training_capacity: dict[str, int] = dict(self.cfg.gpus)
        self._oracle = self.cfg.known_durations and self.pcfg.training_queue != "predictive"

    # ------------------------------------------------------------ what the policy sees
    def _observations(self, j: _MJob, done_iters: float) -> tuple[tuple, tuple]:
        tr = j.truth
        assert tr is not None
        n = bisect.bisect_right(tr.report_k, done_iters)
        if n == j.obs_n:
            return j.obs
        losses, iters = [], []
        seg_k = [s[0] for s in j.segments]
        for i in range(n):
            k = float(tr.report_k[i])
            losses.append((k, float(tr.report_loss[i])))
            si = bisect.bisect_right(seg_k, k) - 1
            if si >= 0:
                _, g, w = j.segments[si]
                iters.append((g, w, tr.iteration_s(g, w) * float(tr.iter_noise[i])))
        j.obs_n, j.obs = n, (tuple(losses), tuple(iters))
        return j.obs

    def _job_view(self, j: _Job, now_s: float) -> TrainingJob:
        assert isinstance(j, _MJob) and j.truth is not None
        tr = j.truth
        done, ckpt = j.progress(now_s)
        held = (now_s - j.s0) * len(j.gpu_ids) if j.s0 is not None else 0.0
        done_it = done / tr.ref_iter_s
        losses, iters = self._observations(j, done_it)
        perf = JobPerf(
            tr.model_class,
            target_loss=tr.target_loss,
            max_iterations=tr.total_iterations if tr.deadline_s is not None else None,
            iterations=iters,
            losses=losses,
            deadline_s=tr.deadline_s,
            slo=j.slo,
            min_workers=tr.lo if tr.elastic else None,
            max_workers=tr.hi if tr.elastic else None,
        )
        it_s = j.iter_s if j.s0 is not None else tr.ref_iter_s
        return TrainingJob(
            j.spec.job_id,
            j.spec.num_gpus,
            self.cfg.job_memory_mib,
            it_s,
            iterations_done=int(done_it + 1e-9),
            checkpoint_iteration=int(ckpt / tr.ref_iter_s + 1e-9),
            checkpoint_interval_iterations=j.n_ckpt,
            checkpoint_write_s=j.write_s,
            # the oracle (srtf) may know the length; the predictive queue only ever sees the reports
            total_iterations=tr.total_iterations if self._oracle else None,
            attained_gpu_s=j.attained_gpu_s + held,
            submit_time_s=j.spec.submit_s,
            tenant=j.spec.tenant,
            gpu_ids=j.gpu_ids,
            started_s=j.s0,
            preempting=j.release_s is not None,
            min_gpus=tr.lo if tr.elastic else None,
            perf=perf,
        )

    def _round(self, wants: Mapping[str, int], now_s: float) -> None:
        inf = self._inference_by_type()
        self._training_capacity = {t: max(n - inf.get(t, 0), 0) for t, n in self.cfg.gpus.items()}
        admitted = [self._job_view(o, now_s) for o in self.jobs.values() if isinstance(o, _MJob) and o.slo]
        for j in self.jobs.values():  # deadline jobs that just arrived: admission at submit
            if isinstance(j, _MJob) and j.truth is not None and j.truth.deadline_s is not None and j.slo is None:
                view = self._job_view(j, now_s)
                a = admit(view, admitted, self._training_capacity, self.pcfg, now_s)
                j.slo, j.admitted_finish_s = a.slo, a.finish_s
                if a.slo:
                    admitted.append(self._job_view(j, now_s))
        super()._round(wants, now_s)

    # ------------------------------------------------------------ mechanics on typed, sized runs
    def _start(self, j: _Job, gpu_ids: tuple[str, ...], now_s: float) -> None:
        assert isinstance(j, _MJob) and j.truth is not None
        tr = j.truth
        g, w = self.gpu_type[gpu_ids[0]], len(gpu_ids)
        j.iter_s = tr.iteration_s(g, w)
        j.rate = tr.ref_iter_s / j.iter_s
        j.n_ckpt = checkpoint_interval_iterations(j.iter_s, self.cfg.checkpoint_every_s)
        j.segments.append((j.base_s / tr.ref_iter_s, g, w))
        j.obs_n = -1
        super()._start(j, gpu_ids, now_s)

    def _preempt(self, j: _Job, now_s: float, grace: float) -> None:
        gang = len(j.gpu_ids)
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
        rate = j.rate
        self.preemptions += 1
        self.preempted_gpus += gang
        self.lost_gpu_s += lost / rate * gang
        self.lost_intervals.append(lost / rate / j.interval_s)
        heapq.heappush(self._events, (j.release_s, 0, j.spec.job_id, j.run))

    def _stop_run(self, j: _Job, t: float) -> None:
        if j.s0 is None:
            raise RuntimeError(f"job {j.spec.job_id} is not running: nothing to stop")
        j.attained_gpu_s += (t - j.s0) * len(j.gpu_ids)
        j.gpu_ids, j.s0, j.release_s = (), None, None

    def _sample(self, now_s: float) -> None:
        due = now_s + 1e-9 >= self._next_sample
        super()._sample(now_s)
        if not due or self.pcfg.training_queue != "predictive":
            return
        for j in self.jobs.values():
            if not isinstance(j, _MJob) or j.s0 is None or j.release_s is not None or j.truth is None:
                continue
            view = self._job_view(j, now_s)
            p = job_prediction(view, self.gpu_type[j.gpu_ids[0]], len(j.gpu_ids), self.pcfg)
            self.predictable_samples[1] += 1
            if p is None or not p.predictable or p.remaining_s is None:
                continue
            self.predictable_samples[0] += 1
            true_left = (j.spec.work_s - j.progress(now_s)[0]) / j.rate
            if true_left > 0:
                self.pred_errors.append(abs(p.remaining_s - true_left) / true_left)

    def check(self) -> list[str]:
        return [e for e in super().check() if "GPUs, needs" not in e]

    # ------------------------------------------------------------ results
    def report(self) -> dict:
        rep = super().report()
        window = [j for j in self.done if j.spec.job_id.startswith("j") and j.finished_s is not None]
        open_ = [j for j in self.jobs.values() if j.spec.job_id.startswith("j")]
        fin = [j.finished_s for j in window if j.finished_s is not None]
        jct = [f - j.spec.submit_s for f, j in zip(fin, window, strict=True)] + [
            self.t - j.spec.submit_s for j in open_
        ]
        rep["jct_all_p99_s"] = float(np.percentile(np.array(jct), 99)) if jct else None
        # makespan over the window's jobs that could finish by the end running alone on their gang
        feasible = [j for j in window + open_ if j.spec.submit_s + j.spec.work_s <= self.t]
        done_f = [j.finished_s for j in feasible if j.finished_s is not None]
        rep["makespan_jobs"] = len(feasible)
        rep["makespan_s"] = float(max(done_f)) if done_f and len(done_f) == len(feasible) else None
        rep["last_finish_s"] = float(max(fin)) if fin else None
        rep["jobs_open_at_end"] = len(open_)
        dl = [
            j for j in self.arrivals if isinstance(j, _MJob) and j.truth is not None and j.truth.deadline_s is not None
        ]

        def met(j: _MJob) -> bool:
            return j.finished_s is not None and j.truth is not None and j.finished_s <= (j.truth.deadline_s or 0.0)

        # decided: finished, or its deadline is past (a deadline after the end of the run is left out)
        dl = [
            j for j in dl if j.finished_s is not None or (j.truth is not None and (j.truth.deadline_s or 0) <= self.t)
        ]
        adm = [j for j in dl if j.slo]
        rep["deadline_jobs"] = len(dl)
        rep["deadline_admitted"] = len(adm)
        rep["deadline_met_admitted"] = sum(met(j) for j in adm)
        rep["deadline_met_all"] = sum(met(j) for j in dl)
        # finish-time fairness: each tenant alone on 1/N of the GPUs training held on average
        cap = self.gpu_s["training"] / max(self.t, 1e-9)
        tenants = {j.spec.tenant for j in window}
        iso = isolated_completion_s(
            [(j.spec.job_id, j.spec.tenant, j.spec.submit_s, j.spec.work_s, j.spec.num_gpus) for j in window],
            max(cap / max(len(tenants), 1), 1.0),
        )
        rho = tenant_rho([(j.spec.tenant, (j.finished_s or 0.0) - j.spec.submit_s, iso[j.spec.job_id]) for j in window])
        rep["fairness_by_tenant"] = rho
        rep["fairness_max"] = max(rho.values()) if rho else None
        pe = np.array(self.pred_errors)
        rep["prediction_error_median"] = float(np.median(pe)) if len(pe) else None
        rep["prediction_samples"] = len(pe)
        ps = self.predictable_samples
        rep["predictable_share"] = ps[0] / ps[1] if ps[1] else None
        return rep


MODEL_KEYS = (
    "jct_all_p99_s",
    "makespan_s",
    "makespan_jobs",
    "last_finish_s",
    "jobs_open_at_end",
    "deadline_jobs",
    "deadline_admitted",
    "deadline_met_admitted",
    "deadline_met_all",
    "fairness_max",
    "prediction_error_median",
    "predictable_share",
)
