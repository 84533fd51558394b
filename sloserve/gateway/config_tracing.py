"""The ``tracing`` settings: OpenTelemetry traces over OTLP (a part of :class:`sloserve.gateway.config.Settings`).

Each key mirrors one of the OpenTelemetry SDK's standard environment variables, and **a variable that
is set wins over the key** (an operator's ``OTEL_*`` environment, as the OpenTelemetry Operator or a
platform injects it, needs no change to sloserve's config). Tracing is off unless configured: an
exporter named (``OTEL_TRACES_EXPORTER`` or ``tracing.exporter``) or an OTLP endpoint given
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``tracing.endpoint``)
turns it on; ``OTEL_SDK_DISABLED=true`` (or ``tracing.disabled``) turns it off whatever else says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sloserve.replica.tracing import PROTOCOLS, SAMPLERS, TraceConfig

ENV = {
    "exporter": "OTEL_TRACES_EXPORTER",
    "endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    "protocol": "OTEL_EXPORTER_OTLP_PROTOCOL",
    "sampler": "OTEL_TRACES_SAMPLER",
    "sampler_arg": "OTEL_TRACES_SAMPLER_ARG",
    "service_name": "OTEL_SERVICE_NAME",
    "disabled": "OTEL_SDK_DISABLED",
    "max_queue_size": "OTEL_BSP_MAX_QUEUE_SIZE",
}
TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"  # the full URL: used as it is, before the base one
TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"


class TracingSettings(BaseModel):
    """OpenTelemetry tracing (docs/operations.md, "Tracing"); each key's OTEL_* variable, when set, wins."""

    model_config = ConfigDict(extra="forbid")

    exporter: Literal["otlp", "console", "none"] | None = Field(
        default=None,
        description="OTEL_TRACES_EXPORTER. otlp, console (spans on stdout) or none; unset: otlp when an endpoint "
        "is given, else tracing is off.",
    )
    endpoint: str | None = Field(
        default=None,
        description="OTEL_EXPORTER_OTLP_ENDPOINT. The collector's base URL: http/protobuf posts to <endpoint>/v1/traces "
        "(default http://localhost:4318), grpc calls <endpoint> (default http://localhost:4317; http:// is plaintext). "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, a full URL, wins over both.",
    )
    protocol: Literal["http/protobuf", "grpc"] = Field(
        default="http/protobuf",
        description="OTEL_EXPORTER_OTLP_PROTOCOL (or OTEL_EXPORTER_OTLP_TRACES_PROTOCOL). OTLP over HTTP or gRPC.",
    )
    sampler: Literal[
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    ] = Field(
        default="parentbased_always_on",
        description="OTEL_TRACES_SAMPLER. Decided once per request, at its root span: an unsampled request "
        "records nothing more. parentbased_*: a client's sampled flag decides for its requests.",
    )
    sampler_arg: float | None = Field(
        default=None, ge=0, le=1, description="OTEL_TRACES_SAMPLER_ARG. The ratio of the *traceidratio samplers (1.0)."
    )
    service_name: str = Field(default="sloserve", min_length=1, description="OTEL_SERVICE_NAME.")
    disabled: bool = Field(default=False, description="OTEL_SDK_DISABLED. True: no tracing, whatever else is set.")
    max_queue_size: int = Field(
        default=2048,
        ge=1,
        le=1_000_000,
        description="OTEL_BSP_MAX_QUEUE_SIZE. Ended spans waiting for export, per process; a span that finds it "
        "full is dropped and counted (sloserve_trace_spans_dropped_total), never waited for.",
    )
    export_timeout_s: float = Field(
        default=5.0, gt=0, le=60, description="How long one export may take before its spans count as dropped."
    )


class TracingConfigError(ValueError):
    """An OTEL_* variable sloserve cannot use (start-up stops on it, naming it)."""


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1"):
        return True
    if v in ("false", "0", ""):
        return False
    raise TracingConfigError(f"{name}={value!r:.40}: expected true or false")


def resolve(settings: TracingSettings, env: Mapping[str, str]) -> TraceConfig:
    """The config this process and its replicas trace with: each OTEL_* variable that is set, else its key."""
    values = settings.model_dump()
    for key, name in ENV.items():
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        values[key] = raw.strip()
    if env.get(TRACES_PROTOCOL, "").strip():
        values["protocol"] = env[TRACES_PROTOCOL].strip()
    disabled = values["disabled"]
    if isinstance(disabled, str):
        disabled = _bool(ENV["disabled"], disabled)
    exporter = values["exporter"]
    if isinstance(exporter, str) and "," in exporter:  # a list: the first one sloserve knows
        exporter = next((e.strip() for e in exporter.split(",") if e.strip() in ("otlp", "console")), "none")
    traces_endpoint = env.get(TRACES_ENDPOINT, "").strip()
    base = values["endpoint"] or ""
    if exporter is None:
        exporter = "otlp" if (traces_endpoint or base) else "none"
    if exporter not in ("otlp", "console", "none"):
        raise TracingConfigError(f"{ENV['exporter']}={exporter!r:.40}: sloserve exports otlp, console or none")
    protocol = values["protocol"]
    if protocol not in PROTOCOLS:
        raise TracingConfigError(f"{ENV['protocol']}={protocol!r:.40}: expected one of {', '.join(PROTOCOLS)}")
    sampler = str(values["sampler"]).strip().lower()
    if sampler not in SAMPLERS:
        raise TracingConfigError(f"{ENV['sampler']}={sampler!r:.40}: expected one of {', '.join(SAMPLERS)}")
    arg = values["sampler_arg"]
    try:
        arg = None if arg is None else float(arg)
        queue = int(values["max_queue_size"])
    except ValueError as e:
        raise TracingConfigError(f"an OTEL_* variable is not a number: {e}") from None
    if arg is not None and not 0.0 <= arg <= 1.0:
        raise TracingConfigError(f"{ENV['sampler_arg']}={arg}: a ratio from 0 to 1")
    if traces_endpoint:
        endpoint = traces_endpoint
    elif protocol == "http/protobuf":
        endpoint = (base.rstrip("/") + "/v1/traces") if base else ""
    else:
        endpoint = base
    return TraceConfig(
        exporter="none" if disabled else exporter,
        endpoint=endpoint,
        protocol=protocol,
        sampler=sampler,
        sampler_arg=arg,
        service_name=str(values["service_name"]),
        max_queue_size=max(1, queue),
        export_timeout_s=float(values["export_timeout_s"]),
    )
