"""The Serve applications of each model, deployed (or attached to) from the gateway, and Ray itself
started, joined and left (sloserve/gateway/backends/ray_local.py).

Each (model, variant, device type) is a Serve application with one deployment of
:class:`sloserve.replica.ray_replica.OnnxReplica`, named after them (``APP_PREFIX`` + its deployment's
name), so that a gateway that does not deploy (``ray_deploy: false``) finds the applications that a
Ray Serve config deployed. Every call here blocks: the backend runs them in a thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sloserve.batching.options import split_key, variant_of
from sloserve.batching.profile import ProfileTable
from sloserve.gateway import tracing
from sloserve.gateway.backends.ray_layout import ModelLayout
from sloserve.gateway.backends.ray_local import init_ray, shutdown_ray
from sloserve.gateway.backends.ray_serve import deployment_handle
from sloserve.gateway.config import Settings
from sloserve.models.repository import LoadedModel
from sloserve.replica.ray_replica import SHARED, build_app, deployment_name
from sloserve.replica.runtime import RuntimeOptions

APP_PREFIX = "sloserve-"
Deployed = list[tuple[tuple[str, str], str, Any]]  # ((model, variant or option), application, handle)


class ServeDeployer:
    """Deploys a model's applications as its layout says, and starts or joins Ray for them."""

    def __init__(self, layout: ModelLayout, opts: RuntimeOptions, settings: Settings, loopback_ray: bool = False):
        self.layout = layout
        self.opts = opts
        self.settings = settings
        self.loopback_ray = loopback_ray  # joined an embedded Ray on 127.0.0.1 (a worker's supervisor's)
        self.started_ray = False
        self.direct = settings.ray_transport == "direct"

    def init_ray(self) -> None:
        # (every model the settings autoscale, loaded at start-up or later through the repository API)
        autoscaled = any(o.autoscaling for o in self.settings.models.values())
        self.started_ray = init_ray(self.settings, autoscaled=autoscaled, loopback=self.loopback_ray)

    def deploy_model(self, lm: LoadedModel, deploy: bool, cancelled: Callable[[], bool]) -> Deployed:
        """Deploy one model's Serve applications (``deploy`` false: find the ones deployed elsewhere);
        each (model, variant) with its application and handle. One path for start-up and the
        repository API; ``cancelled`` stops it between applications."""
        from ray import serve

        layout = self.layout
        runtime = {
            "intra_op_threads": self.opts.intra_op_threads,
            "allow_spinning": self.opts.allow_spinning,
            # a Triton model whose instance_group is all KIND_CPU computes on the CPU whatever the server's device
            "device": "cpu" if lm.triton is not None and lm.triton.on_cpu() else self.opts.device,
        }
        name, model = lm.config.name, lm
        shared = layout.shared(name)
        ranked = [v.name for v in model.config.variants_by_accuracy]
        out = []
        plan = layout.plans.get(name)
        table = ProfileTable.load(layout.repo.root) if plan is not None else None
        for key in layout.deployed_keys(lm):
            if cancelled():
                break
            v = variant_of(key)
            device = layout.device_of(name, key)
            emulate = None
            if table is not None and device.lower() != "cpu":  # its replica waits out this profile on a CPU
                curve = table.curves.get((name, v, split_key(key, "")[1]))
                if curve is not None:
                    emulate = {"batch_sizes": list(curve.batch_sizes), "p50_ms": [x * 1e3 for x in curve.p50_s]}
            dep = deployment_name(name, SHARED if shared else v, device)
            app = APP_PREFIX + dep
            if deploy:
                serve.run(
                    build_app(
                        {
                            "repo": str(layout.repo.root),
                            "model": name,
                            "variant": v,
                            "device": device,
                            "num_replicas": layout.replicas_of(name),
                            "num_cpus": self.settings.replica_num_cpus,
                            "gpu_fraction": self.settings.replica_gpu_fraction,
                            "pipeline_depth": self.settings.pipeline_depth,
                            "runtime": runtime,
                            "fault_delay_s": layout.fault_delay_s(name),
                            "autoscaling": layout.autoscaling_config(name, key),
                            **({"emulate": emulate} if emulate else {}),
                            "channel_host": self.channel_host(),
                            **({"variants": ranked} if shared else {}),
                            **({"config_override": model.override} if model.override else {}),
                            # the replica exports its own compute spans (sloserve/gateway/tracing.py)
                            **({"tracing": trace} if (trace := tracing.replica_config()) else {}),
                        }
                    ),
                    name=app,
                    route_prefix=None,
                    blocking=False,
                )
            wait_s = 0.0 if deploy else self.settings.model_load_timeout_s
            handle = self._handle(deployment_handle(dep, app, wait_s, cancelled))
            out += [((name, served), app, handle) for served in (ranked if shared else [key])]
        return out

    def channel_host(self) -> str | None:
        """Where each replica's batch channel listens: loopback under the gateway's own embedded Ray,
        the node's IP on a cluster (""), none when batches go through Serve's handle."""
        if not self.direct:
            return None
        return "127.0.0.1" if self.started_ray or self.loopback_ray else ""

    def _handle(self, handle):
        """``ray_transport`` grpc: the handle sends each batch straight to the replica's inter-deployment
        gRPC server (``_by_reference=False``, what Ray Serve's own RAY_SERVE_THROUGHPUT_OPTIMIZED mode
        sets by default), with plain pickle for the numpy batch; object_ref: a Ray actor task."""
        if self.settings.ray_transport != "grpc":
            return handle
        return handle.options(_by_reference=False, request_serialization="pickle", response_serialization="pickle")

    @staticmethod
    def delete_apps(apps: list[str]) -> None:
        """Delete these Serve applications; Serve stops their replicas."""
        from ray import serve

        for app in apps:
            serve.delete(app, _blocking=True)

    def shutdown(self, apps: list[str]) -> None:
        """Leave Ray, deleting ``apps`` first (and stopping the embedded Ray this gateway started)."""
        shutdown_ray(apps, started=self.started_ray)
