"""`sloserve serve --workers 2` with preemptible training: every worker serves ``/v2/training`` over
the same jobs, one of them (the holder of the jobs directory's leader lock) places them, and a job's
run belongs to no worker.

A job is submitted and placed on the idle emulated T4; every one of several fresh connections (the
kernel spreads them over both workers) lists it; the worker that leads and started it is killed: the
job keeps running, the other worker takes the lead, and the job is seen and cancelled through the
survivors.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import urllib.error
import urllib.request

import psutil
import pytest

from sloserve.loadtests.bench.reclaim import AUTH, harvest_setup
from tests.conftest import ServerProcess
from tests.integration.test_workers import all_serving, serving, workers

pytestmark = pytest.mark.integration
JOB = "shared-1"


def call(server, path: str, method: str = "GET", body: dict | None = None) -> tuple[int, dict]:
    """One request on a new connection: the kernel picks the worker. A connection the kernel had
    queued for a worker just killed is reset (an explicit error): it is tried again."""
    req = urllib.request.Request(
        f"http://{server.http_url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json", **AUTH},
    )
    for attempt in range(3):
        try:
            with urllib.request.urlopen(req, timeout=15) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, {"error": e.read().decode()}
        except (ConnectionError, http.client.RemoteDisconnected, urllib.error.URLError):
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def wait_for(cond, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def leader_pid(jobs_dir) -> int | None:
    """The pid the leader wrote into the lock file (for people; the lock itself is what counts)."""
    try:
        return int((jobs_dir / ".leader").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def job(server) -> dict:
    code, body = call(server, f"/v2/training/jobs/{JOB}")
    assert code == 200, body
    return body


def test_every_worker_serves_the_jobs_and_a_job_outlives_the_worker_that_started_it(model_repo, tmp_path):
    repo, jobs_dir = tmp_path / "repo", tmp_path / "jobs"
    jobs_dir.mkdir()
    settings = harvest_setup(model_repo, repo, jobs_dir, gpus=2)
    s = all_serving(ServerProcess(repo, "ray", ["--config", str(settings), "--workers", "2"]).wait_ready())
    with serving(s):
        pids = {p.pid for p in workers(s)}
        assert len(pids) == 2
        code, body = call(
            s,
            "/v2/training/jobs",
            "POST",
            {
                "job_id": JOB,
                "entry": "sloserve.training.demo:train",
                "config": {"iterations": 0, "checkpoint_every": 20, "iteration_delay_s": 0.01},
                "checkpoint_every": 20,
                "gpu_type": "T4",
            },
        )
        assert code == 201, body
        code, body = call(s, "/v2/training/jobs", "POST", {"job_id": JOB, "entry": "sloserve.training.demo:train"})
        assert code == 409, body  # one id, one job, whichever worker takes the second submit
        for _ in range(8):  # fresh connections, spread over both workers
            code, body = call(s, "/v2/training/jobs")
            assert code == 200 and [j["job_id"] for j in body["jobs"]] == [JOB], body

        assert wait_for(lambda: job(s)["state"] == "running" and job(s)["checkpoint_iteration"] >= 20, 60), s.output()
        leader = leader_pid(jobs_dir)
        assert leader in pids, (leader, pids)
        record = json.loads((jobs_dir / JOB / "job.json").read_text())
        assert record["launcher"] == "ray" and record["started_by"].endswith(f":{leader}"), record
        for _ in range(6):  # every worker shows the leader's annotations
            assert job(s)["attained_gpu_s"] is not None

        os.kill(leader, signal.SIGKILL)  # the worker that leads and started the run
        psutil.Process(leader).wait(10)
        before = job(s)["checkpoint_iteration"]
        # the run goes on, and the survivor takes the lead within a round or so
        assert wait_for(lambda: job(s)["checkpoint_iteration"] > before, 30), (job(s), s.output())
        assert job(s)["state"] == "running"
        assert wait_for(lambda: leader_pid(jobs_dir) in pids - {leader}, 10), leader_pid(jobs_dir)
        # every connection (the survivor's, and the restarted worker's once it serves) sees it running
        assert wait_for(lambda: len({p.pid for p in workers(s)} - {leader}) == 2, 60), s.output()
        for _ in range(8):
            assert job(s)["state"] == "running"

        code, body = call(s, f"/v2/training/jobs/{JOB}", "DELETE")
        assert code == 200 and body["state"] == "cancelled", body
        stopped_at = job(s)["iteration"]
        for _ in range(8):
            assert job(s)["state"] == "cancelled"
        time.sleep(1.0)  # a run still going would have written a checkpoint by now (every 20 x 10 ms)
        assert json.loads((jobs_dir / JOB / "status.json").read_text())["iteration"] <= stopped_at + 20
