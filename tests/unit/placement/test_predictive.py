"""The performance model and the predictive training queue (pure: a fake clock, no sleeps)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sloserve.autoscaler.placement.fairness import isolated_completion_s, pressure, tenant_rho
from sloserve.autoscaler.placement.perfmodel import JobPerf, fit_loss, predict, prior_speed
from sloserve.autoscaler.placement.predictive import admit, plan, rank, validate, widths
from sloserve.autoscaler.placement.queue import plan as queue_plan
from sloserve.autoscaler.placement.types import PlacementConfig, QueueState, TrainingJob

CFG = PlacementConfig(training_queue="predictive")


def curve(b0: float, b1: float, b2: float, ks, noise: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    return tuple((float(k), float((1 / (b0 * k + b1) + b2) * (1 + noise * rng.standard_normal()))) for k in ks)


def timing(gpu: str, w: int, t: float, n: int, noise: float = 0.0, seed: int = 1):
    rng = np.random.default_rng(seed)
    return tuple((gpu, w, float(t * math.exp(noise * rng.standard_normal()))) for _ in range(n))


def perf_job(job_id: str, done: int, target_iters: int, *, n: int = 40, gpu_ids=(), noise=0.0, **kw) -> TrainingJob:
    """A ResNet-50 job at ``done`` iterations whose loss reaches its target at ``target_iters``."""
    b1, b2 = 0.5, 0.2
    target = 0.6
    b0 = (1 / (target - b2) - b1) / target_iters
    ks = np.unique(np.geomspace(10, max(done, 11), n).astype(int))
    perf = JobPerf(
        "resnet50",
        target_loss=target,
        losses=curve(b0, b1, b2, ks, noise),
        iterations=timing("v100", 1, 0.1, len(ks), noise),
        **kw,
    )
    return TrainingJob(job_id, 1, 1024, 0.1, iterations_done=done, gpu_ids=tuple(gpu_ids), perf=perf)


# ------------------------------------------------------------------ the model


def test_priors_differ_by_model_class():
    """Gavel's figures: ResNet-50 gains 7.1x from a K80 to a V100, A3C only 2.1x, and the
    recommendation model is slower on the V100 than on the P100."""
    assert prior_speed("resnet50", "v100") / prior_speed("resnet50", "k80") == pytest.approx(7.1, rel=0.01)
    assert prior_speed("a3c", "v100") / prior_speed("a3c", "k80") == pytest.approx(2.09, rel=0.01)
    assert prior_speed("recommendation", "v100") < prior_speed("recommendation", "p100")
    with pytest.raises(KeyError):
        prior_speed("nosuchmodel", "v100")


def test_speed_is_fitted_online_and_transfers_across_types_by_the_prior():
    perf = JobPerf("transformer", iterations=timing("t4", 2, 0.5, 8))
    p = predict(perf, 0, "t4", 2)
    assert p.iteration_s == pytest.approx(0.5, rel=1e-6)
    ratio = prior_speed("transformer", "a100") / prior_speed("transformer", "t4")
    assert predict(perf, 0, "a100", 2).iteration_s == pytest.approx(0.5 / ratio, rel=1e-6)
    # measured on a second type: that type's speed moves towards what was measured
    perf2 = JobPerf("transformer", iterations=perf.iterations + timing("a100", 2, 0.25, 8))
    assert predict(perf2, 0, "a100", 2).iteration_s == pytest.approx(0.25, rel=0.15)


def test_scaling_loss_is_refitted_from_two_widths():
    perf = JobPerf("resnet50", iterations=timing("v100", 1, 1.0, 4) + timing("v100", 4, 1.0 / 2.0, 4))
    p = predict(perf, 0, "v100", 4)
    assert p.sigma == pytest.approx((4 / 2.0 - 1) / 3, abs=0.03)  # speedup 2 on 4 GPUs


def test_loss_curve_recovers_the_remaining_iterations():
    b0, b1, b2 = 1e-4, 0.4, 0.3
    fit = fit_loss(curve(b0, b1, b2, range(100, 20001, 500), noise=0.002))
    assert fit is not None
    true_k = (1 / (0.5 - b2) - b1) / b0
    assert fit.iteration_at(0.5) == pytest.approx(true_k, rel=0.05)


def test_a_job_starts_unpredictable_and_becomes_predictable():
    early = perf_job("a", done=30, target_iters=20000, n=3)
    assert predict(early.perf, 30, "v100", 1).reason == "few-samples"
    late = perf_job("a", done=8000, target_iters=20000, n=40, noise=0.003)
    p = predict(late.perf, 8000, "v100", 1)
    assert p.predictable, p
    assert p.remaining_iterations == pytest.approx(12000, rel=0.1)
    assert p.remaining_s == pytest.approx(1200, rel=0.1)


def test_noisy_and_non_converging_jobs_stay_unpredictable():
    noisy = perf_job("n", done=8000, target_iters=20000, n=40, noise=0.3)
    assert not predict(noisy.perf, 8000, "v100", 1).predictable
    # the loss levels off at 0.8, above the 0.6 target: never gets there
    flat = JobPerf(
        "resnet50",
        target_loss=0.6,
        losses=curve(1e-3, 0.5, 0.8, range(100, 8000, 400), 0.002),
        iterations=timing("v100", 1, 0.1, 20),
    )
    p = predict(flat, 8000, "v100", 1)
    assert not p.predictable and p.reason == "loss-not-converging"


# ------------------------------------------------------------------ the queue


def test_predictable_jobs_by_remaining_service_unpredictable_by_las():
    long_ = perf_job("long", 40000, 80000, n=40, noise=0.002)
    short = perf_job("short", 8000, 9000, n=40, noise=0.002)
    unknown = TrainingJob("unknown", 1, 1024, 0.1, submit_time_s=0.0)
    ranked, _, _ = rank([long_, short, unknown], {"v100": 1}, {"g0": "v100"}, CFG, QueueState(), 100.0)
    assert [r.job.job_id for r in ranked][:1] == ["short"]
    cls = {r.job.job_id: r.order_class for r in ranked}
    assert cls == {"long": "predictable", "short": "predictable", "unknown": "las"}
    # long's predicted remaining is over the LAS threshold: the fresh unknown job goes first
    assert [r.job.job_id for r in ranked] == ["short", "unknown", "long"]


def test_queue_reorders_when_a_prediction_changes():
    a = perf_job("a", 8000, 100000, n=40, noise=0.002, gpu_ids=("g0",))
    b = perf_job("b", 8000, 30000, n=40, noise=0.002)
    p1 = plan([a, b], {"v100": 1}, {"g0": "v100"}, CFG, QueueState(), 0.0)
    assert [(e.job_id, e.action) for e in p1.entries] == [("b", "start"), ("a", "preempt")]
    # new points: a turns out to be nearly done, b longer than thought
    a2 = perf_job("a", 8000, 8500, n=40, noise=0.002, gpu_ids=("g0",))
    p2 = plan([a2, b], {"v100": 1}, {"g0": "v100"}, CFG, p1.state, 10.0)
    assert [(e.job_id, e.action) for e in p2.entries] == [("a", "run"), ("b", "wait")]
    assert p2.entries[0].order_class == "predictable" and p2.entries[0].predicted_remaining_s < 100


def test_unpredictable_job_is_never_starved():
    """A noisy job waits behind a stream of predictable short ones only until LAS' guard promotes it."""
    cfg = CFG.model_copy(update={"las_starvation_multiple": 2.0})
    noisy = perf_job("noisy", 8000, 9000, n=40, noise=0.3)
    noisy = TrainingJob("noisy", 1, 1024, 0.1, attained_gpu_s=5000.0, perf=noisy.perf, submit_time_s=0.0)
    state = QueueState()
    started_at = None
    for step in range(40):
        now = step * 600.0
        short = perf_job(f"s{step}", 8000, 9000, n=40, noise=0.002)
        p = plan([noisy, short], {"v100": 1}, {"g0": "v100"}, cfg, state, now)
        state = p.state
        if p.entries[0].job_id == "noisy":
            started_at = now
            break
    assert started_at is not None and started_at <= 2 * 5000.0 + 600.0


