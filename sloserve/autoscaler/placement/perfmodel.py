"""Performance model of a training job: its speed per GPU type and width, and the work it has left.

Pure functions of what the job has reported (no clock, no I/O); fits are cached on their inputs.

**Speed.** An iteration of a data-parallel job at a fixed global batch on ``w`` workers of type ``g``
takes ``t(g, w) = base * (1 + sigma * (w - 1)) / (w * speed(g))``: ``speed`` is the model class's
relative throughput across GPU generations (Gavel, Narayanan et al., OSDI'20: the isolated
throughputs of ``scheduler/simulation_throughputs.json`` in stanford-futuredata/gavel @ c4fa4009,
one GPU, one batch size per class, normalised to the K80), ``sigma`` the class's scaling loss
fitted to the same file's 1/2/4/8-GPU figures on the P100 (``speedup(w) = w / (1 + sigma (w-1))``,
the shape Optimus and AFS use). The class fixes the shape; the job's own measured iterations fix
``base`` (the median of measured / shape), correct the type it ran on (shrunk towards the prior
with ``PRIOR_WEIGHT`` pseudo-samples) and, once it has run at two widths, ``sigma``.

**Convergence.** Optimus' loss curve ``loss(k) = 1 / (b0 k + b1) + b2`` (Peng et al., EuroSys'18),
fitted to the reported (iteration, loss) points by least squares over a grid of asymptotes ``b2``;
the iterations left are those to the job's target loss, capped by its iteration budget (a job
with a budget and no target needs no curve).

**Predictability** (AITurbo): a job is predictable once it has ``min_samples`` points and both
held-out errors are under ``threshold``: each of the last ``holdout`` loss points predicted (as
the iteration at which the curve fitted to the points before it reaches that loss) and each of
the last ``holdout`` iteration times predicted from the ones before. A job whose curve never
reaches its target (asymptote above it) or whose points scatter stays unpredictable.

>>> perf = JobPerf("resnet50", target_loss=0.5,
...                losses=tuple((k, 1 / (0.001 * k + 0.5) + 0.4) for k in range(100, 3100, 100)),
...                iterations=tuple(("v100", 1, 0.2) for _ in range(8)))
>>> p = predict(perf, 3000, "v100", 1)
>>> p.predictable, round(p.remaining_iterations, -2), round(p.iteration_s, 3)
(True, 6500.0, 0.2)
>>> round(predict(perf, 3000, "k80", 1).iteration_s, 2)  # ResNet-50 is 7.1x faster on a V100
1.42
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import median

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

# Gavel simulation_throughputs.json @ c4fa4009 ("null" = isolated, 1 GPU), steps/s:
#   class       (Gavel job)                        k80     p100    v100    sigma (P100 1->8 GPUs)
#   resnet50    ResNet-50 (batch size 64)          0.619   2.619   4.395   0.021 (8 GPUs: 6.96x)
#   resnet18    ResNet-18 (batch size 128)         1.807  11.675  17.995   0.014 (7.29x)
#   transformer Transformer (batch size 64)        1.752   5.092   8.618   0.149 (3.92x)
#   lm          LM (batch size 20)                17.142  58.173  64.742   0.429 (2.01x)
#   recommendation Recommendation (batch 2048)    10.441  16.597   7.470   no multi-GPU figure: 0.3
#   a3c         A3C                                3.439   5.681   7.176   no multi-GPU figure: 0.3
#   cyclegan    CycleGAN                           0.505   2.403   4.426   no multi-GPU figure: 0.3
_GAVEL: dict[str, tuple[float, float, float, float]] = {
    "resnet50": (0.619, 2.619, 4.395, 0.021),
    "resnet18": (1.807, 11.675, 17.995, 0.014),
    "transformer": (1.752, 5.092, 8.618, 0.149),
    "lm": (17.142, 58.173, 64.742, 0.429),
    "recommendation": (10.441, 16.597, 7.470, 0.3),
    "a3c": (3.439, 5.681, 7.176, 0.3),
    "cyclegan": (0.505, 2.403, 4.426, 0.3),
}
# GPU types the priors know. Gavel measured K80, P100 and V100; the inventory's T4 and A100 stand in
# for the P100 and the V100 generations (an assumption, stated in docs/placement.md): the per-class
# affinity is the published one, the absolute speed of the newer parts is not.
GPU_GENERATION: dict[str, str] = {"k80": "k80", "p100": "p100", "v100": "v100", "t4": "p100", "a100": "v100"}
PRIOR_WEIGHT = 3.0  # pseudo-samples of the prior when a type's measured speed corrects it


@dataclass(frozen=True, slots=True)
class ClassPrior:
    speed: dict[str, float]  # relative throughput per GPU generation (K80 = 1)
    sigma: float


MODEL_CLASSES: dict[str, ClassPrior] = {
    name: ClassPrior({"k80": 1.0, "p100": p / k, "v100": v / k}, s) for name, (k, p, v, s) in _GAVEL.items()
}


def known_gpu_type(gpu_type: str) -> bool:
    return gpu_type.lower() in GPU_GENERATION


def prior_speed(model_class: str, gpu_type: str) -> float:
    """The class's relative throughput on ``gpu_type`` (K80 = 1); KeyError for an unknown class or type."""
    return MODEL_CLASSES[model_class].speed[GPU_GENERATION[gpu_type.lower()]]


