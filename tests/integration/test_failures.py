"""Failure: a model file that cannot be loaded, a replica that hangs, the gateway restarted while
clients retry. Invariants: no request hangs (every client call has a timeout), every answer is
checked against a local ONNX Runtime reference for its own distinct input (never another
request's output, never twice), every failure is explicit (status + message), and the system
recovers without an operator. Replica kills under Ray: tests/integration/test_ray_failure.py.
What is guaranteed: docs/reliability.md ("Failure").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from sloserve.gateway.config import Settings
from sloserve.gateway.server import Gateway
from tests.conftest import ROOT, ServerProcess

pytestmark = pytest.mark.integration


def digits_repo(model_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(model_repo / "digits", repo / "digits")
    return repo


def body_for(x: np.ndarray, params: dict | None = None) -> bytes:
    return json.dumps(
        {
            "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.tolist()}],
            "parameters": params or {},
        }
    ).encode()


@pytest.mark.parametrize("backend", ["inprocess", "ray"])
@pytest.mark.parametrize("damage", ["garbage", "empty", "truncated"])
def test_model_file_that_cannot_load_stops_startup_naming_it(model_repo, tmp_path, backend, damage):
    """Choice: the server serves its whole repository or refuses to start (exit 2), with an error
    naming the file; for Ray the files are parsed in the gateway before Ray starts."""
    repo = digits_repo(model_repo, tmp_path)
    bad = repo / "digits" / "medium" / "model.onnx"
    data = bad.read_bytes()
    bad.write_bytes(
        {"garbage": b"\x08\x07not an onnx file" * 8, "empty": b"", "truncated": data[: len(data) // 3]}[damage]
    )
    cmd = [
        sys.executable,
        "-m",
        "sloserve.cli",
        "serve",
        "--repo",
        str(repo),
        "--backend",
        backend,
        "--http-port",
        "0",
        "--grpc-port",
        "0",
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr[-2000:]
    assert str(bad) in p.stderr and "cannot be loaded" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize(
    "batching, names",
    [
        ({"policy": "slo", "late_windw_ms": 5}, "late_windw_ms"),
        ({"policy": "slo", "late_target": 2}, "late_target"),
        ({"policy": "nope"}, "unknown batching policy"),
    ],
)
def test_bad_batching_config_stops_startup_naming_it(model_repo, tmp_path, batching, names):
    """A misspelt or out-of-range batching argument is a configuration error (exit 2, the setting
    named), not a traceback, and not a server that starts with the setting ignored."""
    repo = digits_repo(model_repo, tmp_path)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"models": {"digits": {"batching": batching}}}))
    cmd = [
        sys.executable,
        "-m",
        "sloserve.cli",
        "serve",
        "--repo",
        str(repo),
        "--backend",
        "inprocess",
        "--http-port",
        "0",
        "--grpc-port",
        "0",
        "--config",
        str(cfg),
    ]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "models.digits.batching" in p.stderr and names in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("late_grace_s, batch_timeout_s, bound_s", [(0.3, 30.0, 0.5), (None, 0.6, 0.6)])
async def test_hung_replica_answers_504_at_its_bound(model_repo, tmp_path, late_grace_s, batch_timeout_s, bound_s):
    """A replica that holds a batch far past its deadline (fault_delay_ms = 5 s): the request gets
    504 at deadline + late_grace_s (or batch_timeout_s), and the next one is served."""
    settings = Settings(
        repo=digits_repo(model_repo, tmp_path),
        backend="inprocess",
        http_port=0,
        grpc_port=0,
        late_grace_s=late_grace_s,
        batch_timeout_s=batch_timeout_s,
        models={"digits": {"fault_delay_ms": 5000}},
    )
    gw = Gateway(settings)
    await gw.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10) as http:
            t0 = time.monotonic()
            r = await http.post(
                "/v2/models/digits/infer",
                content=body_for(np.ones(64, np.float32), {"slo_ms": 200, "variant": "small"}),
            )
            took = time.monotonic() - t0
        assert r.status_code == 504, r.text
        assert "was not back" in r.json()["error"]
        assert bound_s - 0.05 <= took < bound_s + 1.0, took
    finally:
        await gw.stop()


class Reference:
    """Local ONNX Runtime sessions: what each input must get back."""

    def __init__(self, repo):
        self.sess = {
            v: ort.InferenceSession(str(repo / "digits" / v / "model.onnx"), providers=["CPUExecutionProvider"])
            for v in ("small", "medium", "large")
        }

    def probs(self, variant: str, x: np.ndarray) -> np.ndarray:
        s = self.sess[variant]
        outs = s.run(None, {s.get_inputs()[0].name: x[None, :]})
        names = [o.name for o in s.get_outputs()]
        return outs[names.index("probs")][0]


def call(url: str, body: bytes, timeout: float = 5.0) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{url}/v2/models/digits/infer", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {"error": json.loads(e.read()).get("error", ""), "retry_after": e.headers.get("Retry-After")}


def retrying_client(
    url: str, n: int, seed: int, ref: Reference, out: list, stop_by: float, pace_s: float = 0.02
) -> None:
    """Sends n distinct inputs one after another, ``pace_s`` apart (so the stream outlasts the
    restart even on a fast box: unpaced, 150 answers can all be in before the first server stops);
    each is retried on connection errors and 503 until answered (or stop_by), and every answer is
    checked against the reference."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        x = rng.integers(0, 17, 64).astype(np.float32)
        tries = 0
        while True:
            tries += 1
            if time.monotonic() > stop_by:
                out.append(("gave_up", i, tries))
                return
            try:
                code, doc = call(url, body_for(x, {"slo_ms": 2000}))
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
                out.append(("conn_error", type(e).__name__))
                time.sleep(0.05)
                continue
            if code == 503:
                assert doc["error"] and doc["retry_after"], doc
                time.sleep(0.05)
                continue
            assert code == 200, (code, doc)
            got = {o["name"]: o for o in doc["outputs"]}
            variant = doc["parameters"]["variant"]
            want = ref.probs(variant, x)
            assert np.allclose(np.asarray(got["probs"]["data"], np.float32), want, atol=1e-5), (i, variant)
            out.append(("ok", i, tries))
            time.sleep(pace_s)
            break


