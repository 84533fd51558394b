"""The gateway's spans as records (sloserve/gateway/span_export.py): a record becomes the very span the
SDK's tracer would have ended (compared as OTLP protobufs), the request path writes its spans as
records with the parents, links and statuses of the SDK path, and the buffer holds at most
``max_queue_size`` spans, counting the rest. No exporter process here (tests/integration/test_tracing.py
starts one)."""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from sloserve.gateway import tracing
from sloserve.gateway.errors import InvalidArgument
from sloserve.gateway.span_export import SCOPE, SpanShipper, to_span
from sloserve.replica import tracing as process_tracing
from sloserve.replica.tracing import TraceConfig, sampler_of

GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
RESOURCE = Resource({"service.name": "test", "sloserve.role": "gateway", "process.pid": 1})


def record_of(span: ReadableSpan) -> tuple:
    """The record the gateway would have written for an SDK span."""
    ctx, parent = span.context, span.parent
    assert ctx is not None
    state = tuple(ctx.trace_state.items()) or None
    error = span.status.description if span.status.status_code is StatusCode.ERROR else None
    return (
        span.name,
        span.kind.value,
        ctx.trace_id,
        ctx.span_id,
        0 if parent is None else parent.span_id,
        parent is not None and parent.is_remote,
        span.start_time,
        span.end_time,
        dict(span.attributes or {}) or None,
        tuple((link.context.trace_id, link.context.span_id) for link in span.links),
        error,
        state,
    )


