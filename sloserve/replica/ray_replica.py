"""The Ray Serve replica: one ONNX Runtime session per (model, variant, device type).

A replica receives a whole batch (a dict of numpy arrays, zero-copy through Ray's object store)
and returns a whole batch plus its compute time and device type, which the gateway feeds back
into profile calibration. ``build_app`` is the import path the Serve config file and the
gateway's own deployment both use (``sloserve.replica.ray_replica:build_app``), so both deploy the same thing.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

# A batch goes to its replica in one gRPC message (the gateway's default ray_transport), and Ray Serve
# caps those at gRPC's 4 MiB unless told otherwise; a batch of large inputs is bigger. Raised before
# Ray Serve reads it at import: here for the gateway's side, and in every process an embedded Ray
# starts from the gateway (they inherit its environment). On a cluster, set it on the nodes.
os.environ.setdefault("RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH", str(2**31 - 1))

from ray import serve

from sloserve.batching.profile import Curve
from sloserve.models.repository import check_name, load_model_dir
from sloserve.replica import tracing as process_tracing
from sloserve.replica.runtime import Replica, RuntimeOptions, device_type, wait_out_profile

if TYPE_CHECKING:
    from sloserve.replica.channel import ChannelListener

STAMP_TTL_S = 5.0
SHARED = "shared"  # the deployment name's variant part for a replica that holds every variant
KV_NAMESPACE = "sloserve-channels"  # where replicas publish their batch channels (Ray internal KV)
DRAIN_S = 2.0  # a replica Serve stops finishes the batches it holds for up to this long


def channel_key(app: str, replica_id: str) -> str:
    return f"{app}/{replica_id}"


class OnnxReplica:
    """Runs batches one at a time on a single ORT thread pool; a second batch may wait in the
    replica (``max_ongoing_requests`` = pipeline depth) so Ray's hand-off overlaps compute."""

    def __init__(
        self,
        repo: str,
        model: str,
        variant: str,
        device: str = "cpu",
        runtime: dict[str, Any] | None = None,
        fault_delay_s: float = 0.0,
        variants: list[str] | None = None,
        channel_host: str | None = "",
        config_override: dict[str, Any] | None = None,
        emulate: dict[str, Any] | None = None,
        tracing: dict[str, Any] | None = None,
    ):
        """``config_override``: the config keys a load through the repository API replaced.
        ``variants``: a shared replica (``models.<name>.shared_replicas``) loads each of them and
        runs the one a batch names; ``variant`` is then the first (the default). ``channel_host``: the
        address its batch channel listens on ("" : this node's IP as Ray knows it; the embedded Ray of
        one gateway passes 127.0.0.1); None opens no channel (batches come through Serve's handle).
        ``emulate`` (``{batch_sizes, p50_ms}``: a device type of a model on several, on a node whose
        session runs on the CPU): each batch runs for real, then the replica waits until that profile's
        median for the batch has passed, and says its provider is ``emulated``. ``tracing``: the
        gateway's trace config (sloserve/replica/tracing.py); this process then exports the compute
        spans of the batches the gateway traces."""
        if tracing:
            process_tracing.setup(
                process_tracing.TraceConfig.from_dict(tracing), "replica", {"sloserve.replica": f"{model}/{variant}"}
            )
        check_name("model", model)
        for v in variants or [variant]:
            check_name("variant", v)
        loopback_servers()
        loaded = load_model_dir(Path(repo), model, config_override)  # this model's folder only
        opts = RuntimeOptions(**(runtime or {}))
        outs = [o.name for o in loaded.config.outputs]
        self.replicas = {v: Replica(loaded.onnx_path(v), opts, outs) for v in (variants or [variant])}
        for rep in self.replicas.values():
            rep.warm_up()
        self.replica = self.replicas[variant]
        self.device_type = device_type(opts.device) if device == "cpu" else device.lower()
        self.emulate: Curve | None = None
        if emulate and device.lower() != "cpu" and all(r.device == "cpu" for r in self.replicas.values()):
            sizes, p50 = tuple(emulate["batch_sizes"]), tuple(x / 1e3 for x in emulate["p50_ms"])
            self.emulate = Curve(sizes, p50, p50)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ort")
        self.batches = 0
        self.model, self.variant = model, variant
        self.fault_delay_s = fault_delay_s
        self._stamps: dict[str, tuple[float, float, float, float]] = {}  # gateway: rate, share, dispersion, seen
        self._listener: ChannelListener | None = None
        self._kv_key: str | None = None
        if channel_host is not None:
            self._open_channel(channel_host)

    # ---- the batch channel (the gateway's direct transport) ---------------------------------
    def _open_channel(self, host: str) -> None:
        """Listen for gateways (sloserve/replica/channel.py) and publish where, with the handshake's key, in
        Ray's internal KV (sloserve/gateway/backends/ray_channels.py reads it)."""
        import ray
        from ray.experimental import internal_kv

        from sloserve.replica.channel import BatchServer, ChannelListener

        self._server = BatchServer(self._compute, on_stamp=self._keep, delay_s=self.fault_delay_s, model=self.model)
        info = {
            "device_type": self.device_type,
            "variants": sorted(self.replicas),
            "pid": os.getpid(),
            # what each really runs on
            "runtime": {
                v: [self.device_type, "emulated"] if self.emulate else [rep.device, rep.provider]
                for v, rep in self.replicas.items()
            },
        }
        self._listener = ChannelListener(self._server, host or ray.util.get_node_ip_address(), info)
        rid = serve.get_replica_context().replica_id
        self._kv_key = channel_key(rid.deployment_id.app_name, rid.unique_id)
        entry = {
            "host": self._listener.host,
            "port": self._listener.port,
            "key": self._listener.key.hex(),
            "pid": os.getpid(),
        }
        internal_kv._internal_kv_put(self._kv_key, json.dumps(entry), overwrite=True, namespace=KV_NAMESPACE)

    def _compute(self, inputs: dict[str, np.ndarray], variant: str | None) -> dict[str, np.ndarray]:
        rep = self.replica if variant is None else self.replicas.get(variant)
        if rep is None:
            raise ValueError(f"this replica of '{self.model}' holds variants {sorted(self.replicas)}, not '{variant}'")
        self.batches += 1
        return self._run(rep, inputs)

    def _run(self, rep: Replica, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        out = rep.run(inputs)
        if self.emulate is not None:
            wait_out_profile(self.emulate, t0, inputs)
        return out

    def __del__(self) -> None:
        """Serve stops this replica: take no new gateway, finish what is queued (up to ``DRAIN_S``)."""
        listener, self._listener = getattr(self, "_listener", None), None
        if listener is None:
            return
        listener.close()
        try:
            from ray.experimental import internal_kv

            if self._kv_key is not None:  # None: the listener opened but was never published
                internal_kv._internal_kv_del(self._kv_key, namespace=KV_NAMESPACE)
        except Exception:
            pass
        self._server.drain(DRAIN_S)

    async def run_batch(
        self,
        inputs: dict[str, np.ndarray],
        stamp: tuple | None = None,
        variant: str | None = None,
        traceparent: str | None = None,
    ) -> tuple[dict[str, np.ndarray], float, str]:
        """``stamp`` = (gateway id, that gateway's arrival rate for this model in rows/s, its share of
        the traffic, how clumped its arrivals are): kept for :meth:`record_autoscaling_stats`, the
        autoscaler's input. ``variant``: which of a shared replica's variants runs the batch (None:
        its default). ``traceparent``: the gateway's batch span, on a traced batch only."""
        if stamp is not None:
            self._keep(stamp)
        rep = self.replica if variant is None else self.replicas.get(variant)
        if rep is None:
            raise ValueError(f"this replica of '{self.model}' holds variants {sorted(self.replicas)}, not '{variant}'")
        if self.fault_delay_s:
            await asyncio.sleep(self.fault_delay_s)  # chaos drill: a batch that takes long
        span = process_tracing.start_compute(traceparent, self.model, variant, process_tracing.rows_of(inputs))
        t0 = time.perf_counter()
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(self.pool, self._run, rep, inputs)
        except Exception as e:
            process_tracing.end_compute(span, f"{type(e).__name__}: {e!s:.200}")
            raise
        process_tracing.end_compute(span)
        self.batches += 1
        return outputs, time.perf_counter() - t0, self.device_type

    async def pid(self) -> int:
        """For failure tests and operators: the replica's worker process id."""
        return os.getpid()

    async def note_rate(self, stamp: tuple) -> None:
        """A stamp sent on its own (the gateway's poll), for when no batch carries one."""
        self._keep(stamp)

    def _keep(self, stamp: tuple) -> None:
        """(gateway, rate, share[, dispersion]): a gateway of an older release sends no dispersion."""
        dispersion = float(stamp[3]) if len(stamp) > 3 else 1.0
        self._stamps[stamp[0]] = (float(stamp[1]), float(stamp[2]), dispersion, time.monotonic())

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray Serve custom autoscaling metrics: each gateway's latest (fresh) rate and share,
        read by :class:`sloserve.gateway.backends.ray_policy.SwayamRayPolicy` on the controller."""
        now = time.monotonic()
        out: dict[str, float] = {}
        for gw, (rate, share, dispersion, seen) in list(self._stamps.items()):
            if now - seen > STAMP_TTL_S:  # a gateway that stopped sending sends nothing: rate 0
                del self._stamps[gw]
                continue
            out[f"sloserve_rate_rps/{gw}"] = rate
            out[f"sloserve_share/{gw}"] = share
            out[f"sloserve_dispersion/{gw}"] = dispersion
        return out

    def check_health(self) -> None:
        """Ray Serve's periodic probe: raising makes it replace this replica. Fails when the batch
        channel can no longer take gateways or answer their batches (sloserve/replica/channel.py), which Serve's
        own handle calls would never notice."""
        listener = getattr(self, "_listener", None)
        problem = listener.problem() if listener is not None else None
        if problem is not None:
            raise RuntimeError(f"replica of '{self.model}/{self.variant}': {problem}")


def loopback_servers() -> None:
    """On a node whose IP is loopback (the gateway's embedded Ray), the Serve replica's
    inter-deployment gRPC server binds 127.0.0.1 instead of ``[::]:0`` (every interface, hard-coded in
    Ray Serve 2.60). Called from the replica's constructor: Serve starts that server right after it."""
    import ipaddress

    import ray
    from ray.serve._private import replica

    if not ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback:
        return

    add = replica.add_port_to_grpc_server
    if add.__name__ == "add_on_loopback":
        return

    def add_on_loopback(server: Any, address: str) -> int:
        if address.startswith(("[::]:", "0.0.0.0:")):
            address = "127.0.0.1:" + address.rsplit(":", 1)[1]
        return add(server, address)

    replica.add_port_to_grpc_server = add_on_loopback


def deployment_name(model: str, variant: str, device: str) -> str:
    return f"{model}-{variant}-{device.lower()}"


def actor_options(device: str, num_cpus: float, gpu_fraction: float) -> dict[str, Any]:
    """CPU replicas take a fraction of a CPU; GPU replicas a GPU fraction plus the
    ``accelerator_type:<T>`` resource Ray puts on nodes with that GPU (declared by hand when
    emulating typed GPUs on a CPU machine)."""
    opts: dict[str, Any] = {"num_cpus": num_cpus}
    if device.lower() != "cpu":
        opts["num_gpus"] = gpu_fraction
        opts["resources"] = {f"accelerator_type:{device}": 0.001}
    return opts


def build_app(args: dict[str, Any]) -> serve.Application:
    """Serve application builder: ``{repo, model, variant, device, num_replicas, num_cpus, ...}``;
    with ``variants`` (a list), one deployment whose replicas hold all of them (``variant`` is ignored)."""
    device = str(args.get("device", "cpu"))
    variants = list(args["variants"]) if args.get("variants") else None
    autoscaling = args.get("autoscaling")
    replicas: dict[str, Any] = {"num_replicas": int(args.get("num_replicas", 1))}
    if autoscaling:
        replicas = {"num_replicas": "auto", "autoscaling_config": autoscaling}
    # serve.deployment()(cls) is serve.deployment(cls); ray types only this form as giving a Deployment
    dep = serve.deployment()(OnnxReplica).options(
        name=deployment_name(args["model"], SHARED if variants else args["variant"], device),
        **replicas,
        max_ongoing_requests=int(args.get("pipeline_depth", 2)),
        ray_actor_options=actor_options(
            device, float(args.get("num_cpus", 0.25)), float(args.get("gpu_fraction", 0.5))
        ),
        health_check_period_s=float(args.get("health_check_period_s", 2.0)),
        graceful_shutdown_timeout_s=5.0,
        # One Ray call carries a whole batch, and Serve's access log would write a line per call from
        # the replica's hot path; the gateway keeps its own per-request metrics.
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )
    return dep.bind(
        str(args["repo"]),
        args["model"],
        variants[0] if variants else args["variant"],
        device,
        args.get("runtime"),
        float(args.get("fault_delay_s", 0.0)),
        variants,
        args.get("channel_host", ""),
        args.get("config_override") or None,
        args.get("emulate") or None,
        args.get("tracing") or None,
    )