def test_predictable_long_job_is_promoted_by_the_starvation_guard():
    cfg = CFG.model_copy(update={"predictive": CFG.predictive.model_copy(update={"starvation_floor_s": 0.0})})
    long_ = perf_job("long", 8000, 20000, n=40, noise=0.002)
    state = QueueState()
    for step in range(200):
        now = step * 60.0
        short = perf_job(f"s{step}", 8000, 8100, n=40, noise=0.002)
        p = plan([long_, short], {"v100": 1}, {"g0": "v100"}, cfg, state, now)
        state = p.state
        if p.entries[0].job_id == "long":
            assert p.entries[0].order_class == "starved"
            break
    else:
        pytest.fail("the long job never ran")


def test_elastic_widths_go_where_the_speedup_model_says():
    good = perf_job("good", 8000, 100000, n=40, noise=0.002, min_workers=1, max_workers=8)  # resnet50 scales
    lm = TrainingJob(
        "lm",
        1,
        1024,
        0.1,
        iterations_done=8000,
        perf=JobPerf(
            "lm",
            target_loss=0.6,
            losses=good.perf.losses,
            iterations=good.perf.iterations,
            min_workers=1,
            max_workers=8,
        ),
    )
    ranked, _, _ = rank([good, lm], {"v100": 8}, {}, CFG, QueueState(), 0.0)
    w = widths(ranked, 8, CFG)
    assert sum(w.values()) == 8 and w["good"] > w["lm"] >= 1


