"""The predictive training queue: order, size and type jobs by their performance models.

A pure policy (jobs + capacity + ``now``), selected by ``PlacementConfig.training_queue =
"predictive"``; the live controller and the simulator both reach it through
``sloserve.autoscaler.placement.queue.plan``. Each round, for every job with a model
(``TrainingJob.perf``, see ``perfmodel``):

1. **Predict** its iteration time on each GPU type and width and the iterations it has left;
   it is *predictable* once the held-out errors stay under the threshold (AITurbo).
2. **Order** (one queue): SLO-bound jobs close to their deadline first (earliest deadline first,
   Chronus); then jobs the starvation guard or the fairness guard promotes (a predictable job that
   has waited ``starvation_multiple`` times its predicted remaining time; the jobs of a tenant
   whose estimated finish-time fairness exceeds ``fairness_bound``, Themis); then everyone by
   Tiresias' discretised levels: a predictable job's level from its *predicted remaining*
   GPU-seconds (shortest first inside it), an unpredictable one's from its *attained* service
   (2D-LAS, its own starvation guard), predictable jobs ahead of unpredictable ones on a level.
3. **Size** elastic jobs (``perf.min_workers``/``max_workers``): every job in order gets its
   fewest GPUs while they last, then each spare GPU goes to the job whose predicted remaining
   time it shortens most (the speedup model; Pollux/AFS); a running job grows (a restart) only
   if that saves ``grow_min_gain_s``. Inference reclaims shrink them as before.
4. **Type**: a starting job takes the type where its predicted throughput, relative to the queue's
   average on that type, is highest (Gavel's comparative advantage), not the first that fits.

Deadline admission (:func:`admit`) runs at submit: the job is SLO-bound only if, with the
SLO-bound jobs already admitted, earliest deadline first on ``deadline_share`` of the harvested
GPUs finishes it in time; otherwise it is told so and runs best-effort.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from sloserve.autoscaler.placement.fairness import pressure
from sloserve.autoscaler.placement.las import QueuePlan, _las, las_level, walk
from sloserve.autoscaler.placement.perfmodel import (
    GPU_GENERATION,
    MODEL_CLASSES,
    JobPerf,
    Prediction,
    fit_speed,
    known_gpu_type,
    predict,
    speedup,
)
from sloserve.autoscaler.placement.types import PlacementConfig, QueueState, TrainingJob


def bounds(j: TrainingJob) -> tuple[int, int]:
    """(fewest, most) GPUs the job runs on."""
    p = j.perf
    lo = p.min_workers if p is not None and p.min_workers is not None else j.fewest
    hi = p.max_workers if p is not None and p.max_workers is not None else j.num_gpus
    return max(1, min(lo, hi)), max(hi, 1)


def job_speeds(j: TrainingJob, types: Iterable[str]) -> dict[str, float]:
    """The job's relative throughput per type (fitted where it ran, else its class's prior); 1.0 each
    for a job without a model."""
    types = list(types)
    p = j.perf
    if p is None or p.model_class not in MODEL_CLASSES:
        return {t: 1.0 for t in types}
    fit = fit_speed(p.model_class, p.iterations)
    speed = fit.speed if fit is not None else MODEL_CLASSES[p.model_class].speed
    return {t: speed[GPU_GENERATION[t.lower()]] if known_gpu_type(t) else 1.0 for t in types}


def sigma_of(j: TrainingJob) -> float:
    p = j.perf
    if p is None or p.model_class not in MODEL_CLASSES:
        return 0.0
    fit = fit_speed(p.model_class, p.iterations)
    return fit.sigma if fit is not None else MODEL_CLASSES[p.model_class].sigma


def job_prediction(j: TrainingJob, gpu_type: str, workers: int, cfg: PlacementConfig) -> Prediction | None:
    """The model's prediction for ``j`` on ``workers`` GPUs of ``gpu_type`` (None: no model)."""
    if j.perf is None or j.perf.model_class not in MODEL_CLASSES or not known_gpu_type(gpu_type):
        return None
    pc = cfg.predictive
    fallback = None
    if not j.perf.iterations:  # declared on its own gang: stretch by the class's scaling only
        s = sigma_of(j)
        fallback = j.iteration_time_s * speedup(j.num_gpus, s) / speedup(max(workers, 1), s)
    return predict(
        j.perf,
        j.iterations_done,
        gpu_type,
        workers,
        threshold=pc.threshold,
        min_samples=pc.min_samples,
        holdout=pc.holdout,
        fallback_iteration_s=fallback,
    )


