"""Tracing in the gateway: one trace per sampled request, one span per batch, the replicas' context.

Off (``TRACER`` None) the request path pays one check of ``TRACER`` per hook and nothing else. On,
the sampler decides once, at the request's root span: an unsampled request gets no
:class:`RequestTrace` and records nothing more, and a batch with no sampled member gets no span.

A sampled request's spans, all children of its server span (which continues the client's W3C
``traceparent`` from the REST header or the gRPC metadata, or starts a trace):

- ``sloserve.receive``: from the request's start to its decoded tensors reaching the data plane;
- ``sloserve.admission``: the batching policy's decision, with the predicted finish when the policy made one;
- ``sloserve.queue``: from admission to its batch's dispatch, linked to the batch span;
- ``sloserve.encode_send``: from the batch's outputs to the answer written.

A batch's ``sloserve.batch`` span is a child of its first sampled member's server span and links to
every sampled member's; it carries the batch's size, variant and device type. Its context goes to
the replica (the batch channel's frame, the Serve handle's argument), whose
``sloserve.replica.compute`` span is recorded and exported by the replica process itself
(``sloserve/replica/tracing.py``).

The process's provider, its bounded export queue and the dropped spans' count are
``sloserve/replica/tracing.py``'s; :func:`setup` builds them from the settings and ``OTEL_*``
variables (``sloserve/gateway/config_tracing.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode

from sloserve.batching.options import split_key
from sloserve.gateway.config_tracing import resolve
from sloserve.replica import tracing as process_tracing
from sloserve.replica.tracing import TraceConfig, traceparent_of

TRACER: trace.Tracer | None = None
CONFIG = TraceConfig()
_REQUEST: ContextVar[RequestTrace | None] = ContextVar("sloserve_request_trace", default=None)
_BATCH: ContextVar[SpanContext | None] = ContextVar("sloserve_batch_span", default=None)
REST_ROUTE = "/v2/models/{model}/infer"
GRPC_METHOD = "inference.GRPCInferenceService/ModelInfer"


def setup(settings: Any, env: Mapping[str, str] | None = None) -> TraceConfig:
    """This gateway process's tracing, from ``settings.tracing`` and the ``OTEL_*`` variables (which win)."""
    global TRACER, CONFIG
    config = resolve(settings.tracing, os.environ if env is None else env)
    provider = process_tracing.setup(config, "gateway")
    TRACER = None if provider is None else provider.get_tracer("sloserve.gateway")
    CONFIG = config
    return config


def shutdown() -> None:
    global TRACER
    TRACER = None
    process_tracing.shutdown()


def replica_config() -> dict[str, Any] | None:
    """What a replica process traces with (None: tracing is off, the replica records nothing)."""
    return CONFIG.to_dict() if TRACER is not None else None


def wall_ns(mono_s: float) -> int:
    """A ``time.monotonic()`` instant on the wall clock spans are stamped with."""
    return time.time_ns() - int((time.monotonic() - mono_s) * 1e9)


def _error_status(e: BaseException) -> tuple[str, str]:
    """(outcome, status description): the error's metrics kind, with its reason when it has one
    (``shed/admission``, ``shed/deadline``, ``invalid``), then its message."""
    kind = str(getattr(e, "kind", None) or type(e).__name__)
    reason = getattr(e, "reason", None)
    if isinstance(reason, str) and reason:
        kind = f"{kind}/{reason}"
    message = getattr(e, "message", None) or str(e)
    return kind, f"{kind}: {message:.300}"