def test_reclaim_still_shrinks_an_elastic_job():
    j = perf_job("e", 8000, 100000, n=40, noise=0.002, gpu_ids=("g0", "g1", "g2", "g3"), min_workers=1, max_workers=4)
    j = TrainingJob("e", 4, 1024, 0.1, iterations_done=8000, gpu_ids=j.gpu_ids, perf=j.perf, min_gpus=1)
    gt = {f"g{i}": "v100" for i in range(4)}
    p = plan([j], {"v100": 2}, gt, CFG, QueueState(), 0.0)
    assert [(e.action, e.reason, e.gpus) for e in p.entries] == [("resize", "shrink", 2)]


def test_type_by_comparative_advantage_not_first_free():
    """One A100 and one T4 free: ResNet-50 (7.1x from K80 to V100 generation) takes the A100 and
    A3C (2.1x) the T4, whatever the order."""
    r50 = TrainingJob("r50", 1, 1024, 0.1, perf=JobPerf("resnet50"), submit_time_s=1.0)
    a3c = TrainingJob("a3c", 1, 1024, 0.1, perf=JobPerf("a3c"), submit_time_s=0.0)
    p = plan([a3c, r50], {"a100": 1, "t4": 1}, {}, CFG, QueueState(), 0.0)
    assert {e.job_id: e.gpu_type for e in p.entries} == {"r50": "a100", "a3c": "t4"}
    las = queue_plan([a3c, r50], {"a100": 1, "t4": 1}, {}, PlacementConfig(), QueueState(), 0.0)
    assert {e.job_id: e.gpu_type for e in las.entries}["a3c"] == "a100"  # best fit, blind to speed


def _deadline_job(job_id: str, deadline: float, iters: int = 10000, it_s: float = 0.1) -> TrainingJob:
    perf = JobPerf("resnet50", max_iterations=iters, deadline_s=deadline)
    return TrainingJob(job_id, 1, 1024, it_s, perf=perf)


def test_admission_impossible_feasible_and_over_capacity():
    cap = {"t4": 2}
    assert admit(_deadline_job("x", 500.0), [], cap, CFG, 0.0).reason == "impossible"  # 1000 s alone
    ok = admit(_deadline_job("y", 3000.0), [], cap, CFG, 0.0)
    assert ok.slo and ok.reason == "admitted" and ok.alone_s == pytest.approx(1000.0)
    others = [
        TrainingJob(f"o{i}", 1, 1024, 0.1, perf=JobPerf("resnet50", max_iterations=10000, deadline_s=2500.0, slo=True))
        for i in range(3)
    ]
    late = admit(_deadline_job("z", 3000.0), others, cap, CFG, 0.0)
    assert not late.slo and late.reason == "over-capacity"


def test_urgent_slo_job_goes_first():
    j = _deadline_job("d", 1500.0)
    j = TrainingJob("d", 1, 1024, 0.1, perf=JobPerf("resnet50", max_iterations=10000, deadline_s=1500.0, slo=True))
    other = perf_job("o", 8000, 8100, n=40, noise=0.002)
    ranked, _, nxt = rank([j, other], {"t4": 1}, {}, CFG, QueueState(), 0.0)
    assert ranked[0].job.job_id == "d" and ranked[0].order_class == "slo"


@pytest.mark.parametrize(
    ("perf", "gpu", "field"),
    [
        (JobPerf("nosuch"), None, "model_class"),
        (JobPerf("resnet50"), "h900", "gpu_type"),
        (JobPerf("resnet50", min_workers=4, max_workers=2), None, "min_workers"),
    ],
)
def test_bad_specs_name_the_field(perf, gpu, field):
    assert field in [f for f, _ in validate(perf, gpu, 1)]


# ------------------------------------------------------------------ fairness


def test_finish_time_fairness():
    iso = isolated_completion_s([("a", "t", 0.0, 100.0, 1), ("b", "t", 50.0, 100.0, 1)], 1.0)
    assert iso == {"a": 150.0, "b": 150.0}  # processor sharing from 50 s
    assert tenant_rho([("t", 200.0, 100.0), ("u", 100.0, 100.0)]) == {"t": 2.0, "u": 1.0}
    rho = pressure([("t", 0.0, 100.0, 100.0, 1), ("u", 0.0, 10.0, 10.0, 1)], 2.0, 1000.0)
    assert rho["u"] > rho["t"]


def test_tenant_behind_its_fair_finish_time_moves_ahead():
    cfg = CFG.model_copy(update={"predictive": CFG.predictive.model_copy(update={"fairness_bound": 1.5})})
    hog = [perf_job(f"h{i}", 8000, 9000, n=40, noise=0.002) for i in range(3)]
    hog = [TrainingJob(j.job_id, 1, 1024, 0.1, iterations_done=8000, perf=j.perf, submit_time_s=49900.0) for j in hog]
    starved = TrainingJob("v", 1, 1024, 0.1, submit_time_s=0.0, attained_gpu_s=3600.0, tenant="victim")
    ranked, _, _ = rank([*hog, starved], {"v100": 1}, {}, cfg, QueueState(), 50000.0)
    assert ranked[0].job.job_id == "v" and ranked[0].order_class == "fairness"
