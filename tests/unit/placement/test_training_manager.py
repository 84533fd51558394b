"""TrainingManager's job table and its HTTP router without running a job (jobs are queued, not
started: running one needs Ray, tests/integration/test_checkpoint_crash.py), and the placement
metrics."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sloserve.autoscaler.placement.metrics import gpu_usage
from sloserve.autoscaler.placement.types import Gpu, PlacementSnapshot, Replica, ReplicaTarget
from sloserve.gateway.tokens import TokenTable
from sloserve.gateway.transports.training import training_router
from sloserve.training.checkpoint import write_json_atomic
from sloserve.training.job import DEMO_ENTRY
from sloserve.training.manager import SubprocessLauncher, TrainingManager
from tests.unit.placement.factories import job

TOKENS = TokenTable.parse("team-a-token-1 * training team-a")
AUTH = {"authorization": "Bearer team-a-token-1"}


class _Queued:
    """The router over a manager that only queues (the harvest controller's view does the same)."""

    def __init__(self, m: TrainingManager):
        self.m = m

    def submit(self, spec):
        return self.m.submit(spec, start=False)

    def __getattr__(self, name):
        return getattr(self.m, name)


def _client(tmp_path, entries=(DEMO_ENTRY,)):
    m = TrainingManager(tmp_path, launcher=SubprocessLauncher(), entries=entries)
    app = FastAPI()
    app.include_router(training_router(_Queued(m), lambda: {}, TOKENS))
    return m, TestClient(app, headers=AUTH)


def test_http_submit_list_get_and_the_new_job_form(tmp_path):
    m, c = _client(tmp_path)
    body = {"job_id": "h", "entry": "sloserve.training.demo:train", "config": {"iterations": 10}, "workers": 2}
    r = c.post("/v2/training/jobs", json=body)
    assert r.status_code == 201, r.text
    j = r.json()
    assert (j["state"], j["num_gpus"], j["entry"], j["lost_iterations"], j["error"]) == (
        "queued",
        2,
        body["entry"],
        0,
        None,
    )
    assert m.spec("h").config == {"iterations": 10}
    assert c.get("/v2/training/jobs").json()["jobs"][0]["job_id"] == "h"
    assert c.get("/v2/training/jobs/nope").status_code == 404
    assert c.post("/v2/training/jobs", json=body).status_code == 409
    assert c.post("/v2/training/jobs", json={"job_id": "../x"}).status_code == 422
    assert c.delete("/v2/training/jobs/h").json()["state"] == "cancelled"


def test_http_an_entry_that_does_not_import_is_a_400_naming_it(tmp_path):
    _, c = _client(tmp_path, entries=("nope_pkg.train:main",))
    r = c.post("/v2/training/jobs", json={"job_id": "bad", "entry": "nope_pkg.train:main"})
    assert r.status_code == 400 and "nope_pkg.train" in r.json()["detail"], r.text
    assert c.get("/v2/training/jobs").json()["jobs"] == []  # nothing half-created


def test_status_shows_checkpoint_corrupt_ones_and_a_failed_jobs_traceback(tmp_path, capsys):
    from sloserve.cli import main

    m = TrainingManager(tmp_path, launcher=SubprocessLauncher())
    from sloserve.training.job import TrainingSpec

    m.submit(TrainingSpec(job_id="f"), start=False)
    m._save("f", state="running", launcher="elsewhere")
    write_json_atomic(
        tmp_path / "f" / "status.json",
        {
            "status": "failed",
            "iteration": 7,
            "checkpoint_iteration": 5,
            "checkpoint": "run-1/checkpoint_0000000005",
            "corrupt_checkpoints": ["run-1/checkpoint_0000000010: state.pt fails its checksum"],
            "error": "Traceback (most recent call last):\nRuntimeError: boom",
        },
    )
    info = m.get("f")
    assert (info.state, info.checkpoint_iteration, info.checkpoint) == ("failed", 5, "run-1/checkpoint_0000000005")
    assert info.error is not None and info.error.endswith("RuntimeError: boom")
    assert main(["train", "list", "--jobs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "last checkpoint: run-1/checkpoint_0000000005" in out
    assert "corrupt checkpoint skipped: run-1/checkpoint_0000000010" in out and "RuntimeError: boom" in out


def test_cli_submit_refuses_a_bad_entry_and_bad_config(tmp_path, capsys):
    from sloserve.cli import main

    args = ["train", "submit", "j", "--jobs-dir", str(tmp_path)]
    assert main([*args, "--entry", "nope_pkg.x:train"]) == 2
    assert "cannot import nope_pkg.x" in capsys.readouterr().err
    assert main([*args, "--config", "[1, 2]"]) == 2
    assert "--config must be a JSON object" in capsys.readouterr().err
    assert main([*args, "--workers", "0"]) == 2
    assert "workers" in capsys.readouterr().err
    assert not (tmp_path / "j").exists()


def test_gpu_usage():
    snap = PlacementSnapshot(
        gpus=(Gpu("a", "T4", 16384), Gpu("b", "T4", 16384), Gpu("c", "A100", 40960)),
        targets=(ReplicaTarget("m", "v", "T4", 2, 8192),),
        replicas=(Replica("r", "m", "v", "a", 1024),),
        jobs=(job("j", ["a"], memory_mib=4096), job("k", ["b"], memory_mib=12288)),
    )
    usage = gpu_usage(snap)
    assert usage[("T4", "shared")] == 1 and usage[("T4", "training")] == 1 and usage[("A100", "idle")] == 1


class _TypedLauncher(SubprocessLauncher):
    """Checks a job against a cluster of T4s and A100s; starts nothing."""

    def check(self, spec):
        from sloserve.training.job import JobRejected

        if spec.gpu_type not in ("T4", "A100"):
            raise JobRejected(f"the cluster has no {spec.gpu_type} GPUs (it has: A100, T4)")

    def start(self, spec, job_dir):
        class _H:
            pid = None

            def alive(self):
                return True

        self.started = spec
        return _H()


def test_resume_on_another_gpu_type_rewrites_the_spec_and_refuses_a_type_the_cluster_lacks(tmp_path):
    from sloserve.training.job import JobRejected, TrainingSpec

    launcher = _TypedLauncher()
    m = TrainingManager(tmp_path, launcher=launcher)
    m.submit(TrainingSpec(job_id="mv", gpu_type="T4"), start=False)
    m._save("mv", state="preempted")
    with pytest.raises(JobRejected, match="no H100"):  # a type the cluster lacks is refused
        m.start("mv", gpu_type="H100")
    assert m.spec("mv").gpu_type == "T4"  # nothing changed
    info = m.start("mv", gpu_type="A100")
    assert (info.state, info.gpu_type, launcher.started.gpu_type) == ("running", "A100", "A100")
    with pytest.raises(ValueError, match="preempt it before moving it"):  # a running job keeps its type
        m.start("mv", gpu_type="T4")


def test_http_resume_takes_a_gpu_type(tmp_path):
    from sloserve.training.job import TrainingSpec

    m = TrainingManager(tmp_path, launcher=_TypedLauncher())
    app = FastAPI()
    app.include_router(training_router(m, lambda: {}, TOKENS))
    c = TestClient(app, headers=AUTH)
    m.submit(TrainingSpec(job_id="h2", gpu_type="T4", tenant="team-a"), start=False)
    m._save("h2", state="preempted")
    r = c.post("/v2/training/jobs/h2/resume", json={"gpu_type": "V100"})
    assert r.status_code == 400 and "no V100" in r.json()["detail"], r.text
    r = c.post("/v2/training/jobs/h2/resume", json={"gpu_type": "A100"})
    assert r.status_code == 200 and r.json()["gpu_type"] == "A100", r.text
    assert c.post("/v2/training/jobs/h2/resume", json={"gpu": "A100"}).status_code == 422
