"""Tracing's pieces without a server: the W3C context a client sends (a malformed one is ignored, never an
error), the settings and ``OTEL_*`` variables (a variable that is set wins), and the bounded export queue
with an OTLP endpoint that is down (spans dropped and counted, nobody waits)."""

from __future__ import annotations

import socket
import time

import pytest

from sloserve.gateway import tracing
from sloserve.gateway.config import load_settings
from sloserve.gateway.config_tracing import TracingConfigError, TracingSettings, resolve
from sloserve.gateway.span_export import SpanShipper
from sloserve.replica import tracing as process_tracing
from sloserve.replica.tracing import TraceConfig, parse_traceparent, parse_tracestate, sampler_of, traceparent_of
from tests.otlp import OtlpReceiver

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# ---- W3C trace context -----------------------------------------------------------------------------
def test_a_valid_traceparent_is_continued():
    ctx = parse_traceparent(GOOD, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
    assert ctx is not None and ctx.is_remote
    assert ctx.trace_id == 0x0AF7651916CD43DD8448EB211C80319C and ctx.span_id == 0xB7AD6B7169203331
    assert ctx.trace_flags.sampled
    assert ctx.trace_state.get("rojo") == "00f067aa0ba902b7"
    assert traceparent_of(ctx) == GOOD


def test_a_future_version_keeps_its_first_four_fields():
    ctx = parse_traceparent("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-the-future-holds")
    assert ctx is not None and ctx.span_id == 0xB7AD6B7169203331


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0",  # short flags
        "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",  # upper case
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero span id
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # forbidden version
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",  # version 00 has four fields
        "00_0af7651916cd43dd8448eb211c80319c_b7ad6b7169203331_01",
        "0g-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319x-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0z",
        "00-" + "a" * 600,
        "\x00" * 55,
    ],
)
def test_a_malformed_traceparent_is_ignored(value):
    assert parse_traceparent(value) is None
    assert process_tracing.context_of(value) is None


@pytest.mark.parametrize(
    "value", ["bad key=1", "k=", "=v", "k=v,k=w", "k=v\x7f", ",".join(f"k{i}=v" for i in range(33)), "a=" + "b" * 600]
)
def test_a_malformed_tracestate_is_dropped_and_the_traceparent_kept(value):
    assert parse_tracestate(value) is None
    ctx = parse_traceparent(GOOD, value)
    assert ctx is not None and ctx.trace_state is None or len(ctx.trace_state) == 0


def recording(config: TraceConfig = TraceConfig(exporter="console")) -> SpanShipper:
    """The gateway's request path traced as ``config`` says, its finished spans kept in a shipper
    that starts no exporter process (``take`` reads them)."""
    shipper = SpanShipper(config, {"service.name": "test"}, start=False)
    tracing.TRACER = tracing.Recorder(sampler_of(config.sampler, config.sampler_arg), shipper)
    return shipper


def test_a_malformed_header_starts_a_root_span():
    """The request is traced all the same, as a new trace (the sampler decides at the root)."""
    recording()
    try:
        rt = tracing.start_request("x", "00-zz-zz-01", "not a tracestate", {})
        assert rt is not None
        assert rt.parent is None
        assert rt.trace_id != "0af7651916cd43dd8448eb211c80319c"
        good = tracing.start_request("x", GOOD, None, {})
        assert good is not None and good.trace_id == "0af7651916cd43dd8448eb211c80319c"
        assert good.parent is not None and good.parent.span_id == 0xB7AD6B7169203331
        rt.finish()
        good.finish()
    finally:
        tracing.shutdown()


def test_an_unsampled_parent_records_nothing():
    recording()
    try:
        assert tracing.start_request("x", GOOD[:-2] + "00", None, {}) is None
    finally:
        tracing.shutdown()


# ---- settings and OTEL_* variables -------------------------------------------------------------------
def test_off_unless_configured():
    assert not resolve(TracingSettings(), {}).enabled
    assert tracing.setup(load_settings(None), {}).exporter == "none"
    assert tracing.TRACER is None and tracing.replica_config() is None


