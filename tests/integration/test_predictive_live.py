"""The predictive training queue live: the PyTorch demo on Ray Train reports its iterations and
losses through the session, the controller fits its model online, and the queue acts on it.

Two emulated T4s, one held by the inference replica: one GPU for training, ``training.queue``
``predictive``.

1. A job with an iteration budget (``total_iterations``) becomes predictable once its measured
   iteration times agree, and its predicted finish converges on the real one; the demo's own loss
   curve (a plateau, then a drop: not the shape the convergence model fits) keeps a job with a
   target loss unpredictable, ordered by 2D-LAS, and never starved: it runs once the GPU is free.
2. The queue reorders when a prediction changes: a job with a deadline, admitted as SLO-bound,
   waits behind a running job until its predicted remaining time says it must start; then it goes
   to the head (order ``slo``) and the running job is preempted for it.
"""

from __future__ import annotations

import json
import time
import urllib.error

import pytest

from sloserve.loadtests.bench.reclaim import harvest_setup
from tests.conftest import ServerProcess
from tests.integration.test_autoscaling_live import wait_for
from tests.integration.test_harvest_live import get, metric, post

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(model_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("predictive-repo")
    jobs = tmp_path_factory.mktemp("predictive-jobs")
    settings = harvest_setup(model_repo, repo, jobs, gpus=2)
    doc = json.loads(settings.read_text())
    doc["training"]["queue"] = "predictive"
    settings.write_text(json.dumps(doc))
    s = ServerProcess(repo, "ray", ["--config", str(settings)]).wait_ready()
    s.jobs_dir = jobs
    yield s
    s.stop()


def job(s, job_id: str) -> dict:
    return get(s, f"/v2/training/jobs/{job_id}")


def test_predictions_converge_on_a_real_job_and_an_unpredictable_one_runs_by_las(server):
    s = server
    code, _ = post(
        s,
        "/v2/training/jobs",
        {
            "job_id": "budget",
            "config": {"iterations": 1200, "checkpoint_every": 50, "iteration_delay_s": 0.02},
            "total_iterations": 1200,
            "checkpoint_every": 50,
            "model_class": "resnet18",
        },
    )
    assert code == 201
    code, info = post(
        s,
        "/v2/training/jobs",
        {
            "job_id": "curve",
            "config": {"iterations": 0, "checkpoint_every": 20},
            "model_class": "resnet18",
            "target_loss": 0.001,
        },
    )
    assert code == 201
    seen: list[tuple[float, dict]] = []  # (time, prediction) while the budget job runs and is predictable
    waited: list[dict] = []  # the other job while it waited behind the running one

    def budget_done() -> bool:
        b = job(s, "budget")
        p = b.get("prediction") or {}
        if b["state"] == "running" and p.get("predictable") and p.get("remaining_s") is not None:
            seen.append((time.monotonic(), p))
        c = job(s, "curve")
        # The other one waits while the training GPU is busy, unpredictable (nothing measured), by LAS.
        # (It may run beside the first while the inference replica's GPU is free too: a replica that
        # restarts or has not started yet leaves it to training, which the harvest allows.)
        if b["state"] == "running" and c["state"] == "queued":
            waited.append(c)
        return b["state"] == "finished"

    assert wait_for(budget_done, 180), (job(s, "budget"), s.output())
    end = time.monotonic()
    assert waited and all((c.get("prediction") or {}).get("predictable") is False for c in waited), waited
    assert len(seen) >= 5, seen
    # predicted finish (then + remaining) against the real one, over the second half of the run
    late = seen[len(seen) // 2 :]
    errs = [abs(t + p["remaining_s"] - end) / max(end - t, 1.0) for t, p in late]
    errs.sort()
    assert errs[len(errs) // 2] < 0.35, (errs, late[-3:])
    assert metric(s, "sloserve_training_predictable", job="budget") >= 0

    # the GPU is free: the unpredictable job runs (never starved), its curve does not make it predictable
    assert wait_for(lambda: job(s, "curve")["state"] == "running", 60), job(s, "curve")
    assert wait_for(lambda: job(s, "curve")["checkpoint_iteration"] >= 200, 90), job(s, "curve")
    p = job(s, "curve")["prediction"]
    assert p["predictable"] is False and p["order"] == "las", p
    post(s, "/v2/training/jobs/curve", {}, method="DELETE")
    assert wait_for(lambda: job(s, "curve")["state"] == "cancelled", 30)


def test_queue_reorders_for_a_deadline_when_its_prediction_says_so(server):
    s = server
    code, _ = post(
        s,
        "/v2/training/jobs",
        {
            "job_id": "long",
            "config": {"iterations": 0, "checkpoint_every": 50, "iteration_delay_s": 0.01},
            "model_class": "resnet18",
        },
    )
    assert code == 201
    assert wait_for(lambda: job(s, "long")["state"] == "running" and job(s, "long")["iteration"] > 50, 60)
    # impossible: 2000 iterations at 0.05 s cannot finish in 20 s even alone -> refused, naming the field
    try:
        post(
            s,
            "/v2/training/jobs",
            {
                "job_id": "never",
                "model_class": "resnet18",
                "total_iterations": 2000,
                "iteration_time_s": 0.05,
                "deadline_s": 20,
            },
        )
        raise AssertionError("an impossible deadline was accepted")
    except urllib.error.HTTPError as e:
        assert e.code == 400 and "deadline_s" in e.read().decode()
    code, info = post(
        s,
        "/v2/training/jobs",
        {
            "job_id": "due",
            "config": {"iterations": 200, "checkpoint_every": 50, "iteration_delay_s": 0.02},
            "total_iterations": 200,
            "iteration_time_s": 0.04,
            "model_class": "resnet18",
            "deadline_s": 40,
        },
    )
    assert code == 201
    assert wait_for(lambda: (job(s, "due").get("prediction") or {}).get("slo") is True, 10), job(s, "due")
    # first it waits: the running job keeps the GPU while the deadline is far
    time.sleep(3)
    assert job(s, "due")["state"] == "queued" and job(s, "long")["state"] == "running"
    # then its predicted remaining time says it must start: head of the queue, the other preempted
    assert wait_for(lambda: job(s, "due")["state"] in ("running", "finished"), 90), (job(s, "due"), s.output())
    assert job(s, "long")["preemptions"] >= 1
    assert wait_for(lambda: job(s, "due")["state"] == "finished", 90), job(s, "due")
    assert wait_for(lambda: job(s, "long")["state"] == "running", 60), job(s, "long")
    post(s, "/v2/training/jobs/long", {}, method="DELETE")