@dataclass(frozen=True, slots=True)
class Ranked:
    job: TrainingJob
    level: int
    order_class: str  # slo, starved, fairness, predictable, las
    prediction: Prediction | None
    key: tuple


def rank(
    jobs: list[TrainingJob],
    capacity: Mapping[str, int],
    gpu_types: Mapping[str, str],
    cfg: PlacementConfig,
    state: QueueState,
    now_s: float,
) -> tuple[list[Ranked], QueueState, float]:
    """The queue's order (head first), its next state and when a job's place changes without an event."""
    pc = cfg.predictive
    levels, qstate, nxt = _las(jobs, cfg, state, now_s)
    types = sorted(t for t, n in capacity.items() if n > 0) or sorted(capacity)
    preds: dict[str, Prediction | None] = {}
    for j in jobs:
        if j.running:
            t = gpu_types[j.gpu_ids[0]]
        else:
            sp = job_speeds(j, types)
            t = max(types, key=lambda t: (sp[t], t)) if types else (j.gpu_type or "")
        preds[j.job_id] = job_prediction(j, t, j.gang, cfg)
    rows = []
    for j in jobs:
        p = preds[j.job_id]
        ran = j.attained_gpu_s / max(j.gang, 1)
        left = p.remaining_s if p is not None and p.predictable and p.remaining_s is not None else ran
        rows.append((j.tenant, j.submit_time_s, ran, left, j.gang))
    rho = pressure(rows, float(sum(capacity.values())), now_s) if len({r[0] for r in rows}) > 1 else {}
    behind = {t for t, r in rho.items() if r > pc.fairness_bound}
    th = cfg.las_thresholds_gpu_s
    out: list[Ranked] = []
    for j in jobs:
        p = preds[j.job_id]
        ok = p is not None and p.predictable and p.remaining_s is not None
        rem_s = p.remaining_s if ok and p is not None and p.remaining_s is not None else None
        perf = j.perf
        if (
            perf is not None
            and perf.slo
            and perf.deadline_s is not None
            and p is not None
            and p.remaining_s is not None
        ):
            until = perf.deadline_s - now_s - pc.urgency * p.remaining_s
            if until <= 0:
                out.append(Ranked(j, 0, "slo", p, (0, perf.deadline_s, j.job_id)))
                continue
            nxt = min(nxt, now_s + until)
        if rem_s is not None and not j.running and pc.starvation_multiple > 0:
            seen = qstate.last_run_s.get(j.job_id, now_s)
            wait = max(pc.starvation_floor_s, pc.starvation_multiple * rem_s)
            if now_s - seen >= wait:
                out.append(Ranked(j, 0, "starved", p, (1, j.submit_time_s, j.job_id)))
                continue
            nxt = min(nxt, seen + wait)
        if rem_s is None and not j.running and 0 < j.attained_gpu_s == qstate.promoted_gpu_s.get(j.job_id):
            # LAS' starvation guard just sent it back to the top queue: ahead of the predictable jobs too
            out.append(Ranked(j, 0, "starved", p, (1, j.submit_time_s, j.job_id)))
            continue
        if j.tenant in behind:
            out.append(Ranked(j, 0, "fairness", p, (1, j.submit_time_s, j.job_id)))
            continue
        if rem_s is not None:
            rem_gpu_s = rem_s * j.gang
            lvl = las_level(rem_gpu_s, th)
            out.append(Ranked(j, lvl, "predictable", p, (2, lvl, 0, rem_gpu_s, j.submit_time_s, j.job_id)))
        else:
            lvl = levels[j.job_id]
            key = (2, lvl, 1, not j.running, j.submit_time_s, j.job_id)
            out.append(Ranked(j, lvl, "las", p, key))
    out.sort(key=lambda r: r.key)
    return out, qstate, nxt