def test_a_record_becomes_the_span_the_sdk_would_have_ended():
    ended: list[ReadableSpan] = []

    class Keep(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            ended.append(span)

    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(Keep())
    t = provider.get_tracer(SCOPE)
    server = t.start_span(
        "POST /v2/models/{model}/infer",
        context=process_tracing.context_of(GOOD, "vendor=1,other=2"),
        kind=SpanKind.SERVER,
        attributes={"sloserve.model": "digits", "sloserve.outcome": "invalid"},
        start_time=1_000,
    )
    batch = SpanContext(server.get_span_context().trace_id, 0xABC, False, TraceFlags(TraceFlags.SAMPLED))
    child = t.start_span(
        "sloserve.queue",
        context=trace.set_span_in_context(server),
        attributes={"sloserve.queue_ms": 1.5},
        links=[Link(batch)],
        start_time=2_000,
    )
    child.end(end_time=3_000)
    root = t.start_span("sloserve.batch", attributes={"sloserve.batch.size": 4}, start_time=2_500)
    root.end(end_time=2_600)
    server.set_status(Status(StatusCode.ERROR, "invalid: no input named 'nope'"))
    server.end(end_time=4_000)

    rebuilt = [to_span(record_of(s), RESOURCE, InstrumentationScope(SCOPE)) for s in ended]
    assert encode_spans(rebuilt) == encode_spans(ended)
    (srv,) = [s for s in rebuilt if s.kind is SpanKind.SERVER]
    assert srv.parent is not None and srv.parent.is_remote and srv.parent.span_id == 0xB7AD6B7169203331
    assert srv.context is not None and srv.context.trace_state.get("vendor") == "1"


def recording(config: TraceConfig = TraceConfig(exporter="console")) -> SpanShipper:
    shipper = SpanShipper(config, {}, start=False)
    tracing.TRACER = tracing.Recorder(sampler_of(config.sampler, config.sampler_arg), shipper)
    return shipper


def spans(shipper: SpanShipper) -> list[ReadableSpan]:
    return [to_span(r, RESOURCE, InstrumentationScope(SCOPE)) for piece in shipper.take() for r in piece]


def test_a_request_writes_its_spans_and_its_batch_links_them():
    shipper = recording()
    try:
        rt = tracing.start_request("POST x", GOOD, "vendor=1", {"sloserve.model": "digits"})
        assert rt is not None and rt.trace_id == "0af7651916cd43dd8448eb211c80319c"
        rt.decoded()
        now = time.monotonic()
        rt.admitted(now, now, now + 0.02, None, now + 0.01)
        bt = tracing.BatchTracer()
        handle = bt.start("digits", "small/cpu", 1, 1, [rt], "full")
        parent = tracing.batch_traceparent()
        tracing.local_compute("digits", "small", 1, 0.001, "cpu")
        bt.end(handle, "cpu", 0.001)
        assert tracing.batch_traceparent() is None
        rt.answered()
        rt.finish()
        got = spans(shipper)
    finally:
        tracing.shutdown()
    by = {s.name: s for s in got}
    assert set(by) == {
        "POST x",
        "sloserve.receive",
        "sloserve.admission",
        "sloserve.queue",
        "sloserve.encode_send",
        "sloserve.batch",
        "sloserve.replica.compute",
    }
    server, batch, compute = by["POST x"], by["sloserve.batch"], by["sloserve.replica.compute"]
    assert server.kind is SpanKind.SERVER and server.parent is not None and server.parent.span_id == 0xB7AD6B7169203331
    assert server.parent.is_remote and server.attributes["sloserve.outcome"] == "ok"
    assert server.status.status_code is StatusCode.UNSET
    sc = server.context
    assert sc is not None
    for name in ("sloserve.receive", "sloserve.admission", "sloserve.queue", "sloserve.encode_send"):
        s = by[name]
        assert s.parent is not None and s.parent.span_id == sc.span_id and not s.parent.is_remote, name
        assert s.context is not None and s.context.trace_id == sc.trace_id and s.kind is SpanKind.INTERNAL
        assert s.context.trace_state.get("vendor") == "1"  # the client's trace state, on every span
        assert s.start_time is not None and s.end_time is not None and s.start_time <= s.end_time
    assert server.start_time is not None and by["sloserve.receive"].start_time == server.start_time
    assert batch.parent is not None and batch.parent.span_id == sc.span_id
    assert [(link.context.trace_id, link.context.span_id) for link in batch.links] == [(sc.trace_id, sc.span_id)]
    assert batch.context is not None and parent == f"00-{sc.trace_id:032x}-{batch.context.span_id:016x}-01"
    assert [link.context.span_id for link in by["sloserve.queue"].links] == [batch.context.span_id]
    assert batch.attributes["sloserve.device_type"] == "cpu" and batch.attributes["sloserve.compute_ms"] == 1.0
    assert compute.parent is not None and compute.parent.span_id == batch.context.span_id
    assert by["sloserve.admission"].attributes["sloserve.admission.predicted_finish_ms"] == 10.0
    assert shipper.dropped() == (0, 0)


def test_a_request_shed_while_queued_marks_its_queue_and_server_spans():
    shipper = recording()
    try:
        rt = tracing.start_request("POST x", None, None, {})
        assert rt is not None and rt.parent is None
        now = time.monotonic()
        rt.admitted(now, now, now + 0.02, None, None)
        rt.finish(InvalidArgument("no input named 'nope'"))
        got = {s.name: s for s in spans(shipper)}
    finally:
        tracing.shutdown()
    server, queue = got["POST x"], got["sloserve.queue"]
    assert server.parent is None and server.status.status_code is StatusCode.ERROR
    assert server.status.description is not None and "nope" in server.status.description
    assert server.attributes["sloserve.outcome"] != "ok"
    assert queue.status.status_code is StatusCode.ERROR and queue.status.description == server.status.description


def test_a_refusal_at_admission_marks_the_admission_span():
    shipper = recording()
    try:
        rt = tracing.start_request("POST x", None, None, {})
        assert rt is not None
        now = time.monotonic()

        class Refused:
            late_by_s = (0.005,)

        rt.admitted(now, now, now + 0.02, Refused(), None)
        rt.finish()
        got = {s.name: s for s in spans(shipper)}
    finally:
        tracing.shutdown()
    admission = got["sloserve.admission"]
    assert admission.attributes["sloserve.admission.decision"] == "refuse"
    assert admission.attributes["sloserve.admission.predicted_finish_ms"] == 25.0
    assert admission.status.status_code is StatusCode.ERROR
    assert "sloserve.queue" not in got


def test_the_sampler_decides_once_and_an_unsampled_request_records_nothing():
    shipper = recording(TraceConfig(exporter="console", sampler="traceidratio", sampler_arg=0.0))
    try:
        assert tracing.start_request("POST x", None, None, {}) is None
        assert tracing.start_request("POST x", GOOD, None, {}) is None  # not parent-based: the ratio decides
    finally:
        tracing.shutdown()
    assert shipper.take() == []
    shipper = recording(TraceConfig(exporter="console", sampler="parentbased_traceidratio", sampler_arg=0.0))
    try:
        assert tracing.start_request("POST x", None, None, {}) is None
        assert tracing.start_request("POST x", GOOD, None, {}) is not None  # the client's sampled flag decides
    finally:
        tracing.shutdown()


def piece(n: int) -> tuple[Any, ...]:
    return tuple(("s", 0, 1, i + 1, 0, False, 0, 1, None, (), None, None) for i in range(n))


def test_the_buffer_holds_at_most_max_queue_size_spans_and_counts_the_rest():
    shipper = SpanShipper(TraceConfig(exporter="console", max_queue_size=10), {}, start=False)
    shipper.add(piece(4))
    shipper.add(piece(4))
    shipper.add(piece(4))  # 12 > 10: the whole piece is dropped
    assert shipper.dropped() == (4, 0)
    shipper.add(piece(2))  # exactly full
    shipper.add(piece(1))
    assert shipper.dropped() == (5, 0)
    assert [len(p) for p in shipper.take()] == [4, 4, 2]
    shipper.add(piece(10))  # room again once shipped
    assert shipper.dropped() == (5, 0)
    shipper.ship()  # no exporter process to take them: counted as failed
    assert shipper.dropped() == (5, 10)
    assert shipper.take() == []


def test_the_dropped_spans_metric_sums_the_gateway_and_its_exporter():
    shipper = recording(TraceConfig(exporter="console", max_queue_size=3))
    try:
        shipper.add(piece(2))
        shipper.add(piece(2))
        shipper.ship()
        (family,) = tracing.DroppedSpans().collect()
        assert {s.labels["reason"]: s.value for s in family.samples} == {"queue_full": 2.0, "export_failed": 2.0}
    finally:
        tracing.shutdown()
