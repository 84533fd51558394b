"""Replicas killed again and again under load (SIGKILL of the worker, and ray.kill): no request
hangs, none is answered twice or with another request's output, every failure is explicit, and the
deployment recovers by itself."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest

from tests.integration.test_ray_failure import (
    KILLER,
    gcs_address,
    replica_pid,
    wait_recovered,
)

pytestmark = pytest.mark.integration


def test_replicas_killed_repeatedly_under_load(ray_server, model_repo):
    s = ray_server
    sess = ort.InferenceSession(str(model_repo / "digits" / "small" / "model.onnx"), providers=["CPUExecutionProvider"])
    stop = threading.Event()
    results: list[tuple[int, int, object]] = []  # (request id, status, label or error text)
    expected: dict[int, int] = {}
    lock = threading.Lock()
    counter = iter(range(10**9))

    def client():
        rng = np.random.default_rng(threading.get_ident() % 2**32)
        while not stop.is_set():
            rid = next(counter)
            x = (rng.random((1, 64)) * 16).astype(np.float32)
            with lock:
                expected[rid] = int(sess.run(["label"], {"input": x})[0][0])
            body = json.dumps(
                {
                    "id": str(rid),
                    "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": x.ravel().tolist()}],
                    "parameters": {"variant": "small", "slo_ms": 5000},
                }
            ).encode()
            req = urllib.request.Request(
                f"http://{s.http_url}/v2/models/digits/infer",
                data=body,
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    doc = json.loads(r.read())
                    got = (rid, 200, (doc["id"], doc["outputs"][1]["data"][0]))
            except urllib.error.HTTPError as e:
                got = (rid, e.code, json.loads(e.read())["error"])
            except Exception as e:  # a hang shows up as a timeout here
                got = (rid, -1, repr(e))
            with lock:
                results.append(got)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for round_ in range(3):
            time.sleep(1.5)
            pid = replica_pid(s, "small")
            if round_ == 1:  # one ray.kill among the SIGKILLs
                killer = subprocess.Popen(
                    [sys.executable, "-c", KILLER, gcs_address(s), "digits-small-cpu"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
                )
                assert killer.stdout.readline().strip() == "ready"
                killer.stdin.write("go\n")
                killer.stdin.flush()
                assert killer.stdout.readline().strip() == "killed"
                killer.wait(30)
            else:
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60  # Serve replaces it; wait for the new worker
            while time.monotonic() < deadline:
                try:
                    if replica_pid(s, "small") != pid:
                        break
                except AssertionError:
                    pass
                time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(40)
    assert not any(t.is_alive() for t in threads), "a client is stuck: a request hung"
    ids = [r[0] for r in results]
    assert len(ids) == len(set(ids)), "a request was answered twice"
    ok = [r for r in results if r[1] == 200]
    assert len(ok) >= 5, results[-5:]  # replicas restart in seconds here: few requests complete
    for rid, _, (echo_id, label) in ok:
        assert echo_id == str(rid) and label == expected[rid], (rid, echo_id, label, expected[rid])
    failed = [r for r in results if r[1] != 200]
    for rid, status, text in failed:  # explicit: a status the protocol gives and a reason
        assert status in (503, 504) and isinstance(text, str) and text, (rid, status, text)
    wait_recovered(s, "small")
    print(f"{len(results)} requests, {len(ok)} ok, {len(failed)} failed explicitly: {sorted({r[1] for r in failed})}")
