"""The replicas as the Serve controller sees them, and the batch slots they give this gateway.

Slots the batcher may fill = running replicas x pipeline depth, refreshed from the Serve controller's
details once a second; with the direct transport (sloserve/gateway/backends/ray_channels.py) a
replica counts once its channel is connected, and its slots go the moment its socket closes. With
several gateways on the same replicas the slots come by lease (sloserve/gateway/backends/ray_capacity.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sloserve.batching.options import variant_of
from sloserve.gateway.backends.base import BackendBase, ModelLoadError
from sloserve.gateway.backends.ray_capacity import LeaseClient, leases_wanted, start_leases
from sloserve.gateway.backends.ray_channels import ReplicaChannels, read_endpoints
from sloserve.gateway.backends.ray_layout import ModelLayout
from sloserve.gateway.backends.ray_serve import deploy_failure, read_serve_details, replica_states
from sloserve.gateway.config import Settings

log = logging.getLogger("sloserve.ray")


class ReplicaWatch:
    """Replica counts per deployed (model, variant), the channels and leases behind the slots, and
    whether the Serve controller still answers. ``apps`` is the backend's (model, variant) ->
    application map (the same dict, kept current by the backend); the counts it learns go to the
    backend's hooks (replicas, runtimes, capacity)."""

    def __init__(self, backend: BackendBase, layout: ModelLayout, apps: dict[tuple[str, str], str], settings: Settings):
        self.backend = backend
        self.layout = layout
        self.apps = apps
        self.settings = settings
        self.direct = settings.ray_transport == "direct"
        self.replicas: dict[tuple[str, str], int] = {}
        self.details: dict[str, Any] | None = None  # the controller's latest serve details
        # ray_transport direct: the gateway routes each batch to a replica's own channel (sloserve/gateway/backends/ray_channels.py)
        self.channels = ReplicaChannels(self._channels_changed) if self.direct else None
        self.leases: LeaseClient | None = None  # several gateways on these replicas: slots by lease
        self.connected = True  # the poller says otherwise once the Serve controller stops answering

    # ---- slots ----------------------------------------------------------------------------
    def replica_count(self, model: str, variant: str) -> int:
        return self.replicas.get((model, variant), 0)

    def slots(self, model: str, variant: str) -> int:
        if self.leases is not None:
            app = self.apps.get((model, variant))
            return self.leases.slots(app) if app is not None else 0
        return self.replicas.get((model, variant), 0) * self.settings.pipeline_depth

    def ready(self) -> bool:
        """The Serve controller answered within the last few seconds, and (with leases) this gateway's
        lease on the slots is in force: one it cannot renew (the lease actor went with the head)
        leaves it no slot, even where replicas on other nodes live on."""
        return self.connected and (self.leases is None or self.leases.valid())

    def direct_channels(self) -> ReplicaChannels:
        """The replicas' channels, which only the direct transport has."""
        if self.channels is None:
            raise RuntimeError("the replica channels exist only with ray_transport 'direct'")
        return self.channels

    def uses_leases(self) -> bool:
        return leases_wanted(self.settings, self.direct)

    async def start_leases(
        self, gateway_id: str, applications: Callable[[], set[str]], demand: Callable[[str], float]
    ) -> None:
        """Take a first lease on the replicas' slots before serving, and keep renewing it."""
        channels = self.direct_channels()
        self.leases = await start_leases(
            gateway_id,
            self.settings.pipeline_depth,
            channels,
            apps=applications,
            demand=demand,
            changed=self._capacity_changed,
        )

    def _capacity_changed(self, app: str) -> None:
        for model, _ in [k for k, a in self.apps.items() if a == app][:1]:
            self.backend._capacity(model)

    def _channels_changed(self, app: str) -> None:
        """A channel opened or closed: the slots follow at once (a dead replica's are gone now)."""
        channels = self.direct_channels()
        for key, a in self.apps.items():
            if a == app:
                self.replicas[key] = channels.count(app)
        self._capacity_changed(app)

    # ---- the Serve controller's view ------------------------------------------------------
    async def wait_running(self, keys: list[tuple[str, str]] | None = None, timeout_s: float = 300.0) -> None:
        """Until every (model, variant) of ``keys`` (default: all deployed) has a replica taking
        batches; an application Serve gives up on (DEPLOY_FAILED, its replicas failing to start) is a
        :class:`ModelLoadError` with Serve's message."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            await self.refresh()
            wanted = list(self.apps) if keys is None else keys
            if all(self.replicas.get(k, 0) >= 1 for k in wanted):
                return
            for k in wanted:
                failed = deploy_failure(self.details, self.apps.get(k, ""))
                if failed is not None:
                    raise ModelLoadError(failed)
            await asyncio.sleep(0.25)
        raise TimeoutError("Ray Serve replicas did not start in time; see `ray status` / Serve logs")

    async def refresh(self) -> None:
        """Read the controller's view of the replicas (and, for the direct transport, where the new
        ones listen), then update the replica counts and the channels."""
        loop = asyncio.get_running_loop()
        apps = set(self.apps.values())
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
        class, 25-45 ms of the gateway's GIL per call (0.4 ms this way); while it ran,
        every request in the gateway waited (docs/architecture.md, "The Ray hand-off")."""
        self.details = read_serve_details()
        if not self.direct or self.details is None:
            return {}
        return read_endpoints(self.details, apps, known)

    def replica_states(self, app: str, details: dict[str, Any] | None = None) -> dict[str, int]:
        """Replicas of ``app``'s deployment by state, from ``details`` (default: the latest read)."""
        return replica_states(details if details is not None else self.details, app)

    def _count_replicas(self) -> None:
        """Replicas that take batches: RUNNING in Serve's view, and with the direct transport, connected."""
        layout, backend = self.layout, self.backend
        runtimes: dict[tuple[str, str], list[tuple[str, str]]] = {}  # per (model, variant): its options' together
        for key, app in self.apps.items():
            states = self.replica_states(app)
            self.replicas[key] = self.channels.count(app) if self.channels is not None else states.get("RUNNING", 0)
            variant = variant_of(key[1])
            if not layout.shared(key[0]) or key[1] == layout.top[key[0]]:
                device = layout.device_of(key[0], key[1]).lower()  # as configured, for one type or several
                for state in ("STARTING", "RUNNING", "STOPPING"):
                    backend._report_replicas(key[0], variant, device, state.lower(), states.get(state, 0))
            if self.channels is not None:  # each connected replica said what it runs on when it connected
                chans = self.channels.channels(app)
                said = [c.info.get("runtime", {}).get(variant) for c in chans]
                runtimes.setdefault((key[0], variant), []).extend((d, p) for d, p in filter(None, said))
                if chans and backend.on_held is not None:
                    backend.on_held(key[0], key[1], max(c.peak_held for c in chans))
        for (model, variant), pairs in runtimes.items():
            backend._report_runtime(model, variant, pairs)

    async def poll(self, push_rates: Callable[[], None]) -> None:
        """Once a second: the rates go out (``push_rates``), and the replica counts (and channels)
        follow Serve's view. A replica that dies in between is handled per batch (retried once, or
        failed explicitly); with the direct transport its slots are also gone the moment its socket
        closes. Three reads in a row that fail (Ray or its Serve controller gone) make the backend not
        ready until one succeeds."""
        failures = 0
        while True:
            await asyncio.sleep(1.0)
            try:
                push_rates()
                await self.refresh()
                if self.details is None:
                    raise RuntimeError("no Serve controller")
            except Exception:  # the controller may be restarting: keep the last view a moment
                failures += 1
                log.debug("reading the replicas from the Serve controller failed", exc_info=True)
                if failures == 3:
                    log.warning("lost the Ray cluster's Serve controller: not ready until it answers again")
                    self.connected = False
                continue
            if not self.connected:
                log.warning("the Serve controller answers again: ready")
            failures, self.connected = 0, True

    async def stop(self) -> None:
        if self.leases is not None:
            await self.leases.stop()
        if self.channels is not None:
            await self.channels.close()
