"""Live reclaims of a training job's GPU by inference, many times over, and whether a job that was
preempted and resumed ends where an uninterrupted one does.

Starts ``sloserve serve`` (the Ray backend) on emulated T4s with training enabled and digits/small
on one T4 per replica (autoscaling 1..2). Phase 1 runs the PyTorch demo job (``sloserve.training.demo``
under Ray Train) on the idle T4 and repeats ``--reclaims`` times: a load step until swayam's second
replica is RUNNING on the job's GPU (the placement controller preempts the job), then no load until
the replica scales in and the job has resumed from its checkpoint. Each reclaim's times come from
``GET /v2/training/placement`` (from the placement decision: GPU free, replica granted, replica
RUNNING) with the iterations lost. Phase 2 trains the same fixed-length job twice, once preempted and
resumed by hand ``--preemptions`` times and once uninterrupted, and compares their final losses.

    python -m sloserve.loadtests.bench.reclaim --reclaims 20 --out docs/data/reclaim/reclaims.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from sloserve.loadtests.results import spread, write_result
from sloserve.training.checkpoint import latest_good

# The training API needs a token with the training scope (and, once a token is configured, so does
# everything else): one token, its jobs those of tenant "bench".
HARVEST_TOKEN = "harvest-bench-token"
AUTH = {"authorization": f"Bearer {HARVEST_TOKEN}"}

BODY = json.dumps(
    {
        "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}],
        "parameters": {"slo_ms": 200},
    }
).encode()


def harvest_setup(
    model_repo: Path, repo: Path, jobs_dir: Path, gpus: int, grace_s: float = 1.0, keep_alive_s: float = 6.0
) -> Path:
    """A repository with digits/small on emulated T4s (a measured-looking 20 ms profile, one whole GPU
    per replica, autoscaling 1..2) and settings with training enabled and one token (``AUTH``) for
    every request; returns the settings file."""
    shutil.copytree(
        model_repo / "digits" / "small", repo / "digits" / "small", ignore=shutil.ignore_patterns("profiles")
    )
    cfg = json.loads((model_repo / "digits" / "config.json").read_text())
    cfg["variants"] = [v for v in cfg["variants"] if v["name"] == "small"]
    cfg["max_batch_size"] = 4
    if cfg.get("default_variant") not in (None, "small"):
        cfg["default_variant"] = None
    (repo / "digits" / "config.json").write_text(json.dumps(cfg))
    prof = repo / "digits" / "small" / "profiles" / "t4.json"
    prof.parent.mkdir(parents=True)
    prof.write_text(
        json.dumps(
            {
                "model": "digits",
                "variant": "small",
                "device_type": "t4",
                "batch_sizes": [1, 2, 4],
                "p50_ms": [21, 22, 24],
                "p99_ms": [24, 25, 27],
            }
        )
    )
    autoscaling = {
        "min_replicas": 1,
        "max_replicas": 2,
        "startup_s": 2,
        "keep_alive_s": keep_alive_s,
        "interval_s": 1,
        "predictor": "last",
        "hold_quantile": 0,  # scale in after the keep-alive, not a 10-minute hold
        "season_periods_s": [],
    }
    settings = repo / "settings.json"
    settings.write_text(
        json.dumps(
            {
                "ray_num_cpus": 4,
                "emulated_gpus": {"T4": gpus},
                "replica_gpu_fraction": 1.0,
                "auth_tokens": f"{HARVEST_TOKEN} * infer,training,metrics bench",
                "training": {
                    "enabled": True,
                    "jobs_dir": str(jobs_dir),
                    "grace_s": grace_s,
                    "auto_fill": True,
                    "interval_s": 0.5,
                },
                "models": {
                    "digits": {"device_type": "T4", "fault_delay_ms": 20, "slo_ms": 200, "autoscaling": autoscaling}
                },
            }
        )
    )
    return settings


def wait_for(pred, timeout_s: float, every_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if pred():
                return True
        except httpx.HTTPError:
            pass
        time.sleep(every_s)
    return False


@contextlib.contextmanager
def offered_load(url: str, threads: int = 12):
    """Closed-loop infer calls from ``threads`` threads while the block runs."""
    stop = threading.Event()

    def worker():
        with httpx.Client(timeout=10, headers=AUTH) as c:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    c.post(f"{url}/v2/models/digits/infer", content=BODY)

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in pool:
            t.join(15)


def reclaims(api: httpx.Client, jobs_dir: Path, n: int, checkpoint_every: int) -> list[dict]:
    """Phase 1: ``n`` load steps, each reclaiming the training job's GPU."""
    job = {
        "job_id": "reclaimed",
        "config": {"iterations": 0, "checkpoint_every": checkpoint_every, "iteration_delay_s": 0.01},
        "checkpoint_every": checkpoint_every,
        "gpu_type": "T4",
    }
    api.post("/v2/training/jobs", json=job).raise_for_status()
    out: list[dict] = []
    run = 0
    for i in range(n):
        # reclaim a job that is training: a new run, one checkpoint past where it started
        def training(run=run) -> bool:
            st = _status(jobs_dir, "reclaimed")
            started = st.get("resumed_from") or 0
            return (st.get("run") or 0) > run and st.get("checkpoint_iteration", 0) >= started + checkpoint_every

        if not wait_for(training, 120):
            raise RuntimeError(f"reclaim {i}: the job did not train on ({_status(jobs_dir, 'reclaimed')})")
        with offered_load(str(api.base_url)):
            ok = wait_for(lambda i=i: len(_reclaims(api)) > i and _reclaims(api)[i]["ready_s"] is not None, 90)
        if not ok:
            raise RuntimeError(f"reclaim {i}: none under load: {api.get('/v2/training/placement').json()}")
        rec = _reclaims(api)[i]
        out.append(rec)
        run = _status(jobs_dir, "reclaimed").get("run") or 0
        print(
            f"[{i + 1}/{n}] GPU free {rec['freed_s']:.3f} s, replica RUNNING {rec['ready_s']:.2f} s, "
            f"{rec['outcome']}, lost {rec['lost_iterations']} iterations",
            flush=True,
        )
        if not wait_for(lambda: api.get("/v2/training/jobs/reclaimed").json()["state"] == "running", 120):
            raise RuntimeError(f"reclaim {i}: the job did not resume")
    api.delete("/v2/training/jobs/reclaimed")
    return out