def test_an_endpoint_turns_otlp_on():
    c = resolve(TracingSettings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"})
    assert (c.exporter, c.protocol, c.endpoint) == ("otlp", "http/protobuf", "http://collector:4318/v1/traces")
    c = resolve(TracingSettings(endpoint="http://c:4317", protocol="grpc"), {})
    assert (c.exporter, c.endpoint) == ("otlp", "http://c:4317")
    c = resolve(TracingSettings(), {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:9/custom/path"})
    assert c.endpoint == "http://c:9/custom/path"


def test_each_variable_wins_over_its_key():
    s = TracingSettings(
        exporter="console",
        endpoint="http://a:4318",
        protocol="http/protobuf",
        sampler="always_on",
        sampler_arg=0.5,
        service_name="from-settings",
        max_queue_size=10,
    )
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4317",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
        "OTEL_SERVICE_NAME": "from-env",
        "OTEL_BSP_MAX_QUEUE_SIZE": "99",
    }
    c = resolve(s, env)
    assert c == TraceConfig(
        exporter="otlp",
        endpoint="http://b:4317",
        protocol="grpc",
        sampler="parentbased_traceidratio",
        sampler_arg=0.01,
        service_name="from-env",
        max_queue_size=99,
    )
    assert resolve(s, {}).service_name == "from-settings"  # no variable: the key
    assert resolve(s, {"OTEL_SERVICE_NAME": ""}).service_name == "from-settings"  # empty counts as unset


def test_sdk_disabled_wins_over_everything():
    env = {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}
    assert not resolve(TracingSettings(exporter="otlp"), env).enabled
    assert not resolve(TracingSettings(exporter="otlp", disabled=True), {}).enabled
    assert resolve(TracingSettings(exporter="otlp"), {"OTEL_SDK_DISABLED": "false"}).enabled


def test_settings_take_the_tracing_section():
    s = load_settings(None, tracing={"endpoint": "http://c:4318", "sampler": "traceidratio", "sampler_arg": 0.1})
    c = resolve(s.tracing, {})
    assert (c.exporter, c.endpoint, c.sampler, c.sampler_arg) == (
        "otlp",
        "http://c:4318/v1/traces",
        "traceidratio",
        0.1,
    )


@pytest.mark.parametrize(
    "env",
    [
        {"OTEL_TRACES_EXPORTER": "zipkin"},
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json", "OTEL_TRACES_EXPORTER": "otlp"},
        {"OTEL_TRACES_SAMPLER": "sometimes", "OTEL_TRACES_EXPORTER": "otlp"},
        {"OTEL_TRACES_SAMPLER_ARG": "lots", "OTEL_TRACES_EXPORTER": "otlp"},
        {"OTEL_TRACES_SAMPLER_ARG": "2", "OTEL_TRACES_EXPORTER": "otlp"},
        {"OTEL_SDK_DISABLED": "maybe"},
    ],
)
def test_a_variable_sloserve_cannot_use_stops_start_up_naming_it(env):
    with pytest.raises(TracingConfigError, match="OTEL_"):
        resolve(TracingSettings(), env)


# ---- the export queue ------------------------------------------------------------------------------
def _dead_endpoint() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/traces"


def test_a_dead_endpoint_drops_and_counts_spans_without_slowing_anyone():
    config = TraceConfig(
        exporter="otlp",
        endpoint=_dead_endpoint(),
        max_queue_size=64,
        max_export_batch_size=16,
        schedule_delay_s=0.05,
        export_timeout_s=0.5,
    )
    process_tracing.setup(config, "gateway")
    t = process_tracing.tracer("test")
    assert t is not None
    try:
        t0 = time.perf_counter()
        for _ in range(5000):
            t.start_span("request").end()
        took = time.perf_counter() - t0
        assert took < 2.0, f"5000 spans took {took:.2f} s with the endpoint down"
        deadline = time.monotonic() + 10
        while sum(process_tracing.dropped()) < 5000 - 64 and time.monotonic() < deadline:
            time.sleep(0.05)
        full, failed = process_tracing.dropped()
        assert full > 0 and full + failed >= 5000 - 64
    finally:
        t0 = time.monotonic()
        process_tracing.shutdown()
        assert time.monotonic() - t0 < 5.0  # stopping with the endpoint down is bounded too


def test_spans_reach_a_receiver_with_the_process_in_their_resource():
    with OtlpReceiver() as rx:
        process_tracing.setup(
            TraceConfig(exporter="otlp", endpoint=rx.endpoint + "/v1/traces", schedule_delay_s=0.05),
            "replica",
            {"sloserve.replica": "m/v"},
        )
        try:
            span = process_tracing.start_compute(GOOD, "m", "v", 4)
            process_tracing.end_compute(span)
            (got,) = rx.wait_for(lambda spans: len(spans) == 1, 10)
        finally:
            process_tracing.shutdown()
    assert got.name == "sloserve.replica.compute"
    assert (got.trace_id, got.parent_id) == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    assert got.attributes == {"sloserve.model": "m", "sloserve.variant": "v", "sloserve.batch.size": 4}
    assert got.resource["sloserve.role"] == "replica" and got.resource["process.pid"] > 0
    assert got.resource["service.name"] == "sloserve"


# ---- exemplars ---------------------------------------------------------------------------------------
def test_a_sampled_latency_carries_its_trace_id_in_openmetrics_only():
    import asyncio

    from sloserve.gateway.metrics import Metrics

    m = Metrics()
    m.observe_request("digits", "large", "ok", 0.004, True, {"trace_id": "0af7651916cd43dd8448eb211c80319c"})
    m.observe_request("digits", "large", "ok", 0.004, True)
    om = asyncio.run(m.exposition(openmetrics=True)).decode()
    (line,) = [ln for ln in om.splitlines() if "trace_id=" in ln]
    assert line.startswith("sloserve_request_duration_seconds_bucket{") and "0af7651916cd43dd8448eb211c80319c" in line
    assert om.rstrip().endswith("# EOF")
    assert "trace_id" not in asyncio.run(m.exposition()).decode()  # the text format has no exemplars


def test_workers_merge_keeps_exemplars():
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics

    from sloserve.gateway.metrics import Metrics
    from sloserve.gateway.metrics_fanin import merge

    texts = {}
    for worker, trace_id in ((0, "a" * 32), (1, "b" * 32)):
        m = Metrics()
        m.observe_request("digits", "large", "ok", 0.004, True, {"trace_id": trace_id})
        texts[worker] = openmetrics(m.registry).decode()
    merged = merge(texts, 1, openmetrics=True).decode()
    lines = [ln for ln in merged.splitlines() if "trace_id=" in ln]
    assert any('worker="0"' in ln and "a" * 32 in ln for ln in lines)
    assert any('worker="1"' in ln and "b" * 32 in ln for ln in lines)
    assert "sloserve_metrics_workers_missing 1.0" in merged and merged.rstrip().endswith("# EOF")


# ---- the training controller's decisions --------------------------------------------------------------
def test_training_place_and_resume_are_spans():
    import threading

    from sloserve.training.controller import HarvestController

    class Manager:
        def start(self, job_id, workers):
            if job_id == "broken":
                raise RuntimeError("no GPU after all")

    ctl = HarvestController.__new__(HarvestController)  # only what _start touches
    ctl.manager, ctl._jobs, ctl._starting, ctl._wake = Manager(), {}, {"a", "b", "broken"}, threading.Event()
    with OtlpReceiver() as rx:
        config = TraceConfig(exporter="otlp", endpoint=rx.endpoint + "/v1/traces", schedule_delay_s=0.05)
        process_tracing.setup(config, "gateway")
        try:
            ctl._start("a", 1, "idle-gpus")
            ctl._start("b", 1, "resume")
            ctl._start("broken", 1, "idle-gpus")
            spans = rx.wait_for(lambda spans: len(spans) == 3, 10)
        finally:
            process_tracing.shutdown()
    by = {s.attributes["sloserve.training.job"]: s for s in spans}
    assert by["a"].name == "sloserve.training.place" and by["a"].status_code == 0
    assert by["b"].name == "sloserve.training.resume" and by["b"].attributes["sloserve.training.reason"] == "resume"
    assert by["broken"].status_code == 2 and "no GPU after all" in by["broken"].status_message
    assert not ctl._starting


def test_otlp_over_grpc_reaches_a_receiver():
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    got: list[str] = []

    class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            got.extend(s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        config = resolve(
            TracingSettings(),
            {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
        )
        process_tracing.setup(config, "gateway")
        try:
            process_tracing.end_span(process_tracing.start_operation("test", "over-grpc", {}))
            assert process_tracing.flush(10)
        finally:
            process_tracing.shutdown()
    finally:
        server.stop(None)
    assert got == ["over-grpc"]