def speedup(workers: int, sigma: float) -> float:
    """Throughput on ``workers`` GPUs over one GPU's.

    >>> round(speedup(8, 0.149), 2)
    3.92
    """
    return workers / (1.0 + sigma * (workers - 1))


@dataclass(frozen=True, slots=True)
class JobPerf:
    """What a job declares and has reported so far (every field hashable: fits are cached on it).

    ``iterations``: (gpu type, workers, seconds per iteration) measurements, oldest first;
    ``losses``: (iteration, loss) points, oldest first. ``deadline_s``: absolute, in the driver's
    clock; ``slo``: the admission's answer (True: admitted as SLO-bound; False: told it cannot make
    its deadline, runs best-effort; None: no deadline)."""

    model_class: str
    target_loss: float | None = None
    max_iterations: int | None = None
    iterations: tuple[tuple[str, int, float], ...] = ()
    losses: tuple[tuple[float, float], ...] = ()
    deadline_s: float | None = None
    slo: bool | None = None
    min_workers: int | None = None
    max_workers: int | None = None


@dataclass(frozen=True, slots=True)
class Prediction:
    """The model's answer for one job on one (type, width)."""

    predictable: bool
    # "predictable", "few-samples", "noisy-iterations", "loss-not-converging", "held-out-error", "no-target"
    reason: str
    iteration_s: float | None  # predicted seconds per iteration on the asked (type, width)
    remaining_iterations: float | None  # None: unknown
    remaining_s: float | None  # remaining_iterations * iteration_s
    iteration_error: float | None  # held-out relative error of the iteration-time model
    loss_error: float | None  # held-out relative error of the convergence model (in iterations)
    sigma: float | None = None  # fitted scaling loss


@dataclass(frozen=True, slots=True)
class SpeedFit:
    base: float  # seconds per iteration, one worker, relative speed 1
    sigma: float
    speed: dict[str, float]  # fitted relative speed per GPU generation (types it ran on corrected)

    def iteration_s(self, gpu_type: str, workers: int) -> float:
        gen = GPU_GENERATION[gpu_type.lower()]
        return self.base / (self.speed[gen] * speedup(max(workers, 1), self.sigma))


def _shape(prior: ClassPrior, gpu_type: str, workers: int, sigma: float) -> float:
    return 1.0 / (prior.speed[GPU_GENERATION[gpu_type.lower()]] * speedup(max(workers, 1), sigma))


