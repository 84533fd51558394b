"""Elastic training live: a job that declares ``min_workers`` keeps training on fewer Ray Train
workers when inference reclaims part of its gang, and grows back when the GPU returns.

Three emulated T4s: one inference replica (autoscaling 1..2) and a 2-worker gang of the PyTorch demo
with ``min_workers`` 1. A load step makes the autoscaler want a second replica; the controller
preempts the gang (checkpoint at an iteration boundary), the replica takes the freed GPU, and the
queue restarts the job on the one GPU left, from its checkpoint. When the load stops and the
replica scales in, the job is resized back to 2 workers (checkpoint, restart on the larger gang).
"""

from __future__ import annotations

import pytest

from tests.integration.test_autoscaling_live import wait_for
from tests.integration.test_harvest_live import get, metric, offered_load, post, start_harvest_server, status

pytestmark = pytest.mark.integration
CHECKPOINT_EVERY = 50


@pytest.fixture(scope="module")
def elastic_server(model_repo, tmp_path_factory):
    s = start_harvest_server(model_repo, tmp_path_factory, gpus=3)
    yield s
    s.stop()


def job(s) -> dict:
    return get(s, "/v2/training/jobs/elastic-1")


def test_elastic_job_shrinks_for_inference_and_grows_back(elastic_server):
    s = elastic_server
    code, info = post(
        s,
        "/v2/training/jobs",
        {
            "job_id": "elastic-1",
            "config": {"iterations": 0, "checkpoint_every": CHECKPOINT_EVERY, "iteration_delay_s": 0.01},
            "checkpoint_every": CHECKPOINT_EVERY,
            "workers": 2,
            "min_workers": 1,
            "gpu_type": "T4",
        },
    )
    assert code == 201 and info["min_workers"] == 1
    assert wait_for(
        lambda: (
            job(s)["state"] == "running"
            and job(s)["workers"] == 2
            and status(s, "elastic-1")["checkpoint_iteration"] >= CHECKPOINT_EVERY
        ),
        60,
    ), (job(s), s.output())

    # load step: the second replica takes one of the gang's GPUs; the job goes on, on one worker
    with offered_load(s):
        assert wait_for(
            lambda: (
                metric(s, "sloserve_replicas", model="digits", state="running") == 2
                and job(s)["state"] == "running"
                and job(s)["workers"] == 1
            ),
            60,
        ), (job(s), get(s, "/v2/training/placement"), s.output())
        # the new run's driver writes its status once it starts: resumed from the checkpoint
        assert wait_for(lambda: (status(s, "elastic-1")["resumed_from"] or 0) >= CHECKPOINT_EVERY, 30), status(
            s, "elastic-1"
        )
        shrunk = status(s, "elastic-1")
        assert wait_for(lambda: status(s, "elastic-1")["iteration"] > shrunk["resumed_from"], 30)
    info = job(s)
    assert info["preemptions"] >= 1 and info["queue_position"] is not None and info["attained_gpu_s"] > 0, info
    assert metric(s, "sloserve_training_reclaim_seconds_count", device_type="t4") >= 1

    # load gone: the replica scales in after its keep-alive and the job grows back to its gang
    assert wait_for(lambda: job(s)["state"] == "running" and job(s)["workers"] == 2, 90), (
        job(s),
        get(s, "/v2/training/placement"),
        s.output(),
    )
    assert wait_for(lambda: status(s, "elastic-1")["run"] > shrunk["run"], 30), status(s, "elastic-1")
    grown = status(s, "elastic-1")
    assert grown["resumed_from"] >= shrunk["resumed_from"]
    assert wait_for(lambda: status(s, "elastic-1")["iteration"] > grown["resumed_from"], 30)
    assert post(s, "/v2/training/jobs/elastic-1", {}, method="DELETE")[1]["state"] == "cancelled"