def widths(ranked: list[Ranked], total_gpus: int, cfg: PlacementConfig) -> dict[str, int]:
    """Each job's target width: its fewest GPUs in queue order while they last, then spare GPUs one
    at a time to the job whose predicted remaining time drops most (elastic jobs only)."""
    pc = cfg.predictive
    left = total_gpus
    width: dict[str, int] = {}
    for r in ranked:
        j = r.job
        need = j.gang if j.running else bounds(j)[0]
        if need <= left:
            width[j.job_id] = need
            left -= need

    def remaining_s(r: Ranked, w: int) -> float:
        p = r.prediction
        s = sigma_of(r.job)
        base = r.job.gang
        if p is not None and p.predictable and p.remaining_s is not None:
            t = p.remaining_s
        else:  # unpredictable: expect as much again as it has run (LAS' heavy-tail reading)
            t = max(r.job.attained_gpu_s / max(base, 1), 600.0)
        return t * speedup(base, s) / speedup(w, s)

    while left > 0:
        best: tuple[float, Ranked] | None = None
        for r in ranked:
            j = r.job
            w = width.get(j.job_id)
            if w is None or w >= bounds(j)[1] or (j.perf is None or j.perf.max_workers is None):
                continue
            gain = remaining_s(r, w) - remaining_s(r, w + 1)
            if j.running and gain < pc.grow_min_gain_s + cfg.restart_overhead_s:
                continue
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, r)
        if best is None:
            break
        width[best[1].job.job_id] += 1
        left -= 1
    return width


def plan(
    jobs: list[TrainingJob],
    capacity: Mapping[str, int],
    gpu_types: Mapping[str, str],
    cfg: PlacementConfig,
    state: QueueState,
    now_s: float,
    preempt: bool = True,
) -> QueuePlan:
    """The predictive queue's plan (see the module doc); same contract as ``queue.plan``."""
    ranked, qstate, nxt = rank(jobs, capacity, gpu_types, cfg, state, now_s)
    width = widths(ranked, sum(capacity.values()), cfg)
    types = sorted(capacity)
    rel: dict[str, dict[str, float]] = {}
    for r in ranked:
        sp = job_speeds(r.job, types)
        top = max(sp.values()) if sp else 1.0
        rel[r.job.job_id] = {t: v / top for t, v in sp.items()}
    avg = {t: sum(rel[k][t] for k in rel) / len(rel) for t in types} if rel else {}
    sigmas = {r.job.job_id: sigma_of(r.job) for r in ranked}

    def rate(j: TrainingJob, t: str, n: int) -> float:
        return speedup(n, sigmas.get(j.job_id, 0.0)) * rel.get(j.job_id, {}).get(t, 1.0) / max(avg.get(t, 1.0), 1e-9)

    view: list[tuple[TrainingJob, int]] = []
    for r in ranked:
        j = r.job
        lo, hi = bounds(j)
        if j.perf is not None and j.perf.max_workers is not None:  # elastic: the width chosen above
            j = replace(j, num_gpus=max(width.get(j.job_id, lo), j.gang if j.running else lo), min_gpus=lo)
        view.append((j, r.level))
    qp = walk(view, qstate, nxt, capacity, gpu_types, cfg, preempt, rate)
    by_id = {r.job.job_id: r for r in ranked}
    entries = []
    for e in qp.entries:
        r = by_id[e.job_id]
        p = r.prediction
        if e.gpu_type is not None and e.gpus and r.job.perf is not None:
            p = job_prediction(r.job, e.gpu_type, e.gpus, cfg) or p
        rem = p.remaining_s if p is not None and p.predictable else None
        entries.append(replace(e, order_class=r.order_class, predicted_remaining_s=rem))
    return QueuePlan(tuple(entries), qp.state, qp.next_change_s)