def test_gateway_restart_while_clients_retry(model_repo, tmp_path):
    repo = digits_repo(model_repo, tmp_path)
    ref = Reference(repo)
    s1 = ServerProcess(repo, "inprocess").wait_ready(60)
    url = f"http://{s1.http_url}"
    results: list[list] = [[] for _ in range(3)]
    stop_by = time.monotonic() + 90
    threads = [
        threading.Thread(target=retrying_client, args=(url, 150, k, ref, results[k], stop_by), daemon=True)
        for k in range(3)
    ]
    for t in threads:
        t.start()
    time.sleep(1.0)
    assert s1.stop() == 0  # SIGTERM: drains, exits cleanly
    down_at = time.monotonic()
    s2 = ServerProcess(repo, "inprocess", ["--http-port", str(s1.http_port), "--grpc-port", str(s1.grpc_port)])
    s2.http_port, s2.grpc_port = s1.http_port, s1.grpc_port
    try:
        s2.wait_ready(60)
        back_after = time.monotonic() - down_at
        for t in threads:
            t.join(max(stop_by - time.monotonic(), 1))
            assert not t.is_alive(), "a client hung"
    finally:
        s2.stop()
    for r in results:
        oks = [e for e in r if e[0] == "ok"]
        assert [e[1] for e in oks] == list(range(150)), r[-3:]  # each answered once, in order, correctly
    conn_errors = sum(1 for r in results for e in r if e[0] == "conn_error")
    assert conn_errors > 0  # the restart was seen by the clients
    print(f"gateway back after {back_after:.1f} s; connection errors retried: {conn_errors}")