class RequestTrace:
    """One sampled request's spans. Children are written once their end is known, with the times
    the request path stamped, so nothing is held open but the server span."""

    __slots__ = ("_answered", "_error", "ctx", "dispatched", "queued_at", "span", "start", "trace_id")

    def __init__(self, span: trace.Span, start: float):
        self.span = span
        self.ctx = trace.set_span_in_context(span)
        self.start = start
        self.trace_id = f"{span.get_span_context().trace_id:032x}"
        self.queued_at: float | None = None
        self.dispatched = False
        self._answered: float | None = None
        self._error: str | None = None

    def child(
        self,
        name: str,
        start: float,
        end: float,
        attributes: Mapping[str, Any] | None = None,
        links: Iterable[Link] = (),
        error: str | None = None,
    ) -> None:
        assert TRACER is not None
        span = TRACER.start_span(
            name, context=self.ctx, attributes=attributes, links=list(links), start_time=wall_ns(start)
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=wall_ns(end))

    @property
    def exemplar(self) -> dict[str, str]:
        return {"trace_id": self.trace_id}

    # ---- hooks on the request path ---------------------------------------------------------
    def decoded(self) -> None:
        """The decoded request reached the data plane."""
        self.child("sloserve.receive", self.start, time.monotonic())

    def admitted(
        self, now: float, arrival_s: float, deadline_s: float, refused: Any, predicted_finish_s: float | None
    ) -> None:
        """The batching policy's decision at ``now`` (the batcher's clock: ``time.monotonic``)."""
        attrs: dict[str, Any] = {
            "sloserve.admission.decision": "refuse" if refused is not None else "admit",
            "sloserve.deadline_ms": round((deadline_s - arrival_s) * 1e3, 3),
        }
        if refused is not None and getattr(refused, "late_by_s", None):
            predicted_finish_s = deadline_s + refused.late_by_s[0]
        if predicted_finish_s is not None:
            attrs["sloserve.admission.predicted_finish_ms"] = round((predicted_finish_s - arrival_s) * 1e3, 3)
        self.child(
            "sloserve.admission",
            now,
            time.monotonic(),
            attrs,
            error="shed/admission: the predicted finish misses the deadline" if refused is not None else None,
        )
        if refused is None:
            self.queued_at = now

    def batched(self, now: float, batch: SpanContext) -> None:
        """Its batch was dispatched at ``now``: the queue span, linked to the batch's."""
        self.dispatched = True
        start = self.queued_at if self.queued_at is not None else now
        self.child("sloserve.queue", start, now, {"sloserve.queue_ms": round((now - start) * 1e3, 3)}, (Link(batch),))

    def answered(self) -> None:
        """The data plane has the request's outputs: encoding and sending start."""
        self._answered = time.monotonic()

    def error(self, e: BaseException) -> None:
        """The request failed (a shed, a refusal, a bad request, a replica's error): the first reason counts."""
        if self._error is not None:
            return
        kind, self._error = _error_status(e)
        self.span.set_attribute("sloserve.outcome", kind)
        if self.queued_at is not None and not self.dispatched:  # shed, or failed, while it waited
            self.dispatched = True
            self.child("sloserve.queue", self.queued_at, time.monotonic(), error=self._error)

    def finish(self, error: BaseException | None = None) -> None:
        if error is not None:
            self.error(error)
        if self._answered is not None:
            self.child("sloserve.encode_send", self._answered, time.monotonic())
        if self._error is not None:
            self.span.set_status(Status(StatusCode.ERROR, self._error))
        else:
            self.span.set_attribute("sloserve.outcome", "ok")
        self.span.end()


def start_request(
    name: str, traceparent: str | None, tracestate: str | None, attributes: Mapping[str, Any]
) -> RequestTrace | None:
    """A request's server span (continuing ``traceparent`` when it is valid), or None when the
    sampler leaves it out (or tracing is off)."""
    t = TRACER
    if t is None:
        return None
    start = time.monotonic()
    parent = process_tracing.context_of(traceparent, tracestate) if traceparent else None
    span = t.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
    if not span.is_recording():
        return None
    return RequestTrace(span, start)


def current() -> RequestTrace | None:
    """The request being served in this task, when it is sampled."""
    return _REQUEST.get()


def failed(e: BaseException) -> None:
    """A transport answers an error for the current request (one that may not have reached the data plane)."""
    rt = _REQUEST.get()
    if rt is not None:
        rt.error(e)


