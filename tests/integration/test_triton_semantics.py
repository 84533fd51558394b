"""Triton's request parameters (``timeout``, ``priority``) over REST and gRPC as tritonclient sends them,
and Triton's metrics port (``triton_metrics``), scraped beside sloserve's /metrics: they must agree."""

import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from sloserve.loadtests.promtext import prom_sum, samples
from tests.conftest import SERVER_ENV, ServerProcess, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def nv_server(model_repo):
    port = free_port()
    env = {**SERVER_ENV, "SLOSERVE_TRITON_METRICS": "true", "SLOSERVE_TRITON_METRICS_PORT": str(port)}
    srv = ServerProcess(model_repo, "inprocess", env=env).wait_ready()
    srv.nv_url = f"127.0.0.1:{port}"
    yield srv
    srv.stop()


def nv_sum(text: str, family: str, model: str, **labels: str) -> float:
    """The sum of Triton family ``family`` over ``model``'s series with these labels (a text parser names
    a counter's samples ``_total``; Triton writes them without)."""
    labels["model"] = model
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        if f.name == family
        for s in f.samples
        if all(s.labels.get(k) == v for k, v in labels.items())
    )


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def _heavy(module, rows=1):
    i = module.InferInput("input", [rows, 1024], "FP32")
    i.set_data_from_numpy(np.random.default_rng(0).random((rows, 1024), dtype=np.float32))
    return [i]


def _expired(results):
    """The errors among ``results`` (None: answered), each Triton's timeout error."""
    expired = [r for r in results if r is not None]
    for e in expired:
        assert "Request timeout expired" in e.message(), e.message()
    return expired


def _try(call):
    try:
        call()
    except InferenceServerException as e:
        return e
    return None


def _http_burst(client, n=48):
    """``n`` requests at once (tritonclient.http's own concurrency: it runs on gevent, not threads)."""
    pending = [client.async_infer("heavy", _heavy(httpclient, 8), timeout=1) for _ in range(n)]
    return _expired([_try(p.get_result) for p in pending])


def _grpc_burst(client, n=48):
    with ThreadPoolExecutor(16) as pool:
        return _expired(
            list(pool.map(lambda _: _try(lambda: client.infer("heavy", _heavy(grpcclient, 8), timeout=1)), range(n)))
        )


def test_timeout_and_priority_as_tritonclient_sends_them(nv_server):
    h = httpclient.InferenceServerClient(nv_server.http_url, concurrency=16)
    g = grpcclient.InferenceServerClient(nv_server.grpc_url)
    # a generous timeout and Triton's priority numbering: answered
    assert h.infer("digits", _digits(httpclient), timeout=10_000_000, priority=1).as_numpy("label").shape == (1,)
    assert g.infer("digits", _digits(grpcclient), timeout=10_000_000, priority=2).as_numpy("label").shape == (1,)
    # a 1 us timeout under a burst: the requests still queued fail with Triton's error, 503 / UNAVAILABLE
    expired = _http_burst(h)
    assert expired and all(e.status() == "503" for e in expired)
    expired = _grpc_burst(g)
    assert expired and all(e.status() == "StatusCode.UNAVAILABLE" for e in expired)
    # a bad value is the client's mistake
    with pytest.raises(InferenceServerException, match="timeout"):
        h.infer("digits", _digits(httpclient), timeout=-1)


def _digits(module):
    i = module.InferInput("input", [1, 64], "FP32")
    i.set_data_from_numpy(np.random.default_rng(1).random((1, 64), dtype=np.float32) * 16)
    return [i]


def test_tritons_metrics_agree_with_sloserves(nv_server):
    h = httpclient.InferenceServerClient(nv_server.http_url)
    for _ in range(5):
        h.infer("digits", _digits(httpclient))
    with pytest.raises(InferenceServerException):  # a failure: a wrong shape
        bad = httpclient.InferInput("input", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
        h.infer("digits", [bad])
    own = _get(f"http://{nv_server.http_url}/metrics")
    nv = _get(f"http://{nv_server.nv_url}/metrics")
    for model in ("digits", "heavy"):
        assert nv_sum(nv, "nv_inference_request_success", model) == prom_sum(
            own, "sloserve_requests_total", model, outcome="ok"
        )
        failed = sum(
            s.value for s in samples(own, "sloserve_requests_total", model=model) if s.labels["outcome"] != "ok"
        )
        assert nv_sum(nv, "nv_inference_request_failure", model) == failed
        assert nv_sum(nv, "nv_inference_exec_count", model) == prom_sum(own, "sloserve_batch_rows_count", model)
        assert nv_sum(nv, "nv_inference_count", model) == prom_sum(own, "sloserve_batch_rows_sum", model)
        for ours, theirs in (
            ("sloserve_request_duration_seconds_sum", "nv_inference_request_duration_us"),
            ("sloserve_request_queue_seconds_sum", "nv_inference_queue_duration_us"),
            ("sloserve_request_compute_seconds_sum", "nv_inference_compute_infer_duration_us"),
        ):
            versions = {s.labels["variant"] for s in samples(own, ours, model=model)}
            for v in versions:
                assert nv_sum(nv, theirs, model, version=v) == round(prom_sum(own, ours, model, variant=v) * 1e6)
    assert nv_sum(nv, "nv_inference_request_success", "digits") >= 5
    assert nv_sum(nv, "nv_inference_request_failure", "digits", reason="OTHER") >= 1
    assert nv_sum(nv, "nv_inference_pending_request_count", "digits") == 0
