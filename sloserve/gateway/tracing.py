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

Spans are plain records here, not SDK spans: a sampled request writes each of its spans as a tuple
(its ids from ``random.getrandbits``, its times on the wall clock) and hands them over in one piece
when it finishes; the batch span is one piece of its own. ``sloserve/gateway/span_export.py`` ships
them to an exporter process that builds the SDK's spans and exports them, so the gateway's event
loop pays neither for the SDK's span objects nor for the OTLP encoding.

The sampler is the SDK's (``OTEL_TRACES_SAMPLER``, ``sloserve/replica/tracing.py``'s
``sampler_of``), asked once per request. The SDK's tracer provider is still set up in this process
for its other spans (the training controller's decisions, ``sloserve/replica/tracing.py``);
:func:`setup` builds both from the settings and ``OTEL_*`` variables
(``sloserve/gateway/config_tracing.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from random import getrandbits
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import SpanContext, SpanKind

from sloserve.batching.options import split_key
from sloserve.gateway.config_tracing import resolve
from sloserve.gateway.span_export import Record, SpanShipper
from sloserve.replica import tracing as process_tracing
from sloserve.replica.tracing import TraceConfig, parse_traceparent, sampler_of


class Recorder:
    """What a traced gateway process records with: the sampler and the shipper of finished spans."""

    __slots__ = ("sampler", "shipper")

    def __init__(self, sampler: Sampler, shipper: SpanShipper):
        self.sampler = sampler
        self.shipper = shipper


BatchContext = tuple  # (trace_id, span_id, tracestate pairs or None) of a batch span
TRACER: Recorder | None = None
CONFIG = TraceConfig()
_REQUEST: ContextVar[RequestTrace | None] = ContextVar("sloserve_request_trace", default=None)
_BATCH: ContextVar[BatchContext | None] = ContextVar("sloserve_batch_span", default=None)
_NO_PARENT = Context()
_SERVER, _INTERNAL = SpanKind.SERVER.value, SpanKind.INTERNAL.value
REST_ROUTE = "/v2/models/{model}/infer"
GRPC_METHOD = "inference.GRPCInferenceService/ModelInfer"


def setup(settings: Any, env: Mapping[str, str] | None = None) -> TraceConfig:
    """This gateway process's tracing, from ``settings.tracing`` and the ``OTEL_*`` variables (which win)."""
    global TRACER, CONFIG
    shutdown()
    config = resolve(settings.tracing, os.environ if env is None else env)
    provider = process_tracing.setup(config, "gateway")
    if provider is not None:
        shipper = SpanShipper(config, provider.resource.attributes)
        TRACER = Recorder(sampler_of(config.sampler, config.sampler_arg), shipper)
    CONFIG = config
    return config


def shutdown() -> None:
    """Export what is still held (bounded by the export timeout) and stop; tracing is off afterwards."""
    global TRACER
    rec, TRACER = TRACER, None
    if rec is not None:
        rec.shipper.close()
    process_tracing.shutdown()


def flush(timeout_s: float = 5.0) -> bool:
    """Wait until every span finished so far has been exported or dropped."""
    rec = TRACER
    return process_tracing.flush(timeout_s) and (rec is None or rec.shipper.flush(timeout_s))


def dropped() -> tuple[int, int]:
    """Spans this gateway process dropped: (a queue was full, their export failed)."""
    full, failed = process_tracing.dropped()
    rec = TRACER
    if rec is not None:
        f, e = rec.shipper.dropped()
        full, failed = full + f, failed + e
    return full, failed


def replica_config() -> dict[str, Any] | None:
    """What a replica process traces with (None: tracing is off, the replica records nothing)."""
    return CONFIG.to_dict() if TRACER is not None else None


def _span_id() -> int:
    return getrandbits(64) or 1


def _traceparent(ctx: BatchContext) -> str:
    """The W3C ``traceparent`` of a (sampled) span."""
    return f"00-{ctx[0]:032x}-{ctx[1]:016x}-01"


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
    the request path stamped; the server span is written when the request finishes, and the whole
    request goes to the shipper then."""

    __slots__ = (
        "_answered",
        "_error",
        "_offset",
        "attributes",
        "dispatched",
        "name",
        "parent",
        "queued_at",
        "span_id",
        "spans",
        "start",
        "start_ns",
        "trace_id",
        "trace_int",
        "tracestate",
    )

    def __init__(
        self,
        name: str,
        trace_id: int,
        parent: SpanContext | None,
        tracestate: tuple[tuple[str, str], ...] | None,
        attributes: dict[str, Any],
        start: float,
    ):
        self.name = name
        self.trace_int = trace_id
        self.span_id = _span_id()
        self.parent = parent
        self.tracestate = tracestate
        self.attributes = attributes
        self.start = start
        self.start_ns = time.time_ns()
        self._offset = self.start_ns - int(start * 1e9)  # monotonic -> wall clock, for this request
        self.trace_id = f"{trace_id:032x}"
        self.spans: list[Record] = []
        self.queued_at: float | None = None
        self.dispatched = False
        self._answered: float | None = None
        self._error: str | None = None

    def child(
        self,
        name: str,
        start: float,
        end: float,
        attributes: dict[str, Any] | None = None,
        links: tuple[tuple[int, int], ...] = (),
        error: str | None = None,
    ) -> None:
        off = self._offset
        self.spans.append(
            (
                name,
                _INTERNAL,
                self.trace_int,
                _span_id(),
                self.span_id,
                False,
                int(start * 1e9) + off,
                int(end * 1e9) + off,
                attributes,
                links,
                error,
                self.tracestate,
            )
        )

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

    def batched(self, now: float, batch: BatchContext) -> None:
        """Its batch was dispatched at ``now``: the queue span, linked to the batch's."""
        self.dispatched = True
        start = self.queued_at if self.queued_at is not None else now
        self.child("sloserve.queue", start, now, {"sloserve.queue_ms": round((now - start) * 1e3, 3)}, (batch[:2],))

    def answered(self) -> None:
        """The data plane has the request's outputs: encoding and sending start."""
        self._answered = time.monotonic()

    def error(self, e: BaseException) -> None:
        """The request failed (a shed, a refusal, a bad request, a replica's error): the first reason counts."""
        if self._error is not None:
            return
        kind, self._error = _error_status(e)
        self.attributes["sloserve.outcome"] = kind
        if self.queued_at is not None and not self.dispatched:  # shed, or failed, while it waited
            self.dispatched = True
            self.child("sloserve.queue", self.queued_at, time.monotonic(), error=self._error)

    def finish(self, error: BaseException | None = None) -> None:
        if error is not None:
            self.error(error)
        if self._answered is not None:
            self.child("sloserve.encode_send", self._answered, time.monotonic())
        if self._error is None:
            self.attributes["sloserve.outcome"] = "ok"
        parent = self.parent
        self.spans.append(
            (
                self.name,
                _SERVER,
                self.trace_int,
                self.span_id,
                0 if parent is None else parent.span_id,
                parent is not None,
                self.start_ns,
                time.time_ns(),
                self.attributes,
                (),
                self._error,
                self.tracestate,
            )
        )
        rec = TRACER
        if rec is not None:
            rec.shipper.add(tuple(self.spans))


def start_request(
    name: str, traceparent: str | None, tracestate: str | None, attributes: Mapping[str, Any]
) -> RequestTrace | None:
    """A sampled request's trace (continuing ``traceparent`` when it is valid), or None when the
    sampler leaves it out (or tracing is off)."""
    rec = TRACER
    if rec is None:
        return None
    start = time.monotonic()
    parent = parse_traceparent(traceparent, tracestate) if traceparent else None
    if parent is None:
        trace_id = getrandbits(128) or 1
        ctx = _NO_PARENT
    else:
        trace_id = parent.trace_id
        ctx = trace.set_span_in_context(trace.NonRecordingSpan(parent))
    result = rec.sampler.should_sample(ctx, trace_id, name, SpanKind.SERVER, attributes)
    if not result.decision.is_sampled():
        return None
    state = result.trace_state
    pairs = tuple(state.items()) if state else None
    return RequestTrace(name, trace_id, parent, pairs, dict(result.attributes), start)


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
        if TRACER is None:
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
        links = tuple((rt.trace_int, rt.span_id) for rt in traces)
        first = traces[0]
        ctx = (first.trace_int, _span_id(), first.tracestate)
        for rt in traces:
            rt.batched(now, ctx)
        return (ctx, first.span_id, attrs, links, time.time_ns()), _BATCH.set(ctx)

    def end(
        self, handle: Any, device_type: str | None = None, compute_s: float | None = None, error: Any = None
    ) -> None:
        (ctx, parent_id, attrs, links, start_ns), token = handle
        _BATCH.reset(token)
        if device_type is not None:
            attrs["sloserve.device_type"] = device_type
        if compute_s is not None:
            attrs["sloserve.compute_ms"] = round(compute_s * 1e3, 3)
        status = None if error is None else _error_status(error)[1]
        record = ("sloserve.batch", _INTERNAL, ctx[0], ctx[1], parent_id, False, start_ns, time.time_ns())
        rec = TRACER
        if rec is not None:
            rec.shipper.add(((*record, attrs, links, status, ctx[2]),))


def batch_tracer() -> BatchTracer | None:
    return BatchTracer() if TRACER is not None else None


def batch_traceparent() -> str | None:
    """The running batch's context for its replica, when the batch is traced."""
    ctx = _BATCH.get()
    return None if ctx is None else _traceparent(ctx)


def local_compute(model: str, variant: str, rows: int, compute_s: float, device_type: str) -> None:
    """A batch computed in the gateway's own process (the in-process backend's threads): its compute span."""
    ctx = _BATCH.get()
    rec = TRACER
    if ctx is None or rec is None:
        return
    end = time.time_ns()
    attrs = {
        "sloserve.model": model,
        "sloserve.variant": variant,
        "sloserve.batch.size": rows,
        "sloserve.device_type": device_type,
    }
    start = end - int(compute_s * 1e9)
    name = "sloserve.replica.compute"
    rec.shipper.add(((name, _INTERNAL, ctx[0], _span_id(), ctx[1], False, start, end, attrs, (), None, ctx[2]),))


# ---- the dropped spans' count, exported at scrape time -------------------------------------------
class DroppedSpans:
    """A prometheus_client collector of the spans this process dropped (queue full, export failed)."""

    def describe(self) -> list:
        return []

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily

        full, failed_export = dropped()
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
