"""Triton's perf_analyzer, with its defaults (only the model, the URL and the protocol), against the
in-process gateway: heavy over HTTP (its random FP32 data holds NaN and Inf, which the gateway accepts by
default as Triton does) and digits over gRPC. Each run is perf_analyzer's own 5 s windows until three agree within 10%; a run that never stabilises is run once more, and
skipped, saying so, if it fails again while the host's load average is above its core count."""

import os
import subprocess

import pytest

from sloserve.loadtests import perf_analyzer
from tests.conftest import SERVER_ENV, ServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tool():
    try:
        return perf_analyzer.ensure()
    except (OSError, subprocess.SubprocessError) as e:  # no package index, no apt: nothing to run
        pytest.skip(f"perf_analyzer is not available here: {e}")


@pytest.fixture(scope="module")
def gateway(model_repo):
    srv = ServerProcess(model_repo, "inprocess", env=dict(SERVER_ENV)).wait_ready()
    yield srv
    srv.stop()


# heavy's 1,024 random FP32 values hold non-finite ones (its refusal was the failure to fix); digits over
# gRPC is the stabilisation case. Each run takes perf_analyzer's own windows (5 s, three alike at least).
@pytest.mark.parametrize(("protocol", "model"), [("http", "heavy"), ("grpc", "digits")])
def test_perf_analyzer_with_its_defaults(tool, gateway, model, protocol):
    url = gateway.http_url if protocol == "http" else gateway.grpc_url
    for _ in range(2):
        run = subprocess.run(
            tool.command("-m", model, "-u", url, "-i", protocol),
            env=tool.env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        out = run.stdout + run.stderr
        # ten windows that never agree within 10% come from other load on a small host (the gateway's own
        # per-request time holds steady meanwhile: docs/operations.md, 'Coming from Triton'): once more
        if run.returncode == 0 or "Failed to obtain stable measurement" not in out:
            break
    else:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
        if load > cores:  # the windows measured other processes' load, not the gateway
            pytest.skip(f"perf_analyzer found no stable window twice, load average {load:.1f} on {cores} cores")
    assert run.returncode == 0, out[-3000:]
    figures = perf_analyzer.parse(out)
    assert figures.get("Throughput", 0) > 0, out[-3000:]