# ------------------------------------------------------------------ admission and validation


@dataclass(frozen=True, slots=True)
class Admission:
    """The answer at submit for a job with a deadline."""

    slo: bool  # admitted as SLO-bound
    reason: str  # "admitted", "impossible", "over-capacity", "unpredictable"
    alone_s: float | None  # predicted time to finish alone at its best (type, width)
    finish_s: float | None  # predicted finish under earliest deadline first with the admitted jobs


def best_alone(j: TrainingJob, capacity: Mapping[str, int], cfg: PlacementConfig) -> tuple[float, int] | None:
    """(seconds, GPUs) to finish the job alone at its fastest (type, width) within ``capacity``; None
    when its remaining work is unknown."""
    lo, hi = bounds(j)
    best: tuple[float, int] | None = None
    for t, n in capacity.items():
        for w in range(lo, min(hi, n) + 1):
            p = job_prediction(j, t, w, cfg)
            if p is None or p.remaining_iterations is None or p.iteration_s is None:
                continue
            s = p.remaining_iterations * p.iteration_s
            if best is None or s < best[0]:
                best = (s, w)
    return best


def admit(
    job: TrainingJob,
    admitted: Iterable[TrainingJob],
    capacity: Mapping[str, int],
    cfg: PlacementConfig,
    now_s: float,
) -> Admission:
    """Chronus-style admission of ``job`` (its ``perf.deadline_s``) beside the SLO-bound ``admitted``."""
    perf = job.perf
    if perf is None or perf.deadline_s is None:
        raise ValueError(f"job {job.job_id} has no deadline")
    mine = best_alone(job, capacity, cfg)
    if mine is None:
        return Admission(False, "unpredictable", None, None)
    alone_s, _ = mine
    if now_s + alone_s > perf.deadline_s:
        return Admission(False, "impossible", alone_s, None)
    need = []
    for o in admitted:
        if o.perf is None or o.perf.deadline_s is None or o.job_id == job.job_id:
            continue
        b = best_alone(o, capacity, cfg)
        if b is not None:
            need.append((o.perf.deadline_s, b[0] * b[1], o.job_id))
    need.append((perf.deadline_s, alone_s * mine[1], job.job_id))
    need.sort()
    share = cfg.predictive.deadline_share * sum(capacity.values())
    done_gpu_s, finish = 0.0, None
    for d, gpu_s, jid in need:
        done_gpu_s += gpu_s
        t = now_s + done_gpu_s / max(share, 1e-9)
        if jid == job.job_id:
            finish = max(t, now_s + alone_s)
        if t > d:
            return Admission(False, "over-capacity", alone_s, finish)
    return Admission(True, "admitted", alone_s, finish)


def validate(perf: JobPerf, gpu_type: str | None, num_gpus: int) -> list[tuple[str, str]]:
    """(field, problem) for a job spec the models cannot take; empty when it is fine."""
    errs = []
    if perf.model_class not in MODEL_CLASSES:
        errs.append(("model_class", f"unknown model class {perf.model_class!r}; known: {sorted(MODEL_CLASSES)}"))
    if gpu_type is not None and not known_gpu_type(gpu_type):
        errs.append(("gpu_type", f"unknown GPU type {gpu_type!r}; known: {sorted(GPU_GENERATION)}"))
    lo, hi = perf.min_workers, perf.max_workers
    if lo is not None and hi is not None and lo > hi:
        errs.append(("min_workers", f"min_workers {lo} > max_workers {hi}"))
    if (lo is not None and lo < 1) or (hi is not None and hi < 1) or num_gpus < 1:
        errs.append(("min_workers" if lo is not None and lo < 1 else "max_workers", "workers must be at least 1"))
    if perf.target_loss is not None and not (perf.target_loss > 0 and math.isfinite(perf.target_loss)):
        errs.append(("target_loss", "target_loss must be a positive number"))
    if perf.max_iterations is not None and perf.max_iterations < 1:
        errs.append(("max_iterations", "max_iterations must be at least 1"))
    return errs
