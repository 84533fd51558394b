"""The training API against a hostile local user, without Ray: only listed entries run (checked
before any import), every route needs a token with the ``training`` scope even on loopback, a job
belongs to its submitter's tenant, checkpoints load without unpickling code, the caps on jobs,
configs, checkpoints and ended jobs' files, and a standalone cancel that never signals a reused pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sloserve.gateway.tokens import TokenTable
from sloserve.gateway.transports.training import training_router
from sloserve.training.checkpoint import checkpoint_dir_name, list_checkpoints, prune, write_manifest
from sloserve.training.job import DEMO_ENTRY, EntryNotAllowed, JobLimit, JobRejected, TrainingSpec
from sloserve.training.manager import SubprocessLauncher, TrainingManager, create_time
from tests.unit.placement.test_training_manager import _Queued

TOKENS = TokenTable.parse(
    "team-a-token-1 * infer,training team-a\n"
    "team-b-token-1 * training team-b\n"
    "ops-admin-token * training,admin\n"
    "no-tenant-token * training\n"
)
A, B, ADMIN, NOBODY = (
    {"authorization": f"Bearer {t}"} for t in ("team-a-token-1", "team-b-token-1", "ops-admin-token", "no-tenant-token")
)


class _NoStart(SubprocessLauncher):
    """Checks like the standalone launcher; starts nothing."""

    def start(self, spec, job_dir):
        class _H:
            pid = None

            def alive(self):
                return True

        return _H()


def _client(tmp_path, tokens=TOKENS, report=lambda: {}, **kw):
    m = TrainingManager(tmp_path / "jobs", launcher=SubprocessLauncher(), **kw)
    app = FastAPI()
    app.include_router(training_router(_Queued(m), report, tokens))
    return m, TestClient(app)


# ---- 1. entries from the operator's list only, checked before any import ----------------------------
def test_an_entry_off_the_allow_list_is_a_403_naming_the_setting_and_is_never_imported(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "evil_entry_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\n\ndef train(config):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    m, c = _client(tmp_path)
    for entry in ("evil_entry_mod:train", "subprocess:run", "os:system"):
        r = c.post("/v2/training/jobs", json={"job_id": "x", "entry": entry, "config": {"args": ["id"]}}, headers=A)
        assert r.status_code == 403 and "training.entries" in r.json()["detail"], r.text
    assert not marker.exists() and "evil_entry_mod" not in sys.modules
    assert m.list() == [] and not (m.dir / "x").exists()
    # listed: it is imported (and checked) as before
    m2 = TrainingManager(tmp_path / "jobs2", launcher=_NoStart(), entries=["evil_entry_mod:train"])
    m2.submit(TrainingSpec(job_id="ok", entry="evil_entry_mod:train"), start=False)
    assert marker.exists()


def test_a_spec_written_into_the_jobs_dir_by_hand_is_refused_at_start(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "edited_entry_mod.py").write_text(f"open({str(marker)!r}, 'w').close()\ntrain = print\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    m = TrainingManager(tmp_path / "jobs", launcher=_NoStart())
    m.submit(TrainingSpec(job_id="j"), start=False)
    spec = json.loads((m.dir / "j" / "spec.json").read_text())
    (m.dir / "j" / "spec.json").write_text(json.dumps({**spec, "entry": "edited_entry_mod:train"}))
    with pytest.raises(EntryNotAllowed, match="training.entries"):  # moving it to another GPU type too
        m.start("j", gpu_type="A100")
    with pytest.raises(EntryNotAllowed, match="training.entries"):
        m.start("j")
    info = m.get("j")
    assert info.state == "failed" and "training.entries" in (info.error or ""), info
    assert not marker.exists() and "edited_entry_mod" not in sys.modules


def test_the_default_allow_list_is_the_demo_and_a_bad_entry_stops_start_up():
    from pydantic import ValidationError

    from sloserve.gateway.config import Settings

    assert Settings().training.entries == [DEMO_ENTRY]
    with pytest.raises(ValidationError, match="training.entries"):
        Settings(training={"entries": ["not an entry"]})


# ---- 2. a token with the training scope, on loopback too -------------------------------------------
def test_without_a_token_table_every_training_route_is_a_401_saying_how_to_add_one(tmp_path):
    m, c = _client(tmp_path, tokens=None)
    for method, path in (
        ("POST", "/v2/training/jobs"),
        ("GET", "/v2/training/jobs"),
        ("GET", "/v2/training/jobs/j"),
        ("POST", "/v2/training/jobs/j/preempt"),
        ("POST", "/v2/training/jobs/j/resume"),
        ("DELETE", "/v2/training/jobs/j"),
        ("GET", "/v2/training/placement"),
    ):
        r = c.request(method, path, json={"job_id": "j"} if method == "POST" else None)
        assert r.status_code == 401, (path, r.text)
        assert "auth_tokens" in r.json()["detail"] and r.headers["www-authenticate"].startswith("Bearer"), r.text
    assert m.list() == []


def test_with_a_token_table_the_training_scope_is_needed(tmp_path):
    _, c = _client(tmp_path, tokens=TokenTable.parse("infer-token-1 *\nteam-a-token-1 * training team-a"))
    assert c.get("/v2/training/jobs").status_code == 401
    assert c.get("/v2/training/jobs", headers={"authorization": "Bearer wrong-token"}).status_code == 401
    r = c.get("/v2/training/jobs", headers={"authorization": "Bearer infer-token-1"})
    assert r.status_code == 403 and "'training' scope" in r.json()["detail"]
    assert c.get("/v2/training/jobs", headers=A).status_code == 200


# ---- 3. a job belongs to its submitter's tenant -------------------------------------------------------
def test_a_job_belongs_to_the_submitting_tokens_tenant_and_is_hidden_from_others(tmp_path):
    report = {
        "policy": "cost-aware",
        "reclaims": [{"job_id": "a1"}, {"job_id": "b1"}],
        "last_decision": {
            "preempt": ["b1"],
            "start_training": ["a1"],
            "training_queue": [{"job_id": "a1", "tenant": "team-a"}, {"job_id": "b1", "tenant": "team-b"}],
        },
    }
    m, c = _client(tmp_path, report=lambda: report)
    r = c.post("/v2/training/jobs", json={"job_id": "a1"}, headers=A)
    assert r.status_code == 201 and r.json()["tenant"] == "team-a", r.text
    assert c.post("/v2/training/jobs", json={"job_id": "b1", "tenant": "team-b"}, headers=B).status_code == 201
    # a caller-written tenant that is not the token's is refused; the token's own is fine
    r = c.post("/v2/training/jobs", json={"job_id": "a2", "tenant": "team-b"}, headers=A)
    assert r.status_code == 403 and "team-a" in r.json()["detail"], r.text
    r = c.post("/v2/training/jobs", json={"job_id": "n1"}, headers=NOBODY)
    assert r.status_code == 403 and "names no tenant" in r.json()["detail"], r.text
    assert {j["job_id"] for j in c.get("/v2/training/jobs", headers=A).json()["jobs"]} == {"a1"}
    assert {j["job_id"] for j in c.get("/v2/training/jobs", headers=NOBODY).json()["jobs"]} == set()
    # another tenant's job does not exist for B: the same 404 as a job that does not exist
    gone = c.get("/v2/training/jobs/nope", headers=B)
    for method, path in (
        ("GET", "/v2/training/jobs/a1"),
        ("POST", "/v2/training/jobs/a1/preempt"),
        ("POST", "/v2/training/jobs/a1/resume"),
        ("DELETE", "/v2/training/jobs/a1"),
    ):
        r = c.request(method, path, headers=B)
        assert r.status_code == 404 == gone.status_code and r.json()["detail"] == "no training job 'a1'", (path, r.text)
    assert m.get("a1").state == "queued"
    # the placement report shows each tenant its own jobs only
    p = c.get("/v2/training/placement", headers=B).json()
    assert [x["job_id"] for x in p["reclaims"]] == ["b1"] and p["last_decision"]["start_training"] == []
    assert [e["job_id"] for e in p["last_decision"]["training_queue"]] == ["b1"]
    # admin: every job, any tenant
    assert c.get("/v2/training/placement", headers=ADMIN).json() == report
    assert {j["job_id"] for j in c.get("/v2/training/jobs", headers=ADMIN).json()["jobs"]} == {"a1", "b1"}
    r = c.post("/v2/training/jobs", json={"job_id": "c1", "tenant": "team-c"}, headers=ADMIN)
    assert r.status_code == 201 and r.json()["tenant"] == "team-c"
    assert c.delete("/v2/training/jobs/b1", headers=ADMIN).json()["state"] == "cancelled"
    assert c.delete("/v2/training/jobs/a1", headers=A).json()["state"] == "cancelled"


# ---- 4. checkpoints load with weights_only=True ---------------------------------------------------------
class _Payload:
    def __reduce__(self):
        return (os.system, ("touch " + str(_Payload.marker),))

    marker = Path("/nonexistent")


def _checkpoint(d: Path, state, iteration: int = 10) -> Path:
    import torch

    d.mkdir(parents=True)
    torch.save(state, d / "state.pt")
    write_manifest(d, iteration, {})
    return d


def test_a_checkpoint_holding_a_pickled_object_is_refused_and_runs_nothing(tmp_path):
    import pickle

    from sloserve.training.session import read_state

    _Payload.marker = tmp_path / "pwned"
    d = _checkpoint(tmp_path / "run-1" / checkpoint_dir_name(10), {"iteration": 10, "x": _Payload()})
    with pytest.raises(pickle.UnpicklingError):
        read_state(d)
    assert not _Payload.marker.exists()


def test_the_demo_state_is_saved_and_read_back_as_tensors_and_plain_values(tmp_path):
    import torch

    from sloserve.training import demo
    from sloserve.training.session import check_plain, read_state

    net = demo.build_model(4)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    net(torch.zeros(2, 1, 8, 8)).sum().backward()
    opt.step()
    state = {"iteration": 7, "model": net.state_dict(), "optimizer": opt.state_dict()}
    check_plain(state)  # what session.save checks first
    back = read_state(_checkpoint(tmp_path / "c", state, 7))
    net2 = demo.build_model(4)
    net2.load_state_dict(back["model"])
    torch.optim.SGD(net2.parameters(), lr=0.05, momentum=0.9).load_state_dict(back["optimizer"])
    assert back["iteration"] == 7 and torch.equal(net2[0].weight, net[0].weight)
    with pytest.raises(TypeError, match=r"state\['opt'\] is a SGD"):
        check_plain({"opt": opt})


# ---- 5. caps --------------------------------------------------------------------------------------------
def test_a_config_over_max_config_bytes_is_a_400_naming_the_setting(tmp_path):
    m, c = _client(tmp_path, max_config_bytes=1000)
    r = c.post("/v2/training/jobs", json={"job_id": "big", "config": {"pad": "x" * 1000}}, headers=A)
    assert r.status_code == 400 and "training.max_config_bytes" in r.json()["detail"], r.text
    assert (
        c.post("/v2/training/jobs", json={"job_id": "ok", "config": {"pad": "x" * 900}}, headers=A).status_code == 201
    )


def test_max_jobs_counts_ended_jobs_until_their_files_are_removed(tmp_path):
    m, c = _client(tmp_path, max_jobs=2, retain_ended_s=3600)
    for j in ("j1", "j2"):
        assert c.post("/v2/training/jobs", json={"job_id": j}, headers=A).status_code == 201
    assert c.delete("/v2/training/jobs/j1", headers=A).json()["state"] == "cancelled"
    r = c.post("/v2/training/jobs", json={"job_id": "j3"}, headers=A)
    assert r.status_code == 409 and "training.max_jobs" in r.json()["detail"], r.text
    with pytest.raises(JobLimit):
        m.submit(TrainingSpec(job_id="j3", tenant="team-a"), start=False)
    # past the retention the cancelled job's directory goes, and its place with it
    assert m.sweep(now=time.time() + 3601) == ["j1"] and not (m.dir / "j1").exists()
    assert c.post("/v2/training/jobs", json={"job_id": "j3"}, headers=A).status_code == 201
    assert [j.job_id for j in m.list()] == ["j2", "j3"]


def test_ended_jobs_are_removed_after_retain_ended_s_and_others_stay(tmp_path):
    from sloserve.training.checkpoint import write_json_atomic

    m = TrainingManager(tmp_path, launcher=_NoStart(), retain_ended_s=60)
    for j in ("fin", "can", "pre", "que"):
        m.submit(TrainingSpec(job_id=j), start=False)
    now = time.time()
    m._save("fin", state="running", launcher="elsewhere")
    write_json_atomic(tmp_path / "fin" / "status.json", {"status": "finished", "finished_at": now - 120})
    m.cancel("can")
    m._save("pre", state="preempted")
    assert m.sweep(now=now + 30) == ["fin"]  # finished 2 min ago; cancelled only just
    assert m.sweep(now=now + 61) == ["can"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pre", "que"]
    # retain_ended_s 0: a cancelled job's files go with the cancel
    m0 = TrainingManager(tmp_path / "zero", launcher=_NoStart(), retain_ended_s=0)
    m0.submit(TrainingSpec(job_id="z"), start=False)
    assert m0.cancel("z").state == "cancelled" and not (tmp_path / "zero" / "z").exists()


def _fill(storage: Path, runs: dict[int, list[int]]) -> None:
    for run, its in runs.items():
        for it in its:
            d = storage / f"run-{run}" / checkpoint_dir_name(it)
            d.mkdir(parents=True)
            (d / "state.pt").write_bytes(b"w%d" % it)
            write_manifest(d, it, {})


def test_checkpoints_are_kept_per_job_across_resumes(tmp_path):
    storage = tmp_path / "s"
    _fill(storage, {1: [10, 20], 2: [30, 40], 3: [50, 60]})
    (storage / "run-4").mkdir()  # the newest run, before its first checkpoint
    (storage / "run-3" / checkpoint_dir_name(60) / "state.pt").write_bytes(b"torn")  # corrupt, newest
    removed = prune(storage, keep=2)
    left = [f"{p.parent.name}/{p.name}" for p in list_checkpoints(storage)]
    assert left == ["run-3/checkpoint_0000000060", "run-3/checkpoint_0000000050", "run-2/checkpoint_0000000040"]
    assert len(removed) == 3 and not (storage / "run-1").exists() and (storage / "run-4").is_dir()

    # the manager prunes at every start and resume
    m = TrainingManager(tmp_path / "jobs", launcher=_NoStart(), keep_checkpoints=1)
    m.submit(TrainingSpec(job_id="k"), start=False)
    _fill(m.dir / "k" / "storage", {1: [10, 20], 2: [30, 40]})
    m._save("k", state="preempted")
    m.start("k")
    assert [p.name for p in list_checkpoints(m.dir / "k" / "storage")] == [checkpoint_dir_name(40)]


# ---- 6. a standalone cancel signals only the process it started ------------------------------------------
def test_standalone_cancel_never_signals_a_pid_that_is_now_another_process(tmp_path):
    m = TrainingManager(tmp_path, launcher=SubprocessLauncher(), entries=None)
    m.submit(TrainingSpec(job_id="p"), start=False)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        real = create_time(proc.pid)
        assert real is not None
        # the recorded process was another one that had this pid (it started at another time)
        m._save("p", state="running", launcher="subprocess", pid=proc.pid, pid_created=real - 100.0)
        info = m.cancel("p", grace_s=0.2)
        assert info.state == "cancelled" and proc.poll() is None, "signalled a process it never started"
        # no create time recorded: the pid alone is not trusted either
        m._save("p", state="running", pid_created=None)
        m.cancel("p", grace_s=0.2)
        assert proc.poll() is None
        # the very process: stopped
        m._save("p", state="running", pid_created=real)
        m.cancel("p", grace_s=0.2)
        assert proc.wait(10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_job_rejected_for_its_entry_is_a_job_rejected():
    assert issubclass(EntryNotAllowed, JobRejected) and not issubclass(JobLimit, JobRejected)
