"""Settings: pydantic v2, validated at start-up, resolved once.

Precedence: command-line flags > environment (``SLOSERVE_*``, nested with ``__``) > config file
(``--config sloserve.yaml|.toml|.json``) > defaults. A bad value stops start-up with a message that
names the key and the value.
"""

from __future__ import annotations

import ipaddress
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict, SettingsError

from sloserve.autoscaler.swayam import SwayamConfig
from sloserve.gateway.config_tracing import TracingSettings
from sloserve.gateway.config_training import TrainingSettings


class AutoscalingSettings(SwayamConfig):
    """Swayam autoscaling of a model's Ray replicas (Ray Serve's custom autoscaling policy): the
    replica bounds, and every :class:`~sloserve.autoscaler.swayam.SwayamConfig` knob with the defaults the
    simulator measures (docs/simulator.md): one source of defaults, live and simulated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_replicas: int = Field(default=1, ge=1, description="Never fewer replicas per variant.")
    max_replicas: int = Field(default=4, ge=1, description="Never more replicas per variant.")

    def swayam(self) -> dict[str, Any]:
        """The policy's own settings (everything but the bounds), as JSON values for Ray Serve."""
        return self.model_dump(mode="json", exclude={"min_replicas", "max_replicas"})


class ModelOverride(BaseModel):
    """Per-model overrides of the repository's config.json."""

    model_config = ConfigDict(extra="forbid")

    slo_ms: float | None = Field(default=None, gt=0, description="Default latency budget (ms).")
    batching: dict[str, Any] | None = Field(
        default=None, description="Batching policy and its arguments, e.g. {policy: timeout, max_wait_ms: 2}."
    )
    max_queue_rows: int | None = Field(default=None, ge=1, description="Bound on queued rows for this model.")
    instances: int | None = Field(default=None, ge=1, le=64, description="Replicas per variant.")
    device_type: str | None = Field(
        default=None, description="Device type its Ray replicas run on: cpu, or a GPU type such as T4 / A100."
    )
    device_types: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Device types it has replicas on at once, e.g. [cpu, T4]: every (variant, device type) pair "
        "is a serving option with its own profile, and the batching policy picks a pair per batch "
        "(docs/batching.md, 'Variants across device types'). In-process, a type other than cpu (or "
        "cuda, or this host's GPU) is emulated: a replica runs the real session, then waits out the "
        "pair's profiled time. Not with device_type, nor with shared_replicas.",
    )
    autoscaling: AutoscalingSettings | None = Field(
        default=None, description="Scale this model's Ray replicas with the swayam policy (None: fixed count)."
    )
    fault_delay_ms: float = Field(
        default=0.0,
        ge=0,
        le=600_000,
        description="Chaos drills only: each replica (Ray or in-process) sleeps this long inside every batch "
        "before computing.",
    )
    shared_replicas: bool = Field(
        default=False,
        description="Every replica holds all of the model's variants and runs whichever a batch asks for, so a "
        "cheaper variant absorbs an overload on the same replicas instead of idling on replicas of its "
        "own (docs/batching.md, 'Variants on shared replicas'); with autoscaling, swayam sizes its warm "
        "buffer with the next variant down. Ray: one deployment per model, '<model>-shared-<device>' "
        "(with ray_deploy false, deploy sloserve.replica.ray_replica:build_app with args.variants, best first). "
        "The replicas gauge counts them once, under the best variant. Not with replica_processes.",
    )

    @model_validator(mode="after")
    def _one_device_spelling(self) -> ModelOverride:
        if self.device_type is not None and self.device_types is not None:
            raise ValueError(
                "set device_type (one device type) or device_types (several), not both: "
                f"device_type={self.device_type!r}, device_types={self.device_types!r}"
            )
        if self.device_types is not None:
            seen = [d.lower() for d in self.device_types]
            if len(set(seen)) != len(seen):
                raise ValueError(f"device_types lists a device type twice: {self.device_types}")
            if any("@" in d or not d.strip() for d in self.device_types):
                raise ValueError(f"device_types: names must be non-empty and without '@': {self.device_types}")
            if self.shared_replicas and len(self.device_types) > 1:
                raise ValueError("shared_replicas does not work with several device_types (one replica holds one type)")
        return self

    def devices(self) -> list[str]:
        """The device types as configured (``device_types``, else ``[device_type]``, else ``[]``)."""
        if self.device_types is not None:
            return list(self.device_types)
        return [self.device_type] if self.device_type else []


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SLOSERVE_", env_nested_delimiter="__", extra="forbid")

    host: str = Field(default="127.0.0.1", description="Address both servers bind.")
    http_port: int = Field(default=8000, ge=0, le=65535, description="KServe V2 REST port (0 = any free).")
    grpc_port: int = Field(default=8001, ge=0, le=65535, description="KServe V2 gRPC port (0 = any free).")
    triton_metrics: bool = Field(
        default=False,
        description="Also serve Triton's nv_inference_* metrics at /metrics on triton_metrics_port, derived from "
        "sloserve's own at each scrape (docs/operations.md, 'Coming from Triton'); same host, auth and TLS as REST.",
    )
    triton_metrics_port: int = Field(
        default=8002, ge=0, le=65535, description="Port of Triton's metrics (Triton's convention: 8002; 0 = any free)."
    )
    repo: Path = Field(default=Path("model_repository"), description="Model repository directory.")
    backend: Literal["ray", "inprocess"] = Field(
        default="ray", description="Where replicas run: Ray Serve (default) or in the gateway process."
    )
    ray_address: str | None = Field(
        default=None, description="Join this Ray cluster (auto | ray://host:port); default: start a local Ray."
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Gateway processes on this host, sharing the HTTP and gRPC ports (the kernel spreads "
        "connections over them), supervised as one service (sloserve/gateway/workers.py). Default: half the host's "
        "cores, at most 8 (1 on 2 cores: the replicas and the load need the other core).",
    )
    capacity_leases: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Share the Ray replicas' slots among gateways through leases (sloserve/gateway/backends/"
        "ray_capacity.py), so N gateways never stack more than pipeline_depth batches on a replica. auto: "
        "on with several workers or when joining a cluster (ray_address), where other gateways may be.",
    )
    instances: int = Field(default=1, ge=1, le=64, description="Replicas per (model, variant).")
    ray_num_cpus: float | None = Field(
        default=None,
        gt=0,
        description="CPUs the embedded local Ray offers (default: all cores, or the CPUs its start-up replicas reserve where that is more).",
    )
    device_cost: dict[str, float] = Field(
        default_factory=dict,
        description="Price of one replica on each device type, e.g. {cpu: 0.1, T4: 0.35, A100: 2.9} (any unit, "
        "per hour; 1 where not listed). A model on several device_types with autoscaling splits its demand "
        "over them best requests/s per unit of price first, each type up to what max_replicas serve "
        "(sloserve/autoscaler/typesplit.py).",
    )
    emulated_gpus: dict[str, int] = Field(
        default_factory=dict,
        description="Typed GPUs the embedded local Ray pretends to have, e.g. {T4: 2, A100: 1} (CPU boxes).",
    )
    replica_num_cpus: float = Field(default=0.25, gt=0, le=64, description="num_cpus of each Ray replica.")
    replica_gpu_fraction: float = Field(default=0.5, gt=0, le=8, description="num_gpus of each GPU replica.")
    pipeline_depth: int = Field(
        default=2, ge=1, le=8, description="Batches in flight per Ray replica (2 overlaps Ray's hand-off with compute)."
    )
    inprocess_pipeline_depth: int | None = Field(
        default=None,
        ge=1,
        le=8,
        description="Batches in flight per in-process replica: a second one waits on the replica and starts the "
        "moment the first ends, without a round trip through the event loop. Default: 1 in threads "
        "(2 pays on hosts with 4+ cores; on 2 cores the waiting thread competes with the event loop), "
        "2 with replica_processes (a worker at depth 1 idles through every round trip).",
    )
    replica_processes: bool = Field(
        default=False,
        description="In-process backend: each replica computes in a worker process of its own (batches cross a "
        "socket, pickled), so ONNX Runtime never waits for the gateway's GIL (sloserve/gateway/backends/processes.py). "
        "A variant whose batches run under inline_below_us gets no worker: it computes on the loop, "
        "as without workers. Pays on hosts with a core per worker beside the loop's (docs/benchmarks.md, saturation "
        "on a 16-core host); on 2 cores the workers compete with the event loop.",
    )
    ray_transport: Literal["direct", "grpc", "object_ref"] = Field(
        default="direct",
        description="How a batch reaches its Ray Serve replica: direct (the gateway keeps a socket to each "
        "running replica's batch channel and routes batches itself; sloserve/gateway/backends/ray_channels.py), "
        "grpc (through a DeploymentHandle, whose router calls the replica's inter-deployment gRPC "
        "server, as Ray Serve's throughput-optimized mode does) or object_ref (a DeploymentHandle "
        "call as a Ray actor task). direct keeps a 20 ms SLO's tail that the handle's path misses "
        "(docs/architecture.md, 'The Ray hand-off'); direct and grpc need the gateway to reach the "
        "replicas' nodes.",
    )
    batch_timeout_s: float = Field(default=30.0, gt=0, description="A batch not back by then fails (504).")
    shutdown_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="On SIGTERM the gateway reports not ready, refuses new requests (503) and gives the ones in "
        "flight this long to finish, over HTTP and gRPC alike (a rolling update loses none).",
    )
    model_load_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="A load through the repository API (POST /v2/repository/models/<m>/load) waits this long for "
        "the model's replicas to start; past it the load fails (400) and the model stays unavailable.",
    )
    unload_drain_s: float = Field(
        default=30.0,
        ge=0,
        description="An unload (or a reload) lets the model's requests already admitted finish for at most this "
        "long; the ones still queued after it get 503.",
    )
    no_replica_wait_s: float = Field(
        default=2.0,
        gt=0,
        description="A request whose every allowed variant has had no running replica for this long (the "
        "backend lost Ray, or a variant's last replica died and none is back) fails at once with 503 + "
        "Retry-After, queued or new; meanwhile the model reports not ready.",
    )
    best_effort_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="A request that names no slo_ms is served best-effort: never refused at admission, queued "
        "behind requests with deadlines, and refused (503 + Retry-After) only if it waits this long for a "
        "replica, or when the queue is full (429). A request that names slo_ms is served by its deadline.",
    )
    late_grace_s: float | None = Field(
        default=1.0,
        ge=0,
        description="A dispatched batch still out this long after its latest deadline fails (504); "
        "null waits up to batch_timeout_s. Bounds Ray's own re-routing after a replica dies.",
    )
    ray_deploy: bool = Field(
        default=True, description="Deploy the replicas on start; False attaches to already deployed ones."
    )
    intra_op_threads: int = Field(default=1, ge=1, le=256, description="ONNX Runtime intra-op threads.")
    allow_spinning: bool = Field(default=False, description="Let ORT threads spin (fast on idle boxes).")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="Where ONNX Runtime computes. auto: its CUDA provider whenever the installed ONNX Runtime "
        "offers it (sloserve[gpu]) and a GPU is visible, else the CPU; cuda: CUDA or refuse to start; cpu: the "
        "CPU. Each replica logs the device and provider it really runs on, and sloserve_replica_runtime "
        "counts them.",
    )
    inline_below_us: float = Field(
        default=100.0, ge=0, description="Run batches predicted faster than this on the event loop."
    )
    loop_lag_shed_ms: float | None = Field(
        default=None,
        ge=0,
        le=25,
        description="Refuse requests at the door (503 + Retry-After, before decoding) while the event loop runs "
        "more than this far behind on its own work (the lag probes' mean, each probe weighed by the share of "
        "its interval the loop's thread ran on the CPU, while the latest probe is late too; sloserve/gateway/looplag.py; "
        "see 'The event-loop door on a busy host' below): a share "
        "rising from 0 at this lag to all at twice it (at most 25: a probe counts at most 50 ms). "
        "The front end, not the replicas, is then the bottleneck, and a refusal costs it a fraction of an "
        "answer (docs/benchmarks.md, 'The front end past its capacity'). "
        "Default: 5 with the inprocess backend; off (0) with ray, where it is not measured.",
    )
    max_request_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="Largest request body or gRPC message accepted (413 / RESOURCE_EXHAUSTED above). "
        "Default: what the largest request any served model accepts needs in that encoding "
        "(max_batch_size rows of every input, at the most bytes an element takes in JSON text or on "
        "gRPC's wire, plus 64 KiB), at most 64 MiB; 64 MiB when a model has a variable dimension or a "
        "BYTES input. Nothing bigger could be served, so nothing bigger is read.",
    )
    max_json_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="Largest JSON part of a REST request (413 above): decoding JSON numbers takes about 20x "
        "their text in memory for a moment; send larger tensors in the binary extension or over gRPC. "
        "Default: as max_request_bytes, at most 32 MiB.",
    )
    json_offload_bytes: int | None = Field(
        default=1024 * 1024,
        ge=1,
        description="REST bodies whose JSON part is at least this large are decoded in a worker process, one "
        "at a time, so parsing them never stalls other clients (a 30 MiB JSON tensor takes over a second); "
        "null decodes everything on the event loop.",
    )
    body_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Time a client has to send a request's whole body once its headers are in, on every REST "
        "route (408 after it, and the connection is closed), and a gRPC call its request message once the call "
        "started (DEADLINE_EXCEEDED after it): a client dribbling bytes holds no memory or slot longer.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Time a REST connection has to send a request's complete headers, from when it connected "
        "or from the first byte of its next request (408 after it, and the connection is closed), and a gRPC "
        "connection its HTTP/2 preface and settings (grpc.server_handshake_timeout_ms). Checked before any "
        "token.",
    )
    idle_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A kept-alive REST connection that sends nothing for this long after an answer is closed "
        "(uvicorn's timeout_keep_alive, whole seconds), and a gRPC connection without calls for this long gets "
        "GOAWAY (grpc.max_connection_idle_ms; clients reconnect on their next call). A client sending requests "
        "back to back is never cut.",
    )
    max_connections: int = Field(
        default=4096,
        ge=16,
        description="Most HTTP requests in flight at once (503 above) and gRPC calls at once (RESOURCE_EXHAUSTED "
        "above). Idle connections do not count.",
    )
    max_connections_per_client: int = Field(
        default=1024,
        ge=1,
        description="Most REST connections, and most gRPC calls in flight, from one client address; the next "
        "REST connection is answered 503 and closed at once, the next gRPC call RESOURCE_EXHAUSTED. Every "
        "local client shares 127.0.0.1, so on a loopback bind this caps all of them together.",
    )
    max_queue_rows: int = Field(default=4096, ge=1, description="Bound on queued rows per model (429 above).")
    max_inflight_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="Bound on the request bytes (REST bodies, gRPC messages) held in the gateway at once, "
        "being decoded, queued or in a batch, over every model and transport (429 + Retry-After above).",
    )
    max_tensor_elements: int = Field(
        default=1 << 24,
        ge=1,
        le=1 << 31,
        description="Most elements one input tensor may hold (400 above); bounds memory per request.",
    )
    max_batch_rows: int | None = Field(
        default=None,
        ge=1,
        description="Most batch rows (first dimension) one request may carry, over every model; "
        "null leaves each model's max_batch_size as the only bound.",
    )
    allow_nonfinite: bool = Field(
        default=True,
        description="Accept NaN and +-Inf in FP16/FP32/FP64 inputs (REST JSON, REST binary, gRPC), as Triton "
        "does (perf_analyzer's default random data holds them); false refuses them with a 400 naming the input "
        "and the element.",
    )
    auth_tokens_file: Path | None = Field(
        default=None,
        description="Bearer tokens, one a line: `TOKEN [model,model...]` (no models or `*` = all); "
        "'#' starts a comment. When set (or auth_tokens), inference and model metadata "
        "need `Authorization: Bearer TOKEN`; health, /v2 and /metrics stay open.",
    )
    auth_tokens: SecretStr | None = Field(
        default=None,
        description="Bearer tokens inline, in the file's format with ';' or newlines between entries; "
        "meant for the environment (SLOSERVE_AUTH_TOKENS), merged with auth_tokens_file.",
    )
    tls_cert_file: Path | None = Field(
        default=None, description="PEM certificate (chain): serve REST and gRPC over TLS with it."
    )
    tls_key_file: Path | None = Field(default=None, description="PEM private key of tls_cert_file.")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names REST requests may name in their Host header besides the loopback ones "
        "(localhost, 127.x.y.z, [::1]); any other is refused with 421 (docs/reliability.md, 'Web pages "
        "and the loopback gateway'), so a web page that rebinds its DNS name to 127.0.0.1 cannot use the "
        "gateway. Ports are ignored; ['*'] turns the check off. On a loopback host the check always runs; "
        "on any other host only when this list is set (e.g. the names a proxy forwards). As JSON in the "
        "environment: SLOSERVE_ALLOWED_HOSTS='[\"gw.example.com\"]'.",
    )
    default_policy: str = Field(
        default="slo", description="Batching policy for models that name none: slo | timeout | fixed | aimd | nexus."
    )
    slo_max_wait_ms: float | None = Field(
        default=2.0,
        ge=0,
        description="Longest the slo policy holds the oldest request to grow a batch (null: up to its "
        "latest feasible start). Waiting to the edge leaves no slack for real-world variance.",
    )
    slo_size_quantile: Literal["p50", "p99"] = Field(
        default="p50",
        description="Latency quantile the slo policy sizes batches with (plus dispatch_margin_ms). The "
        "calibrated p99 of a CPU-contended replica is outlier-driven and shrank batches into "
        "collapse near capacity (docs/architecture.md); shedding always uses the median.",
    )
    dispatch_margin_ms: float = Field(
        default=2.0,
        ge=0,
        le=1000,
        description="Slack the slo policy keeps between a planned dispatch and a deadline, for timer and "
        "hand-off jitter of the live event loop (the simulator uses 0).",
    )
    models: dict[str, ModelOverride] = Field(default_factory=dict, description="Per-model overrides.")
    training: TrainingSettings = Field(
        default_factory=TrainingSettings, description="Preemptible training jobs on idle GPUs (harvest)."
    )
    tracing: TracingSettings = Field(
        default_factory=TracingSettings,
        description="OpenTelemetry traces over OTLP; off unless configured, and each OTEL_* variable that is set "
        "wins over its key (docs/operations.md, 'Tracing').",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("device_cost")
    @classmethod
    def _device_cost(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: c for k, c in v.items() if not c > 0}
        if bad:
            raise ValueError(f"device_cost: prices must be positive, got {bad}")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not v:
            raise ValueError("host must not be empty")
        return v

    @field_validator("allowed_hosts")
    @classmethod
    def _allowed_hosts(cls, v: list[str]) -> list[str]:
        for h in v:
            if not h.strip() or any(c in h for c in " /\\@?#,;\t") or "://" in h:
                raise ValueError(
                    f"allowed_hosts: {h!r:.80} is not a host name; list bare names or addresses "
                    "(gw.example.com, 10.0.0.5, [fd00::1]), or '*' for any"
                )
        return v

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        for f in (self.tls_cert_file, self.tls_key_file, self.auth_tokens_file):
            if f is not None and not f.is_file():
                raise ValueError(f"{f} is not a readable file")
        if self.auth_tokens_file is not None or self.auth_tokens is not None:
            from sloserve.gateway.tokens import TokenTable

            TokenTable.from_settings(self)  # a bad entry stops start-up here, naming it
        elif not is_loopback(self.host):
            raise ValueError(
                f"host {self.host!r} listens beyond this machine, and no token is configured: set auth_tokens_file "
                "or auth_tokens (SLOSERVE_AUTH_TOKENS) so that every request must authenticate, or bind 127.0.0.1 "
                "(docs/reliability.md, 'Authentication, TLS and limits')"
            )
        if self.training.enabled and self.backend != "ray":
            raise ValueError("training.enabled needs backend ray (jobs run as Ray actors on GPU resources)")
        typed = sorted(m for m, o in self.models.items() if len(o.devices()) > 1)
        if typed and self.backend == "inprocess" and self.replica_processes:
            raise ValueError(
                f"models.{typed[0]}.device_types (several) does not work with replica_processes in-process "
                f"(a worker process holds one session); set replica_processes false or list one type"
            )
        shared = sorted(m for m, o in self.models.items() if o.shared_replicas)
        if shared and self.backend == "inprocess" and self.replica_processes:
            raise ValueError(
                f"models.{shared[0]}.shared_replicas does not work with replica_processes (a worker "
                f"process holds one variant); set one of them false"
            )
        return self


@dataclass(frozen=True)
class WorkerRole:
    """One of ``count`` gateway processes sharing this host's ports (sloserve/gateway/workers.py).

    ``run_dir``: where each worker answers its siblings' metrics scrapes (a Unix socket each);
    ``loopback_ray``: the Ray they join is the supervisor's embedded one, on 127.0.0.1; ``deploys``:
    it deploys the models' Serve applications when it starts (worker 0, once; the others attach)."""

    index: int
    count: int
    run_dir: Path
    loopback_ray: bool = False
    deploys: bool = True

    def metrics_socket(self, index: int) -> Path:
        return self.run_dir / f"worker-{index}.sock"


class ConfigError(ValueError):
    """Bad configuration: the message names the key and the value."""


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except Exception as e:
        raise ConfigError(f"cannot parse config file {path}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    return data


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> Settings:
    """Resolve settings from file, environment and explicit overrides (None values are ignored)."""
    merged: dict[str, Any] = _read_file(Path(config_file)) if config_file else {}
    try:
        env = EnvSettingsSource(Settings)()
    except SettingsError as e:  # e.g. SLOSERVE_MODELS set to something that is not JSON
        raise ConfigError(
            f"invalid settings in the environment: {e}; SLOSERVE_<SETTING> variables are read as settings "
            f"(a map such as `models` as JSON, or one key at a time as SLOSERVE_MODELS__<model>__<key>)"
        ) from None
    _deep_merge(merged, env)  # SLOSERVE_MODELS__DIGITS__SLO_MS changes that key, not the file's whole map
    merged.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings.model_validate(merged)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            key = ".".join(str(p) for p in err["loc"])
            if key:
                lines.append(f"  {key}={err.get('input')!r:.80}: {err['msg']}")
            else:  # a check across settings: its message names the keys (the input is all of them)
                lines.append(f"  {err['msg'].removeprefix('Value error, ')}")
        raise ConfigError("invalid settings:\n" + "\n".join(lines)) from None


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` into ``base`` (in place): maps merge key by key, anything else replaces.

    >>> _deep_merge({"models": {"a": {"slo_ms": 5, "x": 1}}, "b": 1}, {"models": {"a": {"slo_ms": 9}}})
    {'models': {'a': {'slo_ms': 9, 'x': 1}}, 'b': 1}
    """
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_merge(base[k], v)
        else:
            base[k] = v
    return base


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address of this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        a = ipaddress.ip_address(host.strip("[]"))
    except ValueError:  # a host name: it may resolve anywhere
        return False
    mapped = getattr(a, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or a).is_loopback