def same_loss(api: httpx.Client, jobs_dir: Path, iterations: int, preemptions: int, checkpoint_every: int) -> dict:
    """Phase 2: the same job preempted ``preemptions`` times by hand, and uninterrupted."""
    cfg = {"iterations": iterations, "checkpoint_every": checkpoint_every, "iteration_delay_s": 0.005}
    results: dict[str, Any] = {}
    for name, stops in (("uninterrupted", 0), ("preempted", preemptions)):
        api.post(
            "/v2/training/jobs",
            json={"job_id": name, "config": cfg, "checkpoint_every": checkpoint_every, "gpu_type": "T4"},
        ).raise_for_status()
        for k in range(stops):
            at = iterations * (k + 1) // (stops + 1)
            if not wait_for(lambda name=name, at=at: _status(jobs_dir, name).get("iteration", 0) >= at, 120, 0.05):
                raise RuntimeError(f"{name}: did not reach iteration {at}")
            api.post(f"/v2/training/jobs/{name}/preempt").raise_for_status()
            api.post(f"/v2/training/jobs/{name}/resume").raise_for_status()
        if not wait_for(lambda name=name: api.get(f"/v2/training/jobs/{name}").json()["state"] == "finished", 300):
            raise RuntimeError(f"{name}: did not finish: {api.get(f'/v2/training/jobs/{name}').json()}")
        final = latest_good(jobs_dir / name / "storage")  # the job's last checkpoint: its whole-set loss
        if final is None or final.iteration != iterations:
            raise RuntimeError(f"{name}: no final checkpoint at iteration {iterations}")
        info = api.get(f"/v2/training/jobs/{name}").json()
        results[name] = {
            "eval_loss": final.metrics.get("eval_loss"),
            "accuracy": final.metrics.get("accuracy"),
            "last_minibatch_loss": final.metrics.get("loss"),
            "preemptions": info["preemptions"],
            "lost_iterations": info["lost_iterations"],
        }
        print(f"{name}: {results[name]}", flush=True)
    a, b = results["uninterrupted"], results["preempted"]
    keys = ("eval_loss", "accuracy", "last_minibatch_loss")
    results["identical"] = all(a[k] is not None and a[k] == b[k] for k in keys)
    return results


def _status(jobs_dir: Path, job_id: str) -> dict:
    p = jobs_dir / job_id / "status.json"
    try:
        return json.loads(p.read_text()) if p.exists() else {}
    except ValueError:
        return {}


def _reclaims(api: httpx.Client) -> list[dict]:
    return [r for r in api.get("/v2/training/placement").json()["reclaims"] if r["model"] is not None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reclaims", type=int, default=20)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--iterations", type=int, default=600, help="phase 2: the fixed-length job")
    ap.add_argument("--preemptions", type=int, default=3, help="phase 2: preemptions of the compared job")
    ap.add_argument("--repo", type=Path, default=Path("model_repository"))
    ap.add_argument("--port", type=int, default=18400)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="sloserve-reclaim-"))
    jobs_dir = tmp / "jobs"
    settings = harvest_setup(args.repo.resolve(), tmp / "repo", jobs_dir, gpus=2, keep_alive_s=4.0)
    cmd = [sys.executable, "-m", "sloserve.cli", "serve", "--repo", str(tmp / "repo"), "--backend", "ray"]
    cmd += ["--http-port", str(args.port), "--grpc-port", str(args.port + 1), "--config", str(settings)]
    log = open(tmp / "server.log", "w")  # noqa: SIM115 - the server keeps it for its life
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    api = httpx.Client(base_url=f"http://127.0.0.1:{args.port}", timeout=30, headers=AUTH)
    try:
        if not wait_for(lambda: api.get("/v2/health/ready").status_code == 200, 300, 1.0):
            raise RuntimeError(f"the server did not start: {(tmp / 'server.log').read_text()[-3000:]}")
        recs = reclaims(api, jobs_dir, args.reclaims, args.checkpoint_every)
        loss = same_loss(api, jobs_dir, args.iterations, args.preemptions, args.checkpoint_every)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    freed = [r["freed_s"] for r in recs]
    ready = [r["ready_s"] for r in recs]
    lost = [r["lost_iterations"] for r in recs]
    summary = {
        "reclaims": len(recs),
        "freed_s": spread(freed),
        "ready_s": spread(ready),
        "lost_iterations": {"max": max(lost), "mean": statistics.fmean(lost)},
        "checkpoint_every": args.checkpoint_every,
        "outcomes": {o: sum(1 for r in recs if r["outcome"] == o) for o in {r["outcome"] for r in recs}},
        "same_loss": loss,
    }
    print(json.dumps(summary, indent=1))
    write_result({"summary": summary, "reclaims": recs}, args.out)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
