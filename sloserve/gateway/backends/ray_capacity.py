"""One coherent view of the replicas' slots for every gateway on a Ray cluster.

The cluster's :class:`~sloserve.autoscaler.leases.LeaseBook` lives in a small named Ray actor
(``sloserve-capacity`` in the ``sloserve`` namespace, detached, no CPU, restarted if it dies); the
first gateway to look for it creates it. Each gateway renews its lease four times a second
(:class:`LeaseClient`): its demand per application, the replicas it is connected to, the lease it
applies and its batches in flight per replica go in; its lease (slots per replica) and its measured
share of each application's demand come back. The gateway routes batches only into the slots it
holds, and stops using a lease it could not renew in time (``ttl_s`` after it asked, less one
renewal), before the book gives those slots to another gateway.

Why an actor rather than Ray Serve's own queue-length probes: the probes say how busy a replica is
after the fact, and N gateways reading the same free slot all send to it; a lease says who may
use a slot before anyone sends (docs/architecture.md, "Many gateways").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sloserve.autoscaler.leases import Grants, LeaseBook
from sloserve.gateway.config import Settings

if TYPE_CHECKING:
    from sloserve.gateway.backends.ray_channels import ReplicaChannels

log = logging.getLogger("sloserve.ray")
ACTOR_NAME = "sloserve-capacity"
RENEW_S = 0.25
TTL_S = 1.5


class CapacityBook:
    """The Ray actor holding the cluster's lease book (its methods run one at a time)."""

    def __init__(self, depth: int, ttl_s: float):
        import ray

        # restarted after a crash: the leases it gave are still applied; learn them before granting
        restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.book = LeaseBook(depth, ttl_s, warm_until=time.monotonic() + ttl_s if restarted else 0.0)

    def renew(
        self,
        gateway: str,
        demand: dict[str, float],
        replicas: dict[str, list[str]],
        in_force: Grants,
        busy: Grants,
    ) -> tuple[Grants, dict[str, float], int]:
        r = self.book.renew(time.monotonic(), gateway, demand, replicas, in_force, busy)
        return r.grants, r.shares, r.gateways

    def release(self, gateway: str) -> None:
        self.book.release(gateway)

    def view(self) -> dict[str, Any]:
        """For operators and tests: every gateway's lease and last report."""
        return {
            g: {"granted": self.book.granted.get(g, {}), "demand": r.demand, "replicas": r.replicas}
            for g, r in self.book.reports.items()
        }


def capacity_actor(depth: int, ttl_s: float = TTL_S) -> Any:
    """The cluster's capacity actor (created by the first gateway that asks)."""
    import ray

    cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(CapacityBook)
    return cls.options(name=ACTOR_NAME, namespace="sloserve", lifetime="detached", get_if_exists=True).remote(
        depth, ttl_s
    )


class LeaseClient:
    """One gateway's side: renews its lease, and answers how many slots it holds where.

    ``demand(app)`` is the gateway's arrival rate for the application (rows/s); ``connected(app)``
    its connected replicas; ``busy(app)`` its batches in flight per replica; ``changed(app)`` is
    called when its lease on ``app`` changes (the batcher re-plans at once)."""

    def __init__(
        self,
        gateway: str,
        actor: Any,
        apps: Callable[[], set[str]],
        demand: Callable[[str], float],
        connected: Callable[[str], list[str]],
        busy: Callable[[str], dict[str, int]],
        changed: Callable[[str], None],
        ttl_s: float = TTL_S,
    ):
        self.gateway = gateway
        self.actor = actor
        self._apps, self._demand, self._connected, self._busy, self._changed = apps, demand, connected, busy, changed
        self.ttl_s = ttl_s
        self.grants: Grants = {}
        self.shares: dict[str, float] = {}
        self.gateways = 1
        self._valid_until = 0.0
        self._task: asyncio.Task | None = None

    # ---- what the gateway reads on every batch ---------------------------------------------------
    def valid(self) -> bool:
        return time.monotonic() < self._valid_until

    def lease(self, app: str, replica: str) -> int:
        return self.grants.get(app, {}).get(replica, 0) if self.valid() else 0

    def slots(self, app: str) -> int:
        return sum(self.grants.get(app, {}).values()) if self.valid() else 0

    def share(self, app: str) -> float:
        return self.shares.get(app, 1.0)

    # ---- renewing --------------------------------------------------------------------------------
    async def renew(self) -> None:
        """One renewal; raises when the actor cannot be reached (the lease runs out on its own)."""
        apps = sorted(self._apps())
        asked = time.monotonic()
        in_force = {a: dict(g) for a, g in self.grants.items()} if self.valid() else {}
        ref = self.actor.renew.remote(
            self.gateway,
            {a: self._demand(a) for a in apps},
            {a: self._connected(a) for a in apps},
            in_force,
            {a: self._busy(a) for a in apps},
        )
        # (through a future: a Ray Client ref, ray://, is awaitable only so)
        grants, shares, gateways = await asyncio.wrap_future(ref.future())
        was_valid = self.valid()
        old, self.grants = self.grants, grants
        self.shares, self.gateways = shares, gateways
        self._valid_until = asked + self.ttl_s - RENEW_S
        for app in set(old) | set(grants):
            if old.get(app) != grants.get(app) or not was_valid:
                self._changed(app)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        failures = 0
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                await asyncio.wait_for(self.renew(), self.ttl_s)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:
                failures += 1
                if failures == 2:
                    log.warning("cannot renew this gateway's replica slots (%s); its lease runs out", e)
                if not self.valid():
                    for app in list(self.grants):
                        self._changed(app)

    async def stop(self) -> None:
        """Stop renewing and give the lease back at once (the others may use it on their next renewal)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self._valid_until = 0.0
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.wrap_future(self.actor.release.remote(self.gateway).future()), 2.0)


def leases_wanted(settings: Settings, direct: bool) -> bool:
    """Whether other gateways may share the replicas (``capacity_leases``; auto: with several workers
    on this host, or on a cluster the gateway joined). Only the direct transport routes batches to
    replicas itself; through a handle, Serve's router does."""
    mode = settings.capacity_leases
    if mode == "auto":
        return direct and ((settings.workers or 1) > 1 or settings.ray_address is not None)
    return mode == "on" and direct


async def start_leases(
    gateway: str,
    depth: int,
    channels: ReplicaChannels,
    apps: Callable[[], set[str]],
    demand: Callable[[str], float],
    changed: Callable[[str], None],
) -> LeaseClient:
    """Find (or create) the cluster's capacity actor, route ``channels`` by the lease, take a first
    lease and keep renewing it."""
    actor = await asyncio.get_running_loop().run_in_executor(None, capacity_actor, depth)
    client = LeaseClient(
        gateway, actor, apps=apps, demand=demand, connected=channels.connected, busy=channels.busy, changed=changed
    )
    channels.lease = client.lease
    await client.renew()
    client.start()
    return client
