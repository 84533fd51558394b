"""OpenTelemetry tracing in every sloserve process: the gateway, a replica, the training controller.

Each process that records spans builds its own tracer provider from one :class:`TraceConfig` (the
gateway resolves it from its settings and the ``OTEL_*`` variables, ``sloserve/gateway/tracing.py``,
and hands the same values to its replicas), and exports them over OTLP (``http/protobuf`` or
``grpc``) from a background thread. A span ends into a bounded queue, never into the network: an
OTLP endpoint that is down or slow costs a request nothing, and the spans that find the queue full
or whose export fails are counted (:func:`dropped`), not retried.

The client's context is read from W3C ``traceparent`` / ``tracestate`` values by
:func:`parse_traceparent` and :func:`parse_tracestate`: a malformed value is ignored without a log
line (a client's junk must not fill the logs), so the request starts a new trace.

It sits on the replica floor, the lowest that runs a process of its own, so that the gateway, the
training controller and the replica all use this one module.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags, TraceState

log = logging.getLogger("sloserve.tracing")

SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
PROTOCOLS = ("http/protobuf", "grpc")
WARN_EVERY_S = 60.0  # a failing export says so at most this often (the exporters' own errors are muted)
_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
)


@dataclass(frozen=True)
class TraceConfig:
    """What a process needs to export its spans; plain values, so that it travels to a replica as a dict.

    ``exporter``: ``otlp``, ``console`` (spans printed on stdout, for a look without a backend) or
    ``none`` (tracing off). ``endpoint``: for ``http/protobuf`` the full URL spans are posted to
    (``.../v1/traces``), for ``grpc`` the collector's ``http[s]://host:port``."""

    exporter: str = "none"
    endpoint: str = ""
    protocol: str = "http/protobuf"
    sampler: str = "parentbased_always_on"
    sampler_arg: float | None = None
    service_name: str = "sloserve"
    max_queue_size: int = 2048
    max_export_batch_size: int = 512
    schedule_delay_s: float = 0.5
    export_timeout_s: float = 5.0

    @property
    def enabled(self) -> bool:
        return self.exporter in ("otlp", "console")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TraceConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


# ---- W3C trace context ---------------------------------------------------------------------------
_HEX = frozenset("0123456789abcdef")
_TRACESTATE_KEY = re.compile(r"[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}")
_TRACESTATE_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")


def _hex(s: str) -> bool:
    return bool(s) and all(c in _HEX for c in s) and any(c != "0" for c in s)


def parse_traceparent(value: str | None, tracestate: str | None = None) -> SpanContext | None:
    """The remote span a W3C ``traceparent`` names, or None when it is absent or malformed.

    >>> parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").trace_id == 0x0af7651916cd43dd8448eb211c80319c
    True
    >>> parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1") is None
    True
    """
    if not value or len(value) < 55 or len(value) > 512:
        return None
    version, trace_id, span_id, flags = value[:2], value[3:35], value[36:52], value[53:55]
    if value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    if not all(c in _HEX for c in version) or version == "ff":
        return None
    if len(value) > 55 and (version == "00" or value[55] != "-"):  # version 00 has exactly four fields
        return None
    if not (_hex(trace_id) and _hex(span_id)) or not all(c in _HEX for c in flags):
        return None
    return SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(flags, 16) & 0x01),
        trace_state=parse_tracestate(tracestate),
    )


def parse_tracestate(value: str | None) -> TraceState | None:
    """A W3C ``tracestate`` as a TraceState; None when absent or malformed (the whole header is then dropped).

    >>> parse_tracestate("vendor=abc,other@sys=1").get("vendor")
    'abc'
    >>> parse_tracestate("bad key=1") is None
    True
    """
    if not value or len(value) > 512:
        return None
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for member in value.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        key, eq, val = member.partition("=")
        if not eq or not _TRACESTATE_KEY.fullmatch(key) or not _TRACESTATE_VALUE.fullmatch(val) or key in seen:
            return None
        seen.add(key)
        pairs.append((key, val))
    if not pairs or len(pairs) > 32:
        return None
    return TraceState(pairs)


def context_of(value: str | None, tracestate: str | None = None) -> Context | None:
    """An OpenTelemetry context whose parent is the remote span ``value`` names; None without a valid one."""
    remote = parse_traceparent(value, tracestate)
    return None if remote is None else trace.set_span_in_context(trace.NonRecordingSpan(remote))


