"""The Ray backend's direct transport: batches go straight to each Ray Serve replica's own channel.

Ray Serve places, scales, health-checks and restarts the replicas; the gateway routes each batch to
one of them itself, over a TCP connection it keeps open to every running replica (the batch channel,
``sloserve/replica/channel.py``). Why not through a ``DeploymentHandle``: on 2 cores,
the handle's path (its router's event loop in a thread of its own, Serve's gRPC client and server, the
replica's user-code thread) cost 1.9 ms per batch at the median and put 1-2% of requests past a
20 ms SLO at any load, where the channel costs what a worker process of the in-process backend does
(docs/architecture.md, "The Ray hand-off").

A replica publishes where its channel listens (host, port, and a random key for the mutual HMAC
handshake) in Ray's internal key-value store, under ``<application>/<replica id>`` in the
``sloserve-channels`` namespace: only a client of the Ray cluster can read it. The gateway reads
which replicas are RUNNING from the Serve controller once a second, connects to new ones, drains
and drops the ones Serve stops, and learns of a replica's death at once from its socket.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sloserve.gateway.backends.channel import BatchChannel
from sloserve.replica.ray_replica import KV_NAMESPACE, channel_key

log = logging.getLogger("sloserve.ray")
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one replica's channel listens, and the key it expects."""

    replica_id: str
    host: str
    port: int
    key: bytes


def read_endpoints(
    details: dict[str, Any], apps: set[str], known: dict[str, set[str]]
) -> dict[str, dict[str, Endpoint | None]]:
    """Per application: its RUNNING replicas -> their endpoints (read from the KV for the replicas not in
    ``known[app]``; None for a known one, or one that has not published yet). Runs in a thread: the KV
    reads are calls to Ray's GCS. Stale entries (replicas Serve no longer lists) are deleted."""
    from ray.experimental import internal_kv

    out: dict[str, dict[str, Endpoint | None]] = {}
    listed: set[str] = set()
    for app in apps:
        st = details.get("applications", {}).get(app)
        running: dict[str, Endpoint | None] = {}
        for dep in (st or {}).get("deployments", {}).values():
            for r in dep.get("replicas", ()):
                rid = str(r.get("replica_id"))
                listed.add(channel_key(app, rid))
                if str(getattr(r.get("state"), "value", r.get("state"))) != "RUNNING":
                    continue
                running[rid] = None
                if rid in known.get(app, ()):
                    continue
                raw = internal_kv._internal_kv_get(channel_key(app, rid), namespace=KV_NAMESPACE)
                if raw:
                    e = json.loads(raw)
                    running[rid] = Endpoint(rid, e["host"], int(e["port"]), bytes.fromhex(e["key"]))
        out[app] = running
    for key in internal_kv._internal_kv_list("", namespace=KV_NAMESPACE) or ():
        k = key.decode() if isinstance(key, bytes) else key
        if k.split("/", 1)[0] in apps and k not in listed:
            internal_kv._internal_kv_del(k, namespace=KV_NAMESPACE)
    return out