# ---- the transports ----------------------------------------------------------------------------
def _asgi_header(scope: Mapping[str, Any], name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return v.decode("latin-1")
    return None


async def serve_rest(
    serve: Callable[..., Awaitable[None]],
    scope: Mapping[str, Any],
    receive: Any,
    send: Any,
    model: str,
    version: str | None,
) -> None:
    """Run the REST fast path's ``serve`` for one infer request inside its trace."""
    rt = start_request(
        f"POST {REST_ROUTE}",
        _asgi_header(scope, b"traceparent"),
        _asgi_header(scope, b"tracestate"),
        {
            "http.request.method": "POST",
            "http.route": REST_ROUTE,
            "url.path": scope["path"],
            "sloserve.model": model,
            "sloserve.transport": "rest",
        },
    )
    if rt is None:
        return await serve(scope, receive, send, model, version)
    token = _REQUEST.set(rt)
    try:
        await serve(scope, receive, send, model, version)
    except BaseException as e:
        rt.error(e)
        raise
    finally:
        _REQUEST.reset(token)
        rt.finish()


async def serve_grpc(serve: Callable[[Any, Any], Awaitable[Any]], request: Any, context: Any) -> Any:
    """Run gRPC's ``ModelInfer`` for one request inside its trace (the context from the call's metadata)."""
    md = {k: v for k, v in (context.invocation_metadata() or ()) if k in ("traceparent", "tracestate")}
    tp, ts = md.get("traceparent"), md.get("tracestate")
    rt = start_request(
        GRPC_METHOD,
        tp if isinstance(tp, str) else None,
        ts if isinstance(ts, str) else None,
        {
            "rpc.system": "grpc",
            "rpc.service": "inference.GRPCInferenceService",
            "rpc.method": "ModelInfer",
            "sloserve.model": request.model_name,
            "sloserve.transport": "grpc",
        },
    )
    if rt is None:
        return await serve(request, context)
    token = _REQUEST.set(rt)
    try:
        return await serve(request, context)
    except BaseException as e:
        rt.error(e)
        raise
    finally:
        _REQUEST.reset(token)
        rt.finish()


# ---- batches -----------------------------------------------------------------------------------
class BatchTracer:
    """The batcher's hook (``Batcher.tracer``, sloserve/batching/batcher.py): one span per batch with a
    sampled member, its context current while the backend runs the batch."""

    def start(self, model: str, key: str, rows: int, requests: int, traces: list[Any], reason: str) -> Any:
        t = TRACER
        if t is None:
            return None
        now = time.monotonic()
        variant, device = split_key(key, "")
        attrs: dict[str, Any] = {
            "sloserve.model": model,
            "sloserve.variant": variant,
            "sloserve.batch.size": rows,
            "sloserve.batch.requests": requests,
            "sloserve.batch.sampled_requests": len(traces),
            "sloserve.batch.reason": reason,
        }
        if device:
            attrs["sloserve.device_type"] = device
        links = [Link(rt.span.get_span_context()) for rt in traces]
        span = t.start_span("sloserve.batch", context=traces[0].ctx, links=links, attributes=attrs)
        sc = span.get_span_context()
        for rt in traces:
            rt.batched(now, sc)
        return span, _BATCH.set(sc)

    def end(
        self, handle: Any, device_type: str | None = None, compute_s: float | None = None, error: Any = None
    ) -> None:
        span, token = handle
        _BATCH.reset(token)
        if device_type is not None:
            span.set_attribute("sloserve.device_type", device_type)
        if compute_s is not None:
            span.set_attribute("sloserve.compute_ms", round(compute_s * 1e3, 3))
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, _error_status(error)[1]))
        span.end()


def batch_tracer() -> BatchTracer | None:
    return BatchTracer() if TRACER is not None else None


def batch_traceparent() -> str | None:
    """The running batch's context for its replica, when the batch is traced."""
    sc = _BATCH.get()
    return None if sc is None else traceparent_of(sc)


def local_compute(model: str, variant: str, rows: int, compute_s: float, device_type: str) -> None:
    """A batch computed in the gateway's own process (the in-process backend's threads): its compute span."""
    sc = _BATCH.get()
    t = TRACER
    if sc is None or t is None:
        return
    end = time.time_ns()
    span = t.start_span(
        "sloserve.replica.compute",
        context=trace.set_span_in_context(trace.NonRecordingSpan(sc)),
        attributes={
            "sloserve.model": model,
            "sloserve.variant": variant,
            "sloserve.batch.size": rows,
            "sloserve.device_type": device_type,
        },
        start_time=end - int(compute_s * 1e9),
    )
    span.end(end_time=end)


# ---- the dropped spans' count, exported at scrape time -------------------------------------------
class DroppedSpans:
    """A prometheus_client collector of the spans this process dropped (queue full, export failed)."""

    def describe(self) -> list:
        return []

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily

        full, failed_export = process_tracing.dropped()
        c = CounterMetricFamily(
            "sloserve_trace_spans_dropped",
            "Spans this gateway process dropped instead of exporting: the export queue was full, or their export failed.",
            labels=["reason"],
        )
        c.add_metric(["queue_full"], float(full))
        c.add_metric(["export_failed"], float(failed_export))
        yield c


def register_metrics(registry: Any) -> None:
    registry.register(DroppedSpans())
