"""Triton's nv_inference_* families, derived from sloserve's own exposition."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sloserve.gateway.metrics import Metrics
from sloserve.gateway.metrics_fanin import merge
from sloserve.gateway.triton_metrics import triton_exposition, triton_values


def _metrics() -> Metrics:
    m = Metrics()
    for latency, queue, compute in ((0.004, 0.001, 0.002), (0.006, 0.002, 0.003)):
        m.observe_request("digits", "large", "ok", latency, True)
        m.phases.observe("digits", "large", queue, compute)
    m.observe_request("digits", "none", "queue_timeout", 0.0, None)
    m.observe_request("digits", "none", "invalid", 0.0, None)
    m.observe_request("unknown", "none", "not_found", 0.0, None)
    hook, _ = m.batcher_hook("digits")
    hook("batch", ("large", 2, 0.003, "full"))
    m.phases.watch_queue("digits", lambda: 3)
    return m


def test_values_follow_sloserves_own():
    v = triton_values(generate_latest(_metrics().registry).decode())
    key = (("model", "digits"), ("version", "large"))
    assert v["nv_inference_request_success"][key] == 2
    assert v["nv_inference_request_duration_us"][key] == 10_000
    assert round(v["nv_inference_queue_duration_us"][key]) == 3_000
    assert round(v["nv_inference_compute_infer_duration_us"][key]) == 5_000
    assert v["nv_inference_compute_input_duration_us"][key] == 0
    assert v["nv_inference_count"][key] == 2 and v["nv_inference_exec_count"][key] == 1
    fail = v["nv_inference_request_failure"]
    assert fail[(("model", "digits"), ("reason", "REJECTED"), ("version", ""))] == 1
    assert fail[(("model", "digits"), ("reason", "OTHER"), ("version", ""))] == 1
    assert all(dict(k)["model"] != "unknown" for k in fail)
    assert v["nv_inference_pending_request_count"][(("model", "digits"), ("version", ""))] == 3


def test_exposition_is_tritons_text_and_sums_over_workers():
    text = generate_latest(_metrics().registry).decode()
    merged = merge({0: text, 1: text}).decode()
    out = triton_exposition(merged).decode()
    assert "# TYPE nv_inference_request_success counter" in out
    assert 'nv_inference_request_success{model="digits",version="large"} 4' in out
    assert 'nv_inference_pending_request_count{model="digits",version=""} 6' in out
    names = {f.name for f in text_string_to_metric_families(out)}
    assert "nv_inference_exec_count" in names and "nv_inference_queue_duration_us" in names