@lru_cache(maxsize=65536)
def fit_speed(model_class: str, samples: tuple[tuple[str, int, float], ...]) -> SpeedFit | None:
    """The speed model fitted to ``samples`` (None without any)."""
    if not samples:
        return None
    prior = MODEL_CLASSES[model_class]
    sigma = prior.sigma
    widths = {w for _, w, _ in samples}
    if len(widths) > 1:  # refit the scaling loss: the sigma whose shape spreads the samples least

        def spread(s: float) -> float:
            r = [math.log(t / _shape(prior, g, w, s)) for g, w, t in samples]
            m = sum(r) / len(r)
            return sum((x - m) ** 2 for x in r)

        sigma = min((i / 40.0 for i in range(41)), key=spread)
    base = median(t / _shape(prior, g, w, sigma) for g, w, t in samples)
    speed = dict(prior.speed)
    by_gen: dict[str, list[float]] = {}
    for g, w, t in samples:  # measured speed of each generation it ran on, relative to the fit
        by_gen.setdefault(GPU_GENERATION[g.lower()], []).append(base / (t * speedup(w, sigma)))
    if len(by_gen) > 1:  # base is anchored on all of them; correct each towards its own measurements
        for gen, xs in by_gen.items():
            n = len(xs)
            speed[gen] = math.exp((PRIOR_WEIGHT * math.log(speed[gen]) + n * math.log(median(xs))) / (PRIOR_WEIGHT + n))
    return SpeedFit(base, sigma, speed)


@lru_cache(maxsize=65536)
def speed_error(model_class: str, samples: tuple[tuple[str, int, float], ...], holdout: int) -> float | None:
    """Median relative error predicting each of the last ``holdout`` samples from those before it."""
    if len(samples) < holdout + 2:
        return None
    errs = []
    for i in range(len(samples) - holdout, len(samples)):
        fit = fit_speed(model_class, samples[:i])
        if fit is None:
            return None
        g, w, t = samples[i]
        errs.append(abs(fit.iteration_s(g, w) - t) / t)
    return median(errs)


@dataclass(frozen=True, slots=True)
class LossFit:
    b0: float
    b1: float
    b2: float

    def loss(self, k: float) -> float:
        return 1.0 / (self.b0 * k + self.b1) + self.b2

    def iteration_at(self, loss: float) -> float | None:
        """The iteration at which the curve reaches ``loss`` (None: never, the asymptote is above it)."""
        if loss <= self.b2:
            return None
        return max((1.0 / (loss - self.b2) - self.b1) / self.b0, 0.0)


