"""Training jobs on a real local Ray with emulated T4s and an A100 and real PyTorch (the demo CNN on digits):
a 2-worker gang is preempted at an iteration boundary and resumes from its checkpoint on another GPU type; one killed
past its grace period loses only the work since its last checkpoint and returns its GPUs; a corrupt
checkpoint is named and the previous good one used; a crashing job fails with its traceback and
returns its GPUs; a job asking for more GPUs than the cluster has is refused."""

from __future__ import annotations

import time

import pytest

from sloserve.training.checkpoint import list_checkpoints
from sloserve.training.job import JobRejected, TrainingSpec
from sloserve.training.manager import TrainingManager

pytestmark = pytest.mark.integration
EVERY = 20


@pytest.fixture(scope="module")
def ray_t4():
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=3,
        resources={"accelerator_type:T4": 2.0, "accelerator_type:A100": 1.0},
        include_dashboard=False,
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


@pytest.fixture
def manager(ray_t4, tmp_path):
    from sloserve.training.runtime import RayLauncher

    # the entries these tests run (training.entries in a gateway: the demo and the crashing job)
    entries = ["sloserve.training.demo:train", "tests.integration.training_jobs:crash"]
    return TrainingManager(tmp_path, launcher=RayLauncher(backend="gloo"), grace_s=10.0, entries=entries)


def _wait(cond, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def _gpus_free(ray) -> bool:
    return _wait(lambda: ray.available_resources().get("GPU", 0) >= 3 - 1e-6, 10)


def _demo(job_id, **config):
    return TrainingSpec(
        job_id=job_id,
        workers=2,
        gpu_type="T4",
        checkpoint_every=EVERY,
        config={"iterations": 0, "checkpoint_every": EVERY, **config},
    )


def test_gang_preempted_resumed_killed_and_corrupt_checkpoint(ray_t4, manager):
    m = manager
    m.submit(_demo("g"))
    assert _wait(lambda: m.get("g").checkpoint_iteration >= EVERY, 120), m.get("g")
    info = m.preempt("g", grace_s=20)
    assert m.last_stop("g") == "checkpointed" and info.state == "preempted", info
    ck = info.checkpoint_iteration
    assert ck >= EVERY and info.iteration == ck and info.lost_iterations == 0, info
    assert _gpus_free(ray_t4)

    # resume on another GPU type: the new run starts from that checkpoint and keeps training
    assert m.start("g", gpu_type="A100").gpu_type == "A100"
    assert _wait(lambda: m.get("g").checkpoint_iteration > ck, 120), m.get("g")
    st = m.get("g")
    import json

    status = json.loads((m.dir / "g" / "status.json").read_text())
    assert status["resumed_from"] == ck and status["run"] == 2, status

    # killed past a zero grace period: loses only what ran since the last checkpoint
    info = m.preempt("g", grace_s=0)
    assert m.last_stop("g") == "killed" and info.state == "preempted", info
    assert 0 <= info.lost_iterations <= EVERY + 5, info  # one checkpoint interval (+ the poll)
    assert info.checkpoint_iteration >= st.checkpoint_iteration
    assert _gpus_free(ray_t4)

    # corrupt the newest checkpoint: the next run names it and resumes from the one before
    newest, older = list_checkpoints(m.dir / "g" / "storage")[:2]
    (newest / "state.pt").write_bytes(b"torn")
    m.start("g")
    assert _wait(lambda: json.loads((m.dir / "g" / "status.json").read_text()).get("run") == 3, 60)
    status = json.loads((m.dir / "g" / "status.json").read_text())
    assert status["resumed_from"] == int(older.name.split("_")[1]), status
    assert any(newest.name in c and "checksum" in c for c in m.get("g").corrupt_checkpoints), m.get("g")
    assert m.cancel("g", grace_s=20).state == "cancelled"
    assert _gpus_free(ray_t4)


def test_crashing_job_fails_with_its_traceback_and_returns_its_gpus(ray_t4, manager):
    m = manager
    m.submit(TrainingSpec(job_id="c", entry="tests.integration.training_jobs:crash", workers=2, config={"why": "x"}))
    info = m.wait("c", timeout_s=120)
    assert info.state == "failed" and info.error and "this job crashes on purpose (x)" in info.error, info
    assert _gpus_free(ray_t4)


def test_more_gpus_than_the_cluster_has_is_refused(manager):
    with pytest.raises(JobRejected, match="asks for 4 GPUs; the cluster has 3"):
        manager.submit(TrainingSpec(job_id="big", workers=4))
    with pytest.raises(JobRejected, match="no V100 GPUs"):
        manager.submit(TrainingSpec(job_id="v100", gpu_type="V100"))
    assert manager.list() == []
