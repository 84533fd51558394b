"""Replicas on Ray Serve: the gateway crosses into Ray once per batch, never once per request.

Each (model, variant, device type) is a Serve application with one deployment of
:class:`sloserve.replica.ray_replica.OnnxReplica`. The gateway keeps one queue per model (the SLO policy
needs every queued deadline in one view to order, batch and pick variants) and sends each batch to
one replica: over the replica's batch channel by default (``ray_transport: direct``,
sloserve/gateway/backends/ray_channels.py), or through a DeploymentHandle. Slots the batcher may fill =
running replicas x pipeline depth, refreshed from the Serve controller's details.

Its parts: each model's layout and rates (sloserve/gateway/backends/ray_layout.py), its applications
deployed and Ray started or joined (sloserve/gateway/backends/ray_deploy.py), and the replicas and
slots as the Serve controller reports them (sloserve/gateway/backends/ray_watch.py). This module
sends the batches and runs the life cycle.

A replica that dies mid-batch surfaces as :class:`~sloserve.gateway.errors.ReplicaFailed`; the batcher
retries the batch once if its deadline still allows, else fails it explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import numpy as np

from sloserve.batching.batcher import RunResult
from sloserve.batching.options import OptionPlan, variant_of
from sloserve.gateway import tracing
from sloserve.gateway.backends.base import BackendBase, ModelLoadError
from sloserve.gateway.backends.ray_deploy import APP_PREFIX, Deployed, ServeDeployer
from sloserve.gateway.backends.ray_layout import ModelLayout
from sloserve.gateway.backends.ray_run import late, run_on_channel, run_on_handle
from sloserve.gateway.backends.ray_serve import read_serve_details, start_serve
from sloserve.gateway.backends.ray_watch import ReplicaWatch
from sloserve.gateway.config import Settings
from sloserve.gateway.errors import DeadlineExceeded
from sloserve.gateway.rates import gateway_id
from sloserve.models.repository import LoadedModel, ModelRepository
from sloserve.replica.runtime import RuntimeOptions

__all__ = ["APP_PREFIX", "RayServeBackend"]
log = logging.getLogger("sloserve.ray")


class RayServeBackend(BackendBase):
    name = "ray"

    def __init__(
        self,
        repo: ModelRepository,
        opts: RuntimeOptions,
        settings: Settings,
        loopback_ray: bool = False,
        deploy_at_start: bool = True,
    ):
        self.repo = repo
        # deploys its models at start (worker 0 of a host, its first start); the repository API's loads
        # deploy with ray_deploy; keep_apps: other gateways still serve them, stop leaves them
        self.deploy_at_start, self.keep_apps = settings.ray_deploy and deploy_at_start, False
        self.opts = opts
        self.settings = settings
        self._handles: dict[tuple[str, str], Any] = {}
        self._apps: dict[tuple[str, str], str] = {}
        self.direct = settings.ray_transport == "direct"
        # direct channels report the replica's compute time, and the policy models depth (as in-process)
        self.round_trip_latency = not self.direct
        self.pipeline_depth = settings.pipeline_depth
        self._ready = False
        self._poller: asyncio.Task | None = None
        self._deploying: asyncio.Future | None = None
        self._cancel_deploy = False
        self.gateway_id = gateway_id()  # what this gateway's rate stamps carry
        self.layout = ModelLayout(repo, settings)
        self.models = self.layout.models  # what it serves; the repository API changes it
        self.deployer = ServeDeployer(self.layout, opts, settings, loopback_ray)
        self.watch = ReplicaWatch(self, self.layout, self._apps, settings)
        self.channels = self.watch.channels

    # ---- the layout -----------------------------------------------------------------------
    def device_of(self, model: str, key: str | None = None) -> str:
        """The device a deployment asks Ray for, as configured (``cpu``, ``T4``): the model's, or one
        option's (``key``) on a model with several."""
        return self.layout.device_of(model, key)

    def device_type_of(self, model: str) -> str:
        return self.layout.device_type_of(model)

    def options_of(self, model: str) -> OptionPlan | None:
        return self.layout.plans.get(model)

    def shared(self, model: str) -> bool:
        """Whether ``model``'s replicas hold all its variants (``shared_replicas``: one deployment)."""
        return model in self.layout.shared_models

    def note_arrival(self, model: str, rows: int) -> None:
        self.layout.note_arrival(model, rows)

    def autoscaling_config(self, model: str, variant: str) -> dict[str, Any] | None:
        """Ray Serve autoscaling config running the swayam policy on this variant's profile."""
        return self.layout.autoscaling_config(model, variant)

    def _stamp(self, model: str, variant: str) -> tuple[str, float, float, float]:
        meter = self.layout.demand(model, variant)
        leases = self.watch.leases
        share = leases.share(self._apps[(model, variant)]) if leases is not None else 1.0
        return (self.gateway_id, meter.rate_rps(), share, meter.dispersion())

    def _push_rates(self) -> None:
        """Stamps also go out on their own, once a poll: when admission refuses nearly everything no
        batch carries them, and that is exactly when the autoscaler must see the demand."""
        layout = self.layout
        for (model, variant), handle in self._handles.items():
            if layout.autoscaled.get(model) and (variant == layout.top[model] or not self.shared(model)):
                stamp = self._stamp(model, variant)  # (a shared deployment: once)
                if self.channels is not None:  # direct: every replica keeps the latest stamp of every gateway
                    for chan in self.channels.channels(self._apps[(model, variant)]):
                        chan.stamp(stamp)
                else:
                    handle.note_rate.remote(stamp)

    def _app_demand(self, app: str) -> float:
        """This gateway's rows/s for ``app`` (what its stamps tell the autoscaler)."""
        for (model, variant), a in self.applications().items():
            if a == app:
                return self._stamp(model, variant)[1]
        return 0.0

    # ---- life cycle -----------------------------------------------------------------------
    def _deploy(self) -> None:
        start_serve()
        for lm in list(self.models.values()):
            if self._cancel_deploy:
                return
            deployed = self.deployer.deploy_model(lm, self.deploy_at_start, lambda: self._cancel_deploy)
            for key, app, handle in deployed:
                self._apps[key] = app
                self._handles[key] = handle
                self.watch.replicas[key] = self.layout.replicas_of(key[0])

    async def add_model(self, lm: LoadedModel, deploy: bool = True) -> None:
        """Deploy ``lm``'s Serve applications while serving (the repository API; ``deploy`` false: attach
        to the ones another gateway deployed) and wait until each has a replica taking batches;
        :class:`ModelLoadError` (what it deployed deleted again) when Serve cannot start them. Its old
        applications, if any, are gone (:meth:`remove_model`)."""
        loop = asyncio.get_running_loop()
        name, deploy = lm.config.name, deploy and self.settings.ray_deploy
        self.layout.setup(lm)
        try:
            deployed: Deployed = await loop.run_in_executor(
                None, self.deployer.deploy_model, lm, deploy, lambda: self._cancel_deploy
            )
        except Exception as e:
            await self.remove_model(name, delete=deploy)
            raise ModelLoadError(f"model '{name}': Ray Serve refused its deployment: {e!s:.300}") from None
        keys = [key for key, _, _ in deployed]
        for key, app, handle in deployed:  # not counted as serving until a replica is connected
            self._apps[key], self._handles[key], self.watch.replicas[key] = app, handle, 0
        try:
            await self.watch.wait_running(keys, self.settings.model_load_timeout_s)
        except BaseException as e:
            await self.remove_model(name, delete=deploy)
            if isinstance(e, ModelLoadError | TimeoutError):
                raise ModelLoadError(f"model '{name}': {e}") from None
            raise

    async def remove_model(self, name: str, delete: bool = True) -> None:
        """Forget ``name`` and (``delete``) delete its Serve applications (its batcher has drained: no
        batch of it is in flight); Serve stops their replicas."""
        keys = [k for k in self._apps if k[0] == name]
        apps = sorted({self._apps[k] for k in keys})
        for key in keys:
            self._apps.pop(key, None)
            self._handles.pop(key, None)
            self.watch.replicas.pop(key, None)
        if self.channels is not None:
            for app in apps:
                self.channels.sync(app, {})  # its channels close
        lm = self.layout.forget(name, keys)
        if self.settings.ray_deploy and delete and apps:
            await asyncio.get_running_loop().run_in_executor(None, self.deployer.delete_apps, apps)
        if lm is not None:
            for key in keys:
                device = self.device_of(name, key[1]).lower()
                for state in ("starting", "running", "stopping"):
                    self._report_replicas(name, variant_of(key[1]), device, state, 0)
        self.layout.forget_plan(name)

    def prepare(self) -> None:
        """Starts (or connects to) Ray on the calling thread: the gateway calls it on its main thread
        before its servers start any thread (see ``Gateway.prepare``)."""
        self.deployer.init_ray()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.deployer.init_ray)  # a no-op once prepare() ran
        self._deploying = loop.run_in_executor(None, self._deploy)
        try:
            await asyncio.shield(self._deploying)
        except asyncio.CancelledError:  # a stop during start-up
            await self._stop_deploying()
            raise
        await self.watch.wait_running()
        if self.watch.uses_leases():
            await self.watch.start_leases(self.gateway_id, lambda: set(self.applications().values()), self._app_demand)
        self._ready = True
        self._poller = loop.create_task(self.watch.poll(self._push_rates))

    async def stop(self) -> None:
        self._ready = False
        if self._poller is not None:
            self._poller.cancel()
        await self.watch.stop()
        await self._stop_deploying()
        apps = list(dict.fromkeys(self._apps.values())) if self.deploy_at_start and not self.keep_apps else []
        await asyncio.get_running_loop().run_in_executor(None, self.deployer.shutdown, apps)

    async def _stop_deploying(self) -> None:
        """The deploy thread cannot be interrupted, but it deploys nothing more once it sees the flag;
        tearing down waits until it has returned."""
        if self._deploying is not None and not self._deploying.done():
            self._cancel_deploy = True
            with contextlib.suppress(BaseException):
                await self._deploying

    def ready(self) -> bool:
        """Deployed, the Serve controller answered within the last few seconds, and (with leases) this
        gateway's lease on the slots is in force (sloserve/gateway/backends/ray_watch.py)."""
        return self._ready and self.watch.ready()

    def applications(self) -> dict[tuple[str, str], str]:
        """(model, variant) -> the Serve application serving it; a shared deployment (every variant on
        the same replicas) once, under its most accurate variant (its replicas' default)."""
        top = self.layout.top
        return {key: app for key, app in self._apps.items() if not self.shared(key[0]) or key[1] == top[key[0]]}

    read_serve_details = staticmethod(read_serve_details)

    def replica_states(self, app: str, details: dict[str, Any] | None = None) -> dict[str, int]:
        """Replicas of ``app``'s deployment by state, from ``details`` (default: the latest read)."""
        return self.watch.replica_states(app, details)

    # ---- batches --------------------------------------------------------------------------
    def replica_count(self, model: str, variant: str) -> int:
        return self.watch.replica_count(model, variant)

    def slots(self, model: str, variant: str) -> int:
        return self.watch.slots(model, variant)

    async def run(
        self, model: str, variant: str, inputs: dict[str, np.ndarray], timeout_s: float | None = None
    ) -> RunResult:
        """One Ray call for the whole batch, bounded by the batch's deadline (``timeout_s``, from the
        batcher: latest deadline + late_grace_s) and by ``batch_timeout_s`` for hung replicas
        (``sloserve/gateway/backends/ray_run.py``)."""
        bound = self.settings.batch_timeout_s
        limit = bound if timeout_s is None else min(timeout_s, bound)
        self.layout.served[(model, variant)].add(next(iter(inputs.values())).shape[0])

        def on_late(waited: float) -> DeadlineExceeded:
            return late(model, variant, waited, timeout_s, bound)

        shared = self.shared(model)
        if self.direct:
            held = self.watch.leases is not None and bool(self.replica_count(model, variant))
            app = self._apps[(model, variant)]
            return await run_on_channel(
                self.watch.direct_channels(), app, model, variant, inputs, limit, on_late, held, shared
            )
        handle = self._handles[(model, variant)]
        extra = {}
        if tracing.TRACER is not None and (parent := tracing.batch_traceparent()) is not None:
            extra["traceparent"] = parent  # a traced batch: the replica records its compute under it
        if shared:
            call = handle.run_batch.remote(inputs, self._stamp(model, variant), variant, **extra)
        else:
            call = handle.run_batch.remote(inputs, self._stamp(model, variant), **extra)
        return await run_on_handle(call, model, variant, limit, on_late)