def traceparent_of(ctx: SpanContext) -> str:
    """The W3C ``traceparent`` of a span (for the batch channel and the Serve handle)."""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags) & 1:02x}"


# ---- the bounded export queue ------------------------------------------------------------------
class BoundedSpanProcessor(SpanProcessor):
    """Ended spans go to a queue of at most ``max_queue_size``; a thread exports them in batches.

    A span that finds the queue full is dropped and counted; so are the spans of a batch whose export
    failed (the exporter's own timeout bounds how long that thread waits). Nothing here ever blocks
    the thread that ends a span.

    ``convert``: the queue holds something else than spans (:meth:`put`), and the export thread turns
    each into a span with it (the gateway's exporter process queues the gateway's records so)."""

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue_size: int = 2048,
        max_export_batch_size: int = 512,
        schedule_delay_s: float = 0.5,
        convert: Callable[[Any], ReadableSpan] | None = None,
    ):
        self.exporter = exporter
        self.convert = convert
        self.max_queue_size = max(1, max_queue_size)
        self.batch_size = max(1, min(max_export_batch_size, self.max_queue_size))
        self.delay_s = schedule_delay_s
        self._queue: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._stop = False
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self.dropped_full = 0  # found the queue full
        self.dropped_export = 0  # in a batch whose export failed
        self.exported = 0
        self._warned = -WARN_EVERY_S
        self._thread = threading.Thread(target=self._run, name="sloserve-span-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self.put(span)

    def put(self, item: Any) -> None:
        if self._stop:
            return
        if len(self._queue) >= self.max_queue_size:
            with self._lock:
                self.dropped_full += 1
            return
        self._queue.append(item)
        if len(self._queue) >= self.batch_size:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.delay_s)
            self._wake.clear()
            self._export_all()
            if self._stop:
                return

    def _export_all(self) -> None:
        self._idle.clear()
        try:
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(self.batch_size, len(self._queue)))]
                try:
                    if self.convert is not None:
                        batch = [self.convert(item) for item in batch]
                    ok = self.exporter.export(batch) == SpanExportResult.SUCCESS
                except Exception as e:  # an exporter bug or a refused connection: counted, never raised
                    log.debug("span export failed: %r", e)
                    ok = False
                with self._lock:
                    if ok:
                        self.exported += len(batch)
                    else:
                        self.dropped_export += len(batch)
                if not ok and time.monotonic() - self._warned > WARN_EVERY_S:
                    self._warned = time.monotonic()
                    log.warning(
                        "could not export %d spans (%d dropped so far); they are dropped, not retried",
                        len(batch),
                        self.dropped,
                    )
        finally:
            self._idle.set()

    @property
    def dropped(self) -> int:
        return self.dropped_full + self.dropped_export

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        end = time.monotonic() + timeout_millis / 1e3
        while time.monotonic() < end:
            if not self._queue and self._idle.is_set():
                return True
            self._wake.set()
            time.sleep(0.01)
        return not self._queue

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=max(1.0, self.delay_s * 4))
        try:
            self.exporter.shutdown()
        except Exception:
            pass


# ---- one provider per process ------------------------------------------------------------------
_provider: TracerProvider | None = None
_processor: BoundedSpanProcessor | None = None


def sampler_of(name: str, arg: float | None) -> Sampler:
    ratio = 1.0 if arg is None else float(arg)
    root: Sampler
    if name.endswith("traceidratio"):
        root = TraceIdRatioBased(ratio)
    elif name.endswith("always_off"):
        root = ALWAYS_OFF
    else:
        root = ALWAYS_ON
    return ParentBased(root) if name.startswith("parentbased_") else root


def exporter_of(config: TraceConfig) -> SpanExporter:
    if config.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        endpoint = config.endpoint or "http://localhost:4317"
        return GrpcExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"), timeout=config.export_timeout_s)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=config.endpoint or "http://localhost:4318/v1/traces", timeout=config.export_timeout_s)


def resource_of(role: str, config: TraceConfig, attributes: Mapping[str, Any] | None = None) -> Resource:
    """This process's resource: the service, ``role`` (``gateway``, ``replica``, ``training``) and the
    process id, so that a backend shows which process recorded each span."""
    pid = os.getpid()
    host = socket.gethostname()
    return Resource.create(
        {
            "service.name": config.service_name,
            "service.instance.id": f"{role}-{host}-{pid}",
            "process.pid": pid,
            "host.name": host,
            "sloserve.role": role,
            **(attributes or {}),
        }
    )


