"""`sloserve serve` starts, answers, and stops cleanly on SIGINT and SIGTERM (the `make run` server)."""

import signal
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.conftest import ROOT, ServerProcess

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_serve_answers_then_stops_on_signal(model_repo, sig):
    s = ServerProcess(model_repo, "inprocess").wait_ready()
    c = httpclient.InferenceServerClient(s.http_url)
    i = httpclient.InferInput("input", [1, 64], "FP32")
    i.set_data_from_numpy(np.zeros((1, 64), np.float32))
    assert c.infer("digits", [i]).as_numpy("label").shape == (1,)
    out = s.output()
    assert s.stop(sig, timeout=20) == 0, out
    assert "serving HTTP on 127.0.0.1" in out


def test_bad_config_names_the_key(tmp_path, model_repo):
    cfg = tmp_path / "bad.json"
    cfg.write_text('{"http_port": "eighty", "max_queue_rows": 0}')
    r = subprocess.run(
        [sys.executable, "-m", "sloserve.cli", "serve", "--config", str(cfg), "--repo", str(model_repo)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "http_port='eighty'" in r.stderr and "max_queue_rows=0" in r.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_missing_repository_is_a_clear_error(tmp_path, workers):
    """Alone or as a supervisor of several workers (the default on a host with more than 2 cores), the
    command ends with 2 and says what to do, before any worker or Ray starts."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "sloserve.cli",
            "serve",
            "--backend",
            "inprocess",
            "--repo",
            str(tmp_path / "nothing"),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--workers",
            str(workers),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "sloserve models build" in r.stderr


def _status(url: str) -> int | None:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def test_sigterm_while_ray_replicas_load_stops_promptly_and_leaves_nothing(model_repo):
    """A stop asked for during start-up is honoured then, not once every replica is up: the server
    answers liveness but not readiness (Ray is up, Serve replicas are loading) when SIGTERM comes."""
    import time

    s = ServerProcess(model_repo, "ray")
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert s.proc.poll() is None, s.output()
            live = _status(f"http://{s.http_url}/v2/health/live")
            ready = _status(f"http://{s.http_url}/v2/health/ready")
            if live == 200:
                break
            time.sleep(0.05)
        assert live == 200 and ready != 200, (live, ready, s.output())
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        rc = s.proc.wait(60)
        took = time.monotonic() - t0
        out = s.output()
        left = s.leftovers()
    except BaseException:
        s.kill()
        raise
    assert s.stop() == rc
    assert rc == 0 and not left, (rc, left, out)
    assert "stop requested during start-up" in out, out
    assert took < 45, (took, out)


@pytest.mark.parametrize("after_s", [0.5, 3.0])
def test_sigterm_while_ray_itself_starts_exits_cleanly(model_repo, after_s):
    """Earlier in start-up than the test above: while the modules import and the repository loads
    (0.5 s: Python's default action would end the process with -15, saying nothing), or while ray.init
    runs on the main thread (3 s on a quick host). Ray's own SIGTERM handler, had it been installed,
    would raise SystemExit half-way through ray.init (once: exit -6, and Ray processes left as zombies)."""
    import time

    s = ServerProcess(model_repo, "ray")
    try:
        time.sleep(after_s)
        s.proc.send_signal(signal.SIGTERM)
        rc = s.proc.wait(90)
        time.sleep(0.5)
        out, left = s.output(), s.leftovers()
    except BaseException:
        s.kill()
        raise
    assert s.stop() == rc
    print(out)  # whole, under "Captured stdout" when the assertion fails (its message is truncated)
    assert rc == 0 and not left, (rc, left, out)
    assert "stop requested during start-up" in out or "shutting down" in out, out


def test_sigterm_drains_requests_in_flight_on_both_transports(model_repo, tmp_path):
    """A rolling update: SIGTERM while an HTTP and a gRPC request are inside a 1.5 s batch. Both are
    answered (the gRPC one used to be reset after 2 s of grace against a 30 s batch timeout), the
    server reports not ready at once, and it exits cleanly."""
    import json
    import threading
    import time
    import urllib.request

    import tritonclient.grpc as grpcclient

    cfg = tmp_path / "slow.json"
    cfg.write_text(json.dumps({"models": {"digits": {"fault_delay_ms": 1500}}}))
    s = ServerProcess(model_repo, "inprocess", ["--config", str(cfg)]).wait_ready()
    x = np.zeros((1, 64), np.float32)
    results: dict[str, object] = {}

    def over_http():
        c = httpclient.InferenceServerClient(s.http_url, network_timeout=30)
        i = httpclient.InferInput("input", [1, 64], "FP32")
        i.set_data_from_numpy(x)
        results["http"] = c.infer("digits", [i], parameters={"variant": "small"}).as_numpy("label").shape

    def over_grpc():
        c = grpcclient.InferenceServerClient(s.grpc_url)
        i = grpcclient.InferInput("input", [1, 64], "FP32")
        i.set_data_from_numpy(x)
        results["grpc"] = (
            c.infer("digits", [i], parameters={"variant": "small"}, client_timeout=30).as_numpy("label").shape
        )

    threads = [threading.Thread(target=f, daemon=True) for f in (over_http, over_grpc)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # both sent and inside the 1.5 s batch (or queued behind it), also on a busy box
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    try:
        with urllib.request.urlopen(f"http://{s.http_url}/v2/health/ready", timeout=5) as r:
            ready = r.status
    except urllib.error.HTTPError as e:
        ready = e.code
    except OSError:
        ready = None  # already closed to new connections: also not ready
    assert ready in (503, None), ready
    for t in threads:
        t.join(20)
    assert results == {"http": (1,), "grpc": (1,)}, results
    assert s.stop(signal.SIGTERM, timeout=30) == 0, s.output()
