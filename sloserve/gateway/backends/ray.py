"""Replicas on Ray Serve: the gateway crosses into Ray once per batch, never once per request.

Each (model, variant, device type) is a Serve application with one deployment of
:class:`sloserve.replica.ray_replica.OnnxReplica`. The gateway keeps one queue per model (the SLO policy
needs every queued deadline in one view to order, batch and pick variants) and sends each batch to
one replica: over the replica's batch channel by default (``ray_transport: direct``,
sloserve/gateway/backends/ray_channels.py), or through a DeploymentHandle. Slots the batcher may fill =
running replicas x pipeline depth, refreshed from the Serve controller's details. Starting or
joining Ray is sloserve/gateway/backends/ray_local.py.

A replica that dies mid-batch surfaces as :class:`~sloserve.gateway.errors.ReplicaFailed`; the batcher
retries the batch once if its deadline still allows, else fails it explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import numpy as np

from sloserve.batching.batcher import RunResult
from sloserve.batching.options import OptionPlan, split_key, variant_of
from sloserve.batching.profile import ProfileTable
from sloserve.gateway.backends.base import BackendBase, ModelLoadError
from sloserve.gateway.backends.options import model_plan
from sloserve.gateway.backends.ray_capacity import LeaseClient, leases_wanted, start_leases
from sloserve.gateway.backends.ray_channels import ReplicaChannels, read_endpoints
from sloserve.gateway.backends.ray_local import init_ray, shutdown_ray
from sloserve.gateway.backends.ray_run import late, run_on_channel, run_on_handle
from sloserve.gateway.backends.ray_serve import (
    deploy_failure,
    deployment_handle,
    read_serve_details,
    replica_states,
    start_serve,
    swayam_autoscaling,
)
from sloserve.gateway.config import Settings
from sloserve.gateway.errors import DeadlineExceeded
from sloserve.gateway.rates import RateMeter, gateway_id
from sloserve.models.repository import LoadedModel, ModelRepository
from sloserve.replica.ray_replica import SHARED, build_app, deployment_name
from sloserve.replica.runtime import RuntimeOptions

log = logging.getLogger("sloserve.ray")
APP_PREFIX = "sloserve-"


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
        self._loopback_ray = loopback_ray  # joined an embedded Ray on 127.0.0.1 (a worker's supervisor's)
        self.opts = opts
        self.settings = settings
        self._handles: dict[tuple[str, str], Any] = {}
        self._replicas: dict[tuple[str, str], int] = {}
        self._apps: dict[tuple[str, str], str] = {}
        self._details: dict[str, Any] | None = None  # the controller's latest serve details
        # ray_transport direct: the gateway routes each batch to a replica's own channel (sloserve/gateway/backends/ray_channels.py)
        self.direct = settings.ray_transport == "direct"
        self.channels = ReplicaChannels(self._channels_changed) if self.direct else None
        self.leases: LeaseClient | None = None  # several gateways on these replicas: slots by lease
        # direct channels report the replica's compute time, and the policy models depth (as in-process)
        self.round_trip_latency = not self.direct
        self.pipeline_depth = settings.pipeline_depth
        self._started_ray = False
        self._ready = False
        self._connected = True  # the poller says otherwise once the Serve controller stops answering
        self._poller: asyncio.Task | None = None
        self._deploying: asyncio.Future | None = None
        self._cancel_deploy = False
        # This gateway's view of each model's demand (best variant) and of each variant's load,
        # stamped on the batches for the replicas' autoscaling metrics.
        self.gateway_id = gateway_id()
        self.models: dict[str, LoadedModel] = {}  # what it serves; the repository API changes it
        self._arrivals: dict[str, RateMeter] = {}
        self._served: dict[tuple[str, str], RateMeter] = {}
        self._best: dict[str, str] = {}
        self._top: dict[str, str] = {}  # a shared deployment's label: its replicas' default variant, the most accurate
        self._shared: set[str] = set()  # models whose replicas hold every variant (read on every batch)
        self._autoscaled: dict[str, bool] = {}
        # a model on several device types (models.<name>.device_types): its options, and the device
        # each option's deployment asks Ray for, as configured (cpu, T4, ...)
        self._plans: dict[str, OptionPlan] = {}
        self._key_device: dict[tuple[str, str], str] = {}
        for lm in repo.models.values():
            self._setup(lm)

    def _setup(self, lm: LoadedModel) -> None:
        """The gateway's side of one model: its rate meters and how its replicas are laid out."""
        m, cfg, over = lm.config.name, lm.config, self.settings.models.get(lm.config.name)
        self.models[m] = lm
        self._arrivals[m] = RateMeter(time.monotonic)
        for v in cfg.variants:
            self._served[(m, v.name)] = RateMeter(time.monotonic)
        self._best[m] = cfg.best_variant
        self._plans.pop(m, None)
        devices = over.devices() if over is not None else []
        if len(devices) > 1:
            named = {self._profile_name(d): d for d in devices}
            slo_ms = over.slo_ms if over is not None and over.slo_ms else cfg.slo_ms
            cost = {self._profile_name(t): c for t, c in self.settings.device_cost.items()}
            plan = model_plan(ProfileTable.load(self.repo.root), cfg, list(named), slo_ms, cost)
            self._plans[m] = plan
            for key in plan.served:  # a dominated option too: it serves requests pinning its variant
                self._key_device[(m, key)] = named[split_key(key, "")[1]]
                self._served[(m, key)] = RateMeter(time.monotonic)
            self._best[m] = plan.keys[0]  # its variant's demand is the model's; the others' what they serve
        self._top[m] = cfg.variants_by_accuracy[0].name
        if len(cfg.variants) > 1 and over is not None and over.shared_replicas:
            self._shared.add(m)
        else:
            self._shared.discard(m)
        self._autoscaled[m] = bool(over and over.autoscaling)

    # ---- life cycle -----------------------------------------------------------------------
    def device_of(self, model: str, key: str | None = None) -> str:
        """The device a deployment asks Ray for, as configured (``cpu``, ``T4``): the model's, or one
        option's (``key``) on a model with several."""
        if key is not None and (model, key) in self._key_device:
            return self._key_device[(model, key)]
        over = self.settings.models.get(model)
        if over is not None and over.device_types:
            return over.device_types[0]
        return over.device_type if over and over.device_type else "cpu"

    @staticmethod
    def _profile_name(device: str) -> str:
        from sloserve.replica.runtime import device_type

        return device_type("cpu") if device.lower() == "cpu" else device.lower()

    def options_of(self, model: str) -> OptionPlan | None:
        return self._plans.get(model)

    def shared(self, model: str) -> bool:
        """Whether ``model``'s replicas hold all its variants (``shared_replicas``: one deployment)."""
        return model in self._shared

    def note_arrival(self, model: str, rows: int) -> None:
        meter = self._arrivals.get(model)
        if meter is not None:
            meter.add(rows)

    def _stamp(self, model: str, variant: str) -> tuple[str, float, float, float]:
        # a shared deployment serves the whole model: its demand is the model's arrivals, whatever variant runs
        # (every type of the most accurate variant of a model on several: the model's demand, which
        # each type's policy splits with the others, sloserve.autoscaler.typesplit)
        best = variant == self._best[model] or self.shared(model)
        if not best and model in self._plans:
            best = variant_of(variant) == variant_of(self._best[model])
        meter = self._arrivals[model] if best else self._served[(model, variant)]
        share = self.leases.share(self._apps[(model, variant)]) if self.leases is not None else 1.0
        return (self.gateway_id, meter.rate_rps(), share, meter.dispersion())

    def _push_rates(self) -> None:
        """Stamps also go out on their own, once a poll: when admission refuses nearly everything no
        batch carries them, and that is exactly when the autoscaler must see the demand."""
        for (model, variant), handle in self._handles.items():
            if self._autoscaled.get(model) and (variant == self._top[model] or not self.shared(model)):
                stamp = self._stamp(model, variant)  # (a shared deployment: once)
                if self.channels is not None:  # direct: every replica keeps the latest stamp of every gateway
                    for chan in self.channels.channels(self._apps[(model, variant)]):
                        chan.stamp(stamp)
                else:
                    handle.note_rate.remote(stamp)

    def autoscaling_config(self, model: str, variant: str) -> dict[str, Any] | None:
        """Ray Serve autoscaling config running the swayam policy on this variant's profile."""
        over = self.settings.models.get(model)
        if over is None or over.autoscaling is None:
            return None
        table = ProfileTable.load(self.repo.root)
        cfg = self.models[model].config
        v, dev = split_key(variant, self.device_type_of(model))  # an option: its own pair's profile
        cost = {self._profile_name(t): c for t, c in self.settings.device_cost.items()}
        return swayam_autoscaling(over, cfg, table, dev, v, self.shared(model), self._split_types(model, variant), cost)

    def _split_types(self, model: str, key: str) -> list[str] | None:
        """The device types sharing the model's demand when ``key`` is an option of its most accurate
        variant (``sloserve.autoscaler.typesplit``); None otherwise (a cheaper option sizes on what it served)."""
        plan = self._plans.get(model)
        if plan is None or variant_of(key) != variant_of(self._best[model]):
            return None
        return [split_key(k, "")[1] for k in plan.of_variant(variant_of(key), pinned=True)]

    def device_type_of(self, model: str) -> str:
        """The device type name profiles and replicas use (CPU model slug for cpu replicas); the
        fastest type of a model on several."""
        plan = self._plans.get(model)
        if plan is not None:
            return plan.device_types()[0]
        return self._profile_name(self.device_of(model))

    def replicas_of(self, model: str) -> int:
        over = self.settings.models.get(model)
        return over.instances if over and over.instances else self.settings.instances

    def _fault_delay_s(self, model: str) -> float:
        over = self.settings.models.get(model)
        return over.fault_delay_ms / 1e3 if over else 0.0

    def _init_ray(self) -> None:
        # (every model the settings autoscale, loaded at start-up or later through the repository API)
        autoscaled = any(o.autoscaling for o in self.settings.models.values())
        self._started_ray = init_ray(self.settings, autoscaled=autoscaled, loopback=self._loopback_ray)

    def _deploy(self) -> None:
        start_serve()
        for lm in list(self.models.values()):
            if self._cancel_deploy:
                return
            self._install(self._deploy_model(lm, self.deploy_at_start))

    def _deploy_model(self, lm: LoadedModel, deploy: bool) -> list[tuple[tuple[str, str], str, Any]]:
        """Deploy one model's Serve applications (blocking: call it from a thread); each (model,
        variant) with its application and handle. One path for start-up and the repository API."""
        from ray import serve

        runtime = {
            "intra_op_threads": self.opts.intra_op_threads,
            "allow_spinning": self.opts.allow_spinning,
            "device": self.opts.device,
        }
        name, model = lm.config.name, lm
        shared = self.shared(name)
        ranked = [v.name for v in model.config.variants_by_accuracy]
        out = []
        plan = self._plans.get(name)
        table = ProfileTable.load(self.repo.root) if plan is not None else None
        # a shared model: one deployment, its replicas holding every variant (best first, the default);
        # a model on several device types: one per option (variant, device type)
        keys = (
            list(plan.served) if plan is not None else ranked[:1] if shared else [v.name for v in model.config.variants]
        )
        for key in keys:
            if self._cancel_deploy:
                break
            v = variant_of(key)
            device = self.device_of(name, key)
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
                            "repo": str(self.repo.root),
                            "model": name,
                            "variant": v,
                            "device": device,
                            "num_replicas": self.replicas_of(name),
                            "num_cpus": self.settings.replica_num_cpus,
                            "gpu_fraction": self.settings.replica_gpu_fraction,
                            "pipeline_depth": self.settings.pipeline_depth,
                            "runtime": runtime,
                            "fault_delay_s": self._fault_delay_s(name),
                            "autoscaling": self.autoscaling_config(name, key),
                            **({"emulate": emulate} if emulate else {}),
                            "channel_host": self._channel_host(),
                            **({"variants": ranked} if shared else {}),
                            **({"config_override": model.override} if model.override else {}),
                        }
                    ),
                    name=app,
                    route_prefix=None,
                    blocking=False,
                )
            handle = self._handle(self._deployment_handle(dep, app, deploy))
            out += [((name, served), app, handle) for served in (ranked if shared else [key])]
        return out

    def _deployment_handle(self, dep: str, app: str, deploy: bool) -> Any:
        wait_s = 0.0 if deploy else self.settings.model_load_timeout_s
        return deployment_handle(dep, app, wait_s, lambda: self._cancel_deploy)

    def _install(self, deployed: list[tuple[tuple[str, str], str, Any]]) -> None:
        for key, app, handle in deployed:
            self._apps[key] = app
            self._handles[key] = handle
            self._replicas[key] = self.replicas_of(key[0])

    async def add_model(self, lm: LoadedModel, deploy: bool = True) -> None:
        """Deploy ``lm``'s Serve applications while serving (the repository API; ``deploy`` false: attach
        to the ones another gateway deployed) and wait until each has a replica taking batches;
        :class:`ModelLoadError` (what it deployed deleted again) when Serve cannot start them. Its old
        applications, if any, are gone (:meth:`remove_model`)."""
        loop = asyncio.get_running_loop()
        name, deploy = lm.config.name, deploy and self.settings.ray_deploy
        self._setup(lm)
        try:
            deployed = await loop.run_in_executor(None, self._deploy_model, lm, deploy)
        except Exception as e:
            await self.remove_model(name, delete=deploy)
            raise ModelLoadError(f"model '{name}': Ray Serve refused its deployment: {e!s:.300}") from None
        keys = [key for key, _, _ in deployed]
        for key, app, handle in deployed:  # not counted as serving until a replica is connected
            self._apps[key], self._handles[key], self._replicas[key] = app, handle, 0
        try:
            await self._wait_running(keys, self.settings.model_load_timeout_s)
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
            self._replicas.pop(key, None)
            self._served.pop(key, None)
        if self.channels is not None:
            for app in apps:
                self.channels.sync(app, {})  # its channels close
        lm = self.models.pop(name, None)
        self._arrivals.pop(name, None)
        if self.settings.ray_deploy and delete and apps:
            from ray import serve

            def delete_apps() -> None:
                for app in apps:
                    serve.delete(app, _blocking=True)

            await asyncio.get_running_loop().run_in_executor(None, delete_apps)
        if lm is not None:
            for key in keys:
                device = self.device_of(name, key[1]).lower()
                for state in ("starting", "running", "stopping"):
                    self._report_replicas(name, variant_of(key[1]), device, state, 0)
        self._plans.pop(name, None)
        for k in [k for k in self._key_device if k[0] == name]:
            del self._key_device[k]

    def _channel_host(self) -> str | None:
        """Where each replica's batch channel listens: loopback under the gateway's own embedded Ray,
        the node's IP on a cluster (""), none when batches go through Serve's handle."""
        if not self.direct:
            return None
        return "127.0.0.1" if self._started_ray or self._loopback_ray else ""

    def _handle(self, handle):
        """``ray_transport`` grpc: the handle sends each batch straight to the replica's inter-deployment
        gRPC server (``_by_reference=False``, what Ray Serve's own RAY_SERVE_THROUGHPUT_OPTIMIZED mode
        sets by default), with plain pickle for the numpy batch; object_ref: a Ray actor task."""
        if self.settings.ray_transport != "grpc":
            return handle
        return handle.options(_by_reference=False, request_serialization="pickle", response_serialization="pickle")

    def prepare(self) -> None:
        """Starts (or connects to) Ray on the calling thread: the gateway calls it on its main thread
        before its servers start any thread (see ``Gateway.prepare``)."""
        self._init_ray()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._init_ray)  # a no-op once prepare() ran
        self._deploying = loop.run_in_executor(None, self._deploy)
        try:
            await asyncio.shield(self._deploying)
        except asyncio.CancelledError:  # a stop during start-up
            await self._stop_deploying()
            raise
        await self._wait_running()
        if self.uses_leases():
            await self._start_leases()
        self._ready = True
        self._poller = loop.create_task(self._poll_replicas())

    def uses_leases(self) -> bool:
        return leases_wanted(self.settings, self.direct)

    async def _start_leases(self) -> None:
        """Take a first lease on the replicas' slots before serving, and keep renewing it."""
        channels = self._direct_channels()
        self.leases = await start_leases(
            self.gateway_id,
            self.settings.pipeline_depth,
            channels,
            apps=lambda: set(self.applications().values()),
            demand=self._app_demand,
            changed=self._capacity_changed,
        )

    def _app_demand(self, app: str) -> float:
        """This gateway's rows/s for ``app`` (what its stamps tell the autoscaler)."""
        for (model, variant), a in self.applications().items():
            if a == app:
                return self._stamp(model, variant)[1]
        return 0.0

    def _capacity_changed(self, app: str) -> None:
        for model, _ in [k for k, a in self._apps.items() if a == app][:1]:
            self._capacity(model)

    async def _wait_running(self, keys: list[tuple[str, str]] | None = None, timeout_s: float = 300.0) -> None:
        """Until every (model, variant) of ``keys`` (default: all) has a replica taking batches; an
        application Serve gives up on (DEPLOY_FAILED, its replicas failing to start) is a
        :class:`ModelLoadError` with Serve's message."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            await self._refresh()
            wanted = list(self._handles) if keys is None else keys
            if all(self._replicas.get(k, 0) >= 1 for k in wanted):
                return
            for k in wanted:
                failed = self._deploy_failure(self._apps.get(k, ""))
                if failed is not None:
                    raise ModelLoadError(failed)
            await asyncio.sleep(0.25)
        raise TimeoutError("Ray Serve replicas did not start in time; see `ray status` / Serve logs")

    def _deploy_failure(self, app: str) -> str | None:
        """Serve's message when it gave up deploying ``app`` (from the latest details), else None."""
        return deploy_failure(self._details, app)

    async def _refresh(self) -> None:
        """Read the controller's view of the replicas (and, for the direct transport, where the new
        ones listen), then update the replica counts and the channels."""
        loop = asyncio.get_running_loop()
        apps = set(self._apps.values())
        channels = self.channels  # (the direct transport)
        known = {app: channels.known(app) for app in apps} if channels is not None else {}
        endpoints = await loop.run_in_executor(None, self._read_details, apps, known)
        if channels is not None:
            for app, running in endpoints.items():
                channels.sync(app, running)
        self._count_replicas()

    def _read_details(self, apps: set[str], known: dict[str, set[str]]) -> dict[str, dict]:
        """In a thread: the controller's serve details as a plain dict. Not ``serve.status()``: that
        builds a pydantic model of every deployment's config, which cloudpickles its request router
        class, 25-45 ms of the gateway's GIL per call on this box (0.4 ms this way); while it ran,
        every request in the gateway waited (docs/architecture.md, "The Ray hand-off")."""
        self._details = self.read_serve_details()
        if not self.direct or self._details is None:
            return {}
        return read_endpoints(self._details, apps, known)

    read_serve_details = staticmethod(read_serve_details)

    def replica_states(self, app: str, details: dict[str, Any] | None = None) -> dict[str, int]:
        """Replicas of ``app``'s deployment by state, from ``details`` (default: the latest read)."""
        return replica_states(details if details is not None else self._details, app)

    def _count_replicas(self) -> None:
        """Replicas that take batches: RUNNING in Serve's view, and with the direct transport, connected."""
        runtimes: dict[tuple[str, str], list[tuple[str, str]]] = {}  # per (model, variant): its options' together
        for key, app in self._apps.items():
            states = self.replica_states(app)
            self._replicas[key] = self.channels.count(app) if self.channels is not None else states.get("RUNNING", 0)
            variant = variant_of(key[1])
            if not self.shared(key[0]) or key[1] == self._top[key[0]]:
                device = self.device_of(key[0], key[1]).lower()  # as configured, for one type or several
                for state in ("STARTING", "RUNNING", "STOPPING"):
                    self._report_replicas(key[0], variant, device, state.lower(), states.get(state, 0))
            if self.channels is not None:  # each connected replica said what it runs on when it connected
                chans = self.channels.channels(app)
                said = [c.info.get("runtime", {}).get(variant) for c in chans]
                runtimes.setdefault((key[0], variant), []).extend((d, p) for d, p in filter(None, said))
                if chans and self.on_held is not None:
                    self.on_held(key[0], key[1], max(c.peak_held for c in chans))
        for (model, variant), pairs in runtimes.items():
            self._report_runtime(model, variant, pairs)

    def _channels_changed(self, app: str) -> None:
        """A channel opened or closed: the slots follow at once (a dead replica's are gone now)."""
        channels = self._direct_channels()
        for key, a in self._apps.items():
            if a == app:
                self._replicas[key] = channels.count(app)
        self._capacity_changed(app)

    async def _poll_replicas(self) -> None:
        """Once a second: the rates go out, and the replica counts (and channels) follow Serve's view.
        A replica that dies in between is handled per batch (retried once, or failed explicitly); with
        the direct transport its slots are also gone the moment its socket closes. Three reads in a row
        that fail (Ray or its Serve controller gone) make the backend not ready until one succeeds."""
        failures = 0
        while True:
            await asyncio.sleep(1.0)
            try:
                self._push_rates()
                await self._refresh()
                if self._details is None:
                    raise RuntimeError("no Serve controller")
            except Exception:  # the controller may be restarting: keep the last view a moment
                failures += 1
                log.debug("reading the replicas from the Serve controller failed", exc_info=True)
                if failures == 3:
                    log.warning("lost the Ray cluster's Serve controller: not ready until it answers again")
                    self._connected = False
                continue
            if not self._connected:
                log.warning("the Serve controller answers again: ready")
            failures, self._connected = 0, True

    async def stop(self) -> None:
        self._ready = False
        if self._poller is not None:
            self._poller.cancel()
        if self.leases is not None:
            await self.leases.stop()
        if self.channels is not None:
            await self.channels.close()
        await self._stop_deploying()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._shutdown)

    async def _stop_deploying(self) -> None:
        """The deploy thread cannot be interrupted, but it deploys nothing more once it sees the flag;
        tearing down waits until it has returned."""
        if self._deploying is not None and not self._deploying.done():
            self._cancel_deploy = True
            with contextlib.suppress(BaseException):
                await self._deploying

    def _shutdown(self) -> None:
        apps = list(dict.fromkeys(self._apps.values())) if self.deploy_at_start and not self.keep_apps else []
        shutdown_ray(apps, started=self._started_ray)

    def ready(self) -> bool:
        """Deployed, the Serve controller answered within the last few seconds, and (with leases) this
        gateway's lease on the slots is in force: one it cannot renew (the lease actor went with the
        head) leaves it no slot, even where replicas on other nodes live on."""
        return self._ready and self._connected and (self.leases is None or self.leases.valid())

    def applications(self) -> dict[tuple[str, str], str]:
        """(model, variant) -> the Serve application serving it; a shared deployment (every variant on
        the same replicas) once, under its most accurate variant (its replicas' default)."""
        return {key: app for key, app in self._apps.items() if not self.shared(key[0]) or key[1] == self._top[key[0]]}

    # ---- batches --------------------------------------------------------------------------
    def replica_count(self, model: str, variant: str) -> int:
        return self._replicas.get((model, variant), 0)

    def slots(self, model: str, variant: str) -> int:
        if self.leases is not None:
            app = self._apps.get((model, variant))
            return self.leases.slots(app) if app is not None else 0
        return self._replicas.get((model, variant), 0) * self.settings.pipeline_depth

    def _direct_channels(self) -> ReplicaChannels:
        """The replicas' channels, which only the direct transport has."""
        if self.channels is None:
            raise RuntimeError("the replica channels exist only with ray_transport 'direct'")
        return self.channels

    async def run(
        self, model: str, variant: str, inputs: dict[str, np.ndarray], timeout_s: float | None = None
    ) -> RunResult:
        """One Ray call for the whole batch, bounded by the batch's deadline (``timeout_s``, from the
        batcher: latest deadline + late_grace_s) and by ``batch_timeout_s`` for hung replicas
        (``sloserve/gateway/backends/ray_run.py``)."""
        bound = self.settings.batch_timeout_s
        limit = bound if timeout_s is None else min(timeout_s, bound)
        self._served[(model, variant)].add(next(iter(inputs.values())).shape[0])

        def on_late(waited: float) -> DeadlineExceeded:
            return late(model, variant, waited, timeout_s, bound)

        shared = self.shared(model)
        if self.direct:
            held = self.leases is not None and bool(self.replica_count(model, variant))
            app = self._apps[(model, variant)]
            return await run_on_channel(
                self._direct_channels(), app, model, variant, inputs, limit, on_late, held, shared
            )
        handle = self._handles[(model, variant)]
        if shared:
            call = handle.run_batch.remote(inputs, self._stamp(model, variant), variant)
        else:
            call = handle.run_batch.remote(inputs, self._stamp(model, variant))
        return await run_on_handle(call, model, variant, limit, on_late)