def processor_of(config: TraceConfig, convert: Callable[[Any], ReadableSpan] | None = None) -> BoundedSpanProcessor:
    """The bounded export queue and its thread, exporting with ``config``'s exporter."""
    for name in _EXPORTER_LOGGERS:  # an error line per failed export: the processor counts and warns instead
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return BoundedSpanProcessor(
        exporter_of(config), config.max_queue_size, config.max_export_batch_size, config.schedule_delay_s, convert
    )


def setup(config: TraceConfig, role: str, attributes: Mapping[str, Any] | None = None) -> TracerProvider | None:
    """Build this process's tracer provider (replacing one set up before); None when tracing is off.

    Its resource is :func:`resource_of`'s, its processor :func:`processor_of`'s."""
    global _provider, _processor
    shutdown()
    if not config.enabled:
        return None
    processor = processor_of(config)
    provider = TracerProvider(
        resource=resource_of(role, config, attributes), sampler=sampler_of(config.sampler, config.sampler_arg)
    )
    provider.add_span_processor(processor)
    _provider, _processor = provider, processor
    return provider


def tracer(name: str) -> trace.Tracer | None:
    """A tracer of this process's provider, or None while tracing is off here."""
    return None if _provider is None else _provider.get_tracer(name)


def dropped() -> tuple[int, int]:
    """Spans this process dropped: (the queue was full, their export failed)."""
    p = _processor
    return (0, 0) if p is None else (p.dropped_full, p.dropped_export)


def flush(timeout_s: float = 5.0) -> bool:
    return True if _provider is None else _provider.force_flush(int(timeout_s * 1e3))


def shutdown() -> None:
    """Export what is queued (bounded by the exporter's timeout) and stop; tracing is off afterwards."""
    global _provider, _processor
    provider, _provider, _processor = _provider, None, None
    if provider is not None:
        try:
            provider.shutdown()
        except Exception as e:
            log.debug("tracer provider shutdown: %r", e)


# ---- the replica's compute ---------------------------------------------------------------------
def start_compute(
    traceparent: str | None, model: str, variant: str | None, rows: int, start_ns: int | None = None
) -> trace.Span | None:
    """The span of one batch's compute in a replica, a child of the gateway's batch span; None when
    tracing is off in this process or the batch carries no context."""
    t = tracer("sloserve.replica") if traceparent else None
    if t is None:
        return None
    ctx = context_of(traceparent)
    if ctx is None:
        return None
    attrs: dict[str, Any] = {"sloserve.model": model, "sloserve.batch.size": rows}
    if variant:
        attrs["sloserve.variant"] = variant
    return t.start_span("sloserve.replica.compute", context=ctx, attributes=attrs, start_time=start_ns)


def end_compute(span: trace.Span | None, error: str | None = None, attributes: Mapping[str, Any] | None = None) -> None:
    if span is None:
        return
    if attributes:
        span.set_attributes(dict(attributes))
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def rows_of(inputs: Mapping[str, Any] | Sequence[Any]) -> int:
    """A batch's rows: the leading dimension of its first input."""
    for a in inputs.values() if isinstance(inputs, Mapping) else inputs:
        shape = getattr(a, "shape", None)
        return int(shape[0]) if shape else 1
    return 0


@contextlib.contextmanager
def operation(scope: str, name: str, attributes: Mapping[str, Any]) -> Iterator[trace.Span | None]:
    """A span around one operation of a background loop (the training controller's place, preempt and
    resume); yields None, at no cost, while tracing is off. An exception sets its status and is raised."""
    t = tracer(scope)
    if t is None:
        yield None
        return
    with t.start_as_current_span(name, attributes=dict(attributes)) as span:
        yield span


def start_operation(scope: str, name: str, attributes: Mapping[str, Any]) -> trace.Span | None:
    """A root span of a background loop's operation (the training controller's place, preempt and
    resume), ended by :func:`end_span`; None, at no cost, while tracing is off in this process."""
    t = tracer(scope)
    return None if t is None else t.start_span(name, attributes=dict(attributes))


end_span = end_compute