def _fit_grid(ks: np.ndarray, ls: np.ndarray, qs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each asymptote ``b2 = q * min(loss)``: the least-squares (b0, b1) of ``1/(loss - b2)`` on the
    iteration, and the fit's squared error in loss (inf where the curve does not decrease)."""
    b2 = ls.min() * qs[:, None]
    ys = 1.0 / (ls[None, :] - b2)
    mk = ks.mean()
    dk = ks - mk
    vk = float((dk**2).sum())
    my = ys.mean(axis=1)
    b0 = (ys * dk[None, :]).sum(axis=1) / vk
    b1 = my - b0 * mk
    ok = (b0 > 0) & (b1 > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        pred = 1.0 / (b0[:, None] * ks[None, :] + b1[:, None]) + b2
        sse = ((pred - ls[None, :]) ** 2).sum(axis=1)
    return b0, b1, b2[:, 0], np.where(ok, sse, np.inf)


@lru_cache(maxsize=65536)
def fit_loss(points: tuple[tuple[float, float], ...]) -> LossFit | None:
    """Optimus' curve fitted to ``points`` (None: fewer than 3, or no decreasing fit): a grid over the
    asymptote, then a finer grid around the best point."""
    if len(points) < 3:
        return None
    arr = np.asarray(points, dtype=float)
    ks, ls = arr[:, 0], arr[:, 1]
    if ls.min() <= 0 or float(np.ptp(ks)) <= 0:
        return None
    qs = np.linspace(0.0, 0.995, 200)
    b0, b1, b2, sse = _fit_grid(ks, ls, qs)
    i = int(np.argmin(sse))
    if not np.isfinite(sse[i]):
        return None
    fine = np.linspace(qs[max(i - 1, 0)], qs[min(i + 1, len(qs) - 1)], 101)
    f0, f1, f2, fs = _fit_grid(ks, ls, fine)
    k = int(np.argmin(fs))
    if fs[k] <= sse[i]:
        return LossFit(float(f0[k]), float(f1[k]), float(f2[k]))
    return LossFit(float(b0[i]), float(b1[i]), float(b2[i]))


@lru_cache(maxsize=65536)
def loss_error(points: tuple[tuple[float, float], ...], holdout: int) -> float | None:
    """Median relative error, in iterations, predicting when each of the last ``holdout`` losses is
    reached from the curve fitted to the points before it (1.0 when it says never)."""
    if len(points) < holdout + 3:
        return None
    errs = []
    for i in range(len(points) - holdout, len(points)):
        fit = fit_loss(points[:i])
        k, v = points[i]
        at = None if fit is None else fit.iteration_at(v)
        errs.append(1.0 if at is None else min(abs(at - k) / max(k, 1.0), 1.0))
    return median(errs)


def predict(
    perf: JobPerf,
    iterations_done: float,
    gpu_type: str,
    workers: int,
    *,
    threshold: float = 0.15,
    min_samples: int = 6,
    holdout: int = 3,
    fallback_iteration_s: float | None = None,
) -> Prediction:
    """The job's speed on ``(gpu_type, workers)`` and the work it has left, and whether to trust them."""
    fit = fit_speed(perf.model_class, perf.iterations)
    if fit is not None:
        it_s: float | None = fit.iteration_s(gpu_type, workers)
    elif fallback_iteration_s is not None:  # declared, on its own gang: only the prior's shape
        it_s = fallback_iteration_s
    else:
        it_s = None
    s_err = speed_error(perf.model_class, perf.iterations, holdout)
    rem: float | None = None
    l_err: float | None = None
    reason = "predictable"
    if perf.target_loss is not None:
        lf = fit_loss(perf.losses)
        l_err = loss_error(perf.losses, holdout)
        at = None if lf is None else lf.iteration_at(perf.target_loss)
        if at is not None:
            rem = max(at - iterations_done, 0.0)
        elif lf is not None and len(perf.losses) >= min_samples:
            reason = "loss-not-converging"
    if perf.max_iterations is not None:
        cap = max(perf.max_iterations - iterations_done, 0.0)
        rem = cap if rem is None else min(rem, cap)
        if perf.target_loss is None:
            l_err = 0.0
    if perf.target_loss is None and perf.max_iterations is None:
        reason = "no-target"
    n = min(len(perf.iterations), len(perf.losses) if perf.target_loss is not None else len(perf.iterations))
    if reason == "predictable":
        if n < min_samples or s_err is None or l_err is None:
            reason = "few-samples"
        elif s_err > threshold:
            reason = "noisy-iterations"
        elif l_err > threshold and (perf.max_iterations is None or rem != perf.max_iterations - iterations_done):
            reason = "held-out-error"
        elif rem is None:
            reason = "loss-not-converging"
    rem_s = None if rem is None or it_s is None else rem * it_s
    return Prediction(
        reason == "predictable", reason, it_s, rem, rem_s, s_err, l_err, None if fit is None else fit.sigma
    )


class PredictiveConfig(BaseModel):
    """Knobs of the ``predictive`` training queue (sloserve/autoscaler/placement/predictive.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold: float = Field(default=0.15, gt=0, description="Held-out error under which a job is predictable.")
    min_samples: int = Field(default=6, ge=3, description="Measurements a job needs before it can be predictable.")
    holdout: int = Field(default=3, ge=1, description="Latest measurements each held-out error predicts.")
    starvation_multiple: float = Field(
        default=4.0,
        ge=0,
        description="A predictable job waiting longer than this many times its predicted remaining "
        "time (at least starvation_floor_s) goes to the head of the queue; 0 turns the guard off.",
    )
    starvation_floor_s: float = Field(default=1800.0, ge=0, description="Least wait before the guard promotes a job.")
    fairness_bound: float = Field(
        default=2.0,
        gt=1,
        description="A tenant whose estimated finish-time fairness (shared over isolated "
        "completion time, Themis) exceeds this has its jobs moved ahead.",
    )
    deadline_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Share of the harvested GPUs SLO-bound (deadline) jobs may count on at admission.",
    )
    urgency: float = Field(
        default=1.5,
        ge=1,
        description="An SLO-bound job goes to the head once its time to deadline is under this many "
        "times its predicted remaining time.",
    )
    grow_min_gain_s: float = Field(
        default=120.0, ge=0, description="A running job is grown (a restart) only if that saves at least this much."
    )
