"""TrainingManager, its HTTP router and the placement metrics, in-process (thread launcher)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from autoscaler.placement.metrics import gpu_usage
from autoscaler.placement.types import (
    Gpu,
    PlacementSnapshot,
    Replica,
    ReplicaTarget,
)
from autoscaler.training.job import TrainingSpec
from autoscaler.training.manager import ThreadLauncher, TrainingManager
from gateway.transports.training import training_router
from tests.unit.placement.factories import job


def _spec(job_id="j", **kw):
    return TrainingSpec(
        job_id=job_id, dataset="synthetic", hidden=8, **{"total_iterations": 30, "checkpoint_every": 10, **kw}
    )


def test_submit_run_list_and_resume_after_preempt(tmp_path):
    m = TrainingManager(tmp_path, launcher=ThreadLauncher())
    m.submit(_spec(), start=False)
    assert [(i.job_id, i.state) for i in m.list()] == [("j", "queued")]
    m.start("j")
    info = m.wait("j", timeout_s=60)
    assert (info.state, info.iteration, info.checkpoint_iteration) == ("finished", 30, 30)
    with pytest.raises(ValueError):
        m.submit(_spec())
    with pytest.raises(ValueError):
        m.start("j")  # finished jobs do not restart
    with pytest.raises(KeyError):
        m.get("../etc")


def test_preempt_then_resume_continues_from_checkpoint(tmp_path):
    m = TrainingManager(tmp_path, launcher=ThreadLauncher())
    m.submit(_spec(total_iterations=None), start=False)
    # preempting before it runs just marks it; a running thread stops at its next boundary
    m.start("j")
    info = m.preempt("j", grace_s=30)
    assert info.state == "preempted" and info.iteration == info.checkpoint_iteration
    again = m.start("j")
    assert again.state == "running"
    done = m.cancel("j", grace_s=30)
    assert done.state == "cancelled" and done.checkpoint_iteration >= info.checkpoint_iteration


def test_corrupt_checkpoint_is_named_in_status_list_and_http(tmp_path, capsys):
    m = TrainingManager(tmp_path, launcher=ThreadLauncher())
    m.submit(_spec(total_iterations=20), start=False)
    m.start("j")
    assert m.wait("j", timeout_s=60).state == "finished"
    ckpts = tmp_path / "j" / "checkpoints"
    newest = max(ckpts.glob("*.ckpt"))
    data = bytearray(newest.read_bytes())
    data[-5] ^= 0xFF  # a flipped bit in the newest checkpoint
    newest.write_bytes(bytes(data))
    m._save("j", state="preempted")  # as if preempted after that write: resumable
    m.start("j")
    info = m.wait("j", timeout_s=60)
    assert info.state == "finished"
    assert len(info.corrupt_checkpoints) == 1 and info.corrupt_checkpoints[0].startswith(newest.name)
    assert "checksum" in info.corrupt_checkpoints[0]
    assert newest.exists()  # kept for a person to look at

    from gateway.cli.train import _print

    _print([info], as_json=False)
    assert f"corrupt checkpoint skipped: {newest.name}" in capsys.readouterr().out
    app = FastAPI()
    app.include_router(training_router(m, lambda: {}))
    body = TestClient(app).get("/v2/training/jobs/j").json()
    assert body["corrupt_checkpoints"] == info.corrupt_checkpoints


def test_http_router(tmp_path):
    m = TrainingManager(tmp_path, launcher=ThreadLauncher())
    app = FastAPI()
    app.include_router(training_router(m, lambda: {}))
    c = TestClient(app)
    r = c.post("/v2/training/jobs", json=_spec("h").model_dump(mode="json"))
    assert r.status_code == 201 and r.json()["job_id"] == "h"
    m.wait("h", timeout_s=60)
    assert c.get("/v2/training/jobs").json()["jobs"][0]["state"] == "finished"
    assert c.get("/v2/training/jobs/nope").status_code == 404
    assert c.post("/v2/training/jobs", json=_spec("h").model_dump(mode="json")).status_code == 409
    assert c.post("/v2/training/jobs", json={"job_id": "../x"}).status_code == 422
    assert c.delete("/v2/training/jobs/h").json()["state"] == "finished"


def test_gpu_usage():
    snap = PlacementSnapshot(
        gpus=(Gpu("a", "T4", 16384), Gpu("b", "T4", 16384), Gpu("c", "A100", 40960)),
        targets=(ReplicaTarget("m", "v", "T4", 2, 8192),),
        replicas=(Replica("r", "m", "v", "a", 1024),),
        jobs=(job("j", ["a"], memory_mib=4096), job("k", ["b"], memory_mib=12288)),
    )
    usage = gpu_usage(snap)
    assert usage[("T4", "shared")] == 1 and usage[("T4", "training")] == 1 and usage[("A100", "idle")] == 1
