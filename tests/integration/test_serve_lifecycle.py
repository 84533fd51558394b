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
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg), "--repo", str(model_repo)],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "http_port='eighty'" in r.stderr and "max_queue_rows=0" in r.stderr


def test_missing_repository_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--backend", "inprocess",
                        "--repo", str(tmp_path / "nothing"), "--http-port", "0", "--grpc-port", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "sloserve models build" in r.stderr