class ReplicaChannels:
    """Open channels to the running replicas of each application, and the routing of batches to them.

    ``on_change(app)`` is called whenever an application's set of connected replicas changes (the
    backend's slot counts follow it at once)."""

    def __init__(self, on_change: Callable[[str], None] | None = None, lease: Callable[[str, str], int] | None = None):
        self._channels: dict[str, dict[str, BatchChannel]] = {}
        self._connecting: dict[str, asyncio.Task] = {}
        self._up: dict[str, asyncio.Event] = {}  # set while an application has a connected replica
        # replicas whose channel failed or went away: (when to try again, the next back-off). Serve may
        # still list a dead replica as RUNNING for seconds; a live one behind a blip is tried again.
        self._retry: dict[str, tuple[float, float]] = {}
        self.on_change = on_change or (lambda app: None)
        # with many gateways: how many batches this one may keep on a replica (sloserve/gateway/backends/ray_capacity.py)
        self.lease = lease
        self._closed = False

    def count(self, app: str) -> int:
        return sum(1 for c in self._channels.get(app, {}).values() if c.available)

    def known(self, app: str) -> set[str]:
        return set(self._channels.get(app, {}))

    def pick(self, app: str) -> BatchChannel | None:
        """The connected replica with the fewest batches in flight (the batcher keeps at most
        ``pipeline_depth`` on each); with a lease, the one with the most of its leased slots free
        (None when the lease leaves no slot free)."""
        chans = self._channels.get(app, {})
        if self.lease is None:
            live = [c for c in chans.values() if c.available]
            return min(live, key=lambda c: c.in_flight) if live else None
        best, room = None, 0
        for rid, c in chans.items():
            free = self.lease(app, rid) - c.in_flight
            if c.available and free > room:
                best, room = c, free
        return best

    def connected(self, app: str) -> list[str]:
        return [rid for rid, c in self._channels.get(app, {}).items() if c.available]

    def busy(self, app: str) -> dict[str, int]:
        """Batches in flight per replica (those with any)."""
        return {rid: c.in_flight for rid, c in self._channels.get(app, {}).items() if c.in_flight}

    async def wait_for(self, app: str, timeout_s: float) -> BatchChannel | None:
        """:meth:`pick`, waiting up to ``timeout_s`` for a replica to be connected (Serve is starting
        one, or replacing one that died); None if none comes."""
        chan = self.pick(app)
        if chan is not None or timeout_s <= 0:
            return chan
        up = self._up.setdefault(app, asyncio.Event())
        try:
            await asyncio.wait_for(up.wait(), timeout_s)
        except TimeoutError:
            return None
        return self.pick(app)

    def _changed(self, app: str) -> None:
        up = self._up.setdefault(app, asyncio.Event())
        if self.count(app):
            up.set()
        else:
            up.clear()
        self.on_change(app)

    def channels(self, app: str) -> list[BatchChannel]:
        return [c for c in self._channels.get(app, {}).values() if c.available]

    def sync(self, app: str, running: dict[str, Endpoint | None]) -> None:
        """Connect to replicas newly RUNNING; drop the ones no longer RUNNING (Serve is stopping them:
        no new batch goes there, and what they hold finishes or fails explicitly)."""
        if self._closed:
            return
        chans = self._channels.setdefault(app, {})
        for rid in [r for r in chans if r not in running]:
            chans.pop(rid).close(why="Serve stopped this replica")
            self._changed(app)
        for key in [k for k in self._retry if k.startswith(app + "/") and k.split("/", 1)[1] not in running]:
            del self._retry[key]
        now = time.monotonic()
        for rid, ep in running.items():
            key = channel_key(app, rid)
            if ep is None or rid in chans or key in self._connecting or self._retry.get(key, (0.0,))[0] > now:
                continue
            task = asyncio.get_running_loop().create_task(self._connect(app, ep))
            self._connecting[key] = task

            def forget(_t: asyncio.Task, k: str = key) -> None:
                self._connecting.pop(k, None)

            task.add_done_callback(forget)

    async def _connect(self, app: str, ep: Endpoint) -> None:
        from sloserve.replica.channel import client_handshake

        label = f"{app}#{ep.replica_id}"
        loop = asyncio.get_running_loop()

        def open_socket() -> socket.socket:
            sock = socket.create_connection((ep.host, ep.port), timeout=CONNECT_TIMEOUT_S)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                client_handshake(sock, ep.key)
            except BaseException:
                sock.close()
                raise
            return sock

        try:
            sock = await loop.run_in_executor(None, open_socket)
            chan = BatchChannel(sock, label, on_gone=lambda c: self._gone(app, ep.replica_id, c))
            await asyncio.wait_for(chan.ready(), CONNECT_TIMEOUT_S)
        except (TimeoutError, OSError, ValueError, RuntimeError) as e:
            key = channel_key(app, ep.replica_id)
            backoff = self._retry.get(key, (0.0, 0.5))[1]
            (log.warning if backoff <= 1.0 else log.debug)(
                "could not open the channel to replica %s at %s:%d: %s; trying again in %.0f s",
                label,
                ep.host,
                ep.port,
                e,
                backoff,
            )
            self._retry[key] = (time.monotonic() + backoff, min(backoff * 2, 30.0))
            return
        self._retry.pop(channel_key(app, ep.replica_id), None)
        if self._closed:
            chan.close()
            return
        self._channels.setdefault(app, {})[ep.replica_id] = chan
        self._changed(app)

    def _gone(self, app: str, rid: str, chan: BatchChannel) -> None:
        chans = self._channels.get(app, {})
        if chans.get(rid) is chan:
            del chans[rid]
            self._retry[channel_key(app, rid)] = (time.monotonic() + 1.0, 2.0)
            log.warning("replica %s went away; its batches in flight are retried or failed", chan.label)
            self._changed(app)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._connecting.values()):
            task.cancel()
        for chans in self._channels.values():
            for c in chans.values():
                c.close(why="the gateway is shutting down")
        self._channels.clear()
