"""Locust SLO runs against a live sloserve: a sane SLO passes, an impossible one fails the run.

``sloserve loadtest`` drives sloserve/loadtests/locustfile.py (REST via FastHttpUser and gRPC via
tritonclient) headless; the trace-shaped run replays a slice of the Azure Functions 2019 trace.
Load stays short (about 10 s, then 4 s) and light: this is a gate, not a benchmark.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ServerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    """Import a sloserve/loadtests/ module by path (no Locust import here: gevent must not patch pytest)."""
    spec = importlib.util.spec_from_file_location(
        f"sloserve_loadtests_{name}", ROOT / "sloserve" / "loadtests" / f"{name}.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


trace_rates = _load("trace_rates")


@pytest.fixture(scope="module")
def gateway(model_repo):
    """A sloserve of this module's own (in-process backend), so its load is the only load."""
    srv = ServerProcess(model_repo, "inprocess").wait_ready(60)
    yield srv.http_port, srv.grpc_port
    srv.stop()


def loadtest(http_port: int, grpc_port: int, *args: str, timeout: float = 90) -> tuple[int, str]:
    cmd = [
        sys.executable,
        "-m",
        "sloserve.cli",
        "loadtest",
        "--host",
        f"http://127.0.0.1:{http_port}",
        "--grpc-host",
        f"127.0.0.1:{grpc_port}",
        "-q",
        *args,
    ]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def test_trace_shape_scales_and_compresses_the_trace():
    counts = trace_rates.load_trace(trace_rates.DEFAULT_TRACE, "aggregate_1350fn", 540, 10)
    assert len(counts) == 10
    rates = [trace_rates.rate_at(counts, t, 1.0, 100.0) for t in range(10)]
    assert max(rates) == pytest.approx(100.0)
    assert all(0 < r <= 100.0 for r in rates)
    assert trace_rates.rate_at(counts, 10.0, 1.0, 100.0) is None  # 10 minutes at 1 s each: over at 10 s
    assert trace_rates.rate_at(counts, 19.0, 2.0, 100.0) is not None


def test_a_timestamp_trace_is_replayed_per_second(tmp_path):
    """Request times become per-second counts, so the clumps inside each minute are kept; the slice
    is in trace minutes and plays in real time at 60 s a minute."""
    trace = tmp_path / "ts.csv"
    times = [0.0, 60.1, 60.2, 60.3, 61.9, 119.0, 125.0]
    trace.write_text("t_s\n" + "".join(f"{t}\n" for t in times))
    counts, bin_s = trace_rates.load_bins(trace, "timestamps", "t_s", 1, 1, 60.0)
    assert bin_s == 1.0 and len(counts) == 60
    assert counts[:2] == [3, 1] and counts[59] == 1 and sum(counts) == 5  # minute 1 only
    assert trace_rates.rate_at(counts, 0.0, bin_s, 30.0) == pytest.approx(30.0)  # the busiest second
    assert trace_rates.rate_at(counts, 60.0, bin_s, 30.0) is None
    with pytest.raises(SystemExit, match="start minute 5"):
        trace_rates.load_timestamps(trace, "t_s", 5, 1)
    with pytest.raises(SystemExit, match="no column"):
        trace_rates.load_timestamps(trace, "when", 0, 1)
    with pytest.raises(SystemExit, match="trace kind"):
        trace_rates.load_bins(trace, "hours", "t_s", 0, 1, 60.0)


def test_trace_shaped_run_meets_a_sane_slo(gateway, tmp_path):
    http_port, grpc_port = gateway
    out = tmp_path / "results.json"
    rc, log = loadtest(
        http_port,
        grpc_port,
        "--shape",
        "trace",
        "--duration",
        "10",
        "--peak-rps",
        "60",
        "--rps-per-user",
        "15",
        "--models",
        "digits:3,heavy:1",
        "--slo-ms",
        "250",
        "--min-attainment",
        "0.9",
        "--max-error-rate",
        "0.01",
        "--results-json",
        str(out),
    )
    assert rc == 0, log[-4000:]
    assert "sloserve SLO check: PASS" in log, log[-2000:]
    res = json.loads(out.read_text())
    assert res["passed"] and res["requests"] > 100 and res["failed"] == 0
    assert "REST digits" in log and "gRPC digits" in log and "REST heavy" in log, log[-3000:]
    assert any(s["target_rps"] for s in res["timeline"]), res["timeline"][:3]


def test_impossible_slo_fails_the_run(gateway):
    http_port, grpc_port = gateway
    rc, log = loadtest(http_port, grpc_port, "--duration", "4", "--users", "2", "--slo-ms", "0.01")
    assert rc == 3, log[-4000:]
    assert "sloserve SLO check: FAIL" in log, log[-2000:]


def test_loadtest_refuses_unbounded_runs(gateway):
    http_port, grpc_port = gateway
    rc, log = loadtest(http_port, grpc_port, "--duration", "3600", timeout=30)
    assert rc != 0 and "--duration" in log, log
