"""The predictive queue's live side without Ray: the job form's new fields (bad input is a 400/422
naming the field), measurements in and predictions out (``sloserve/training/perftrack.py``), the
deadline admission at submit, and a noisy job that stays unpredictable. Fake clock, no sleeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError

from sloserve.autoscaler.placement.predictive import plan
from sloserve.autoscaler.placement.types import (
    Gpu,
    PlacementConfig,
    PlacementDecision,
    PlacementSnapshot,
    QueueState,
    TrainingJob,
)
from sloserve.gateway.transports.training import training_router
from sloserve.training.harvest_jobs import HarvestJobs
from sloserve.training.job import JobRejected, TrainingSpec
from sloserve.training.manager import SubprocessLauncher, TrainingManager
from sloserve.training.perftrack import LivePredictions
from tests.unit.placement.test_training_security import TOKENS, A

CFG = PlacementConfig(training_queue="predictive")


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"model_class": "nosuch"}, "model_class"),
        ({"model_class": "resnet50", "gpu_type": "H900"}, "gpu_type"),
        ({"workers": 4, "max_workers": 2}, "max_workers"),
        ({"workers": 2, "min_workers": 3}, "min_workers"),
        ({"model_class": "resnet50", "deadline_s": 60}, "deadline_s"),
        ({"deadline_s": -5}, "deadline_s"),
    ],
)
def test_bad_job_forms_name_the_field(extra, field):
    with pytest.raises(ValidationError) as e:
        TrainingSpec(job_id="j", **extra)
    assert field in str(e.value)


def _api(tmp_path, clock):
    m = TrainingManager(tmp_path / "jobs", launcher=SubprocessLauncher())
    live = LivePredictions(clock=clock)
    jobs = HarvestJobs(m, admit=lambda spec: live.admit(spec, CFG))
    app = FastAPI()
    app.include_router(training_router(jobs, lambda: {}, TOKENS))
    return live, TestClient(app)


def test_http_unknown_model_class_is_a_422_naming_it(tmp_path):
    _, c = _api(tmp_path, lambda: 0.0)
    r = c.post("/v2/training/jobs", json={"job_id": "x", "model_class": "nosuch"}, headers=A)
    assert r.status_code == 422 and "model_class" in r.text


def test_http_impossible_deadline_is_a_400_naming_it_and_a_tight_one_runs_best_effort(tmp_path):
    live, c = _api(tmp_path, lambda: 0.0)
    form = {"model_class": "resnet50", "total_iterations": 10000, "iteration_time_s": 0.1, "gpu_type": "T4"}
    r = c.post("/v2/training/jobs", json={"job_id": "late", "deadline_s": 100, **form}, headers=A)
    assert r.status_code == 400 and "deadline_s" in r.text, r.text
    r = c.post("/v2/training/jobs", json={"job_id": "ok", "deadline_s": 5000, **form}, headers=A)
    assert r.status_code == 201, r.text
    # a snapshot with no GPUs left for it: the admission says it cannot promise the deadline
    snap = PlacementSnapshot(gpus=(Gpu("T4:0", "T4", 16384),))
    live.after_decision(snap, PlacementDecision("cost-aware"), CFG)
    assert live.tracker.admission("ok") == (True, "admitted")  # admitted on what it knew at submit


def test_measurements_make_a_job_predictable_and_noise_keeps_one_unpredictable():
    live = LivePredictions(clock=lambda: 0.0)
    spec = TrainingSpec(job_id="a", model_class="resnet18", target_loss=0.2)
    noisy = TrainingSpec(job_id="n", model_class="resnet18", target_loss=0.2)
    rng = np.random.default_rng(0)
    for k in range(1, 16):
        it = 50 * k
        live.observe("a", "T4", 1, 0.05)
        live.observe_checkpoint("a", "T4", 1, {"checkpoint_iteration": it, "eval_loss": 1 / (0.004 * it + 1) + 0.1}, 0)
        live.observe("n", "T4", 1, 0.05 * math.exp(0.8 * rng.standard_normal()))
        live.observe_checkpoint("n", "T4", 1, {"checkpoint_iteration": it, "loss": 2.0 * rng.uniform(0.2, 1.0)}, 0)
    jobs = [
        TrainingJob("a", 1, 1024, 0.05, iterations_done=750, perf=live.perf_for(spec)),
        TrainingJob("n", 1, 1024, 0.05, iterations_done=750, perf=live.perf_for(noisy), attained_gpu_s=40.0),
    ]
    snap = PlacementSnapshot(gpus=(Gpu("T4:0", "T4", 16384),), jobs=tuple(jobs))
    qp = plan(list(jobs), {"T4": 1}, {"T4:0": "T4"}, CFG, QueueState(), 0.0)
    live.after_decision(snap, PlacementDecision("cost-aware", training_queue=qp.entries), CFG)
    shown = {j: a["prediction"] for j, a in live.annotations().items()}
    assert shown["a"]["predictable"] and shown["a"]["order"] == "predictable"
    true_k = (1 / (0.2 - 0.1) - 1) / 0.004  # iteration where the curve reaches 0.2
    assert shown["a"]["remaining_iterations"] == pytest.approx(true_k - 750, rel=0.1)
    assert not shown["n"]["predictable"] and shown["n"]["order"] == "las"


def test_admission_refuses_an_impossible_deadline_with_the_field():
    live = LivePredictions(clock=lambda: 1000.0)
    spec = TrainingSpec(
        job_id="d", model_class="resnet50", total_iterations=1000, iteration_time_s=1.0, deadline_s=10, gpu_type="T4"
    )
    with pytest.raises(JobRejected, match="deadline_s"):
        live.admit(spec, CFG)
