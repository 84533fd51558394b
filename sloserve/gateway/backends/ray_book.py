"""The served model set, one for every gateway on a Ray cluster.

Several gateways serve one set of Ray Serve replicas: the workers of one host (``--workers``) and the
services of other hosts joined to the same cluster (``ray_address``). The repository API's load and
unload through any of them must change what all of them serve. The set lives in a small named Ray
actor (``sloserve-models`` in the ``sloserve`` namespace, detached, no CPU), the :class:`ModelBook`;
the first gateway to look for it creates it. It holds, per model that a load or unload ever touched:

- its **entry**: state (``READY``, ``LOADING``, ``UNLOADING``, ``UNAVAILABLE``), the reason, the
  config override it was loaded with, the fingerprint of its files, and the version of the book that
  wrote it;
- a **lock**: one load or unload of a model at a time, cluster-wide, held by one gateway. A lock
  whose gateway stops polling for ``LIVE_S`` is freed, and a load or unload it left half done is
  marked so (``UNAVAILABLE``, "interrupted"): never a model stuck loading;
- what version each gateway has **applied**: every gateway long-polls the book (``poll``), applies
  each new version to its own data plane (sloserve/gateway/modelsync.py), then reports it on its next poll.
  ``wait_applied`` lets the gateway doing a load or unload wait until every live gateway has applied
  a version: that an unloading model has drained everywhere before its replicas go, and that a
  loaded model serves everywhere before the load answers.

Models no load or unload touched have no entry: each gateway serves them as its repository and
config say. A book restarted after a crash starts empty (``epoch`` changes) and the gateways keep
what they serve.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

ACTOR_NAME = "sloserve-models"
NAMESPACE = "sloserve"
LIVE_S = 3.0  # a gateway that has not polled the book for this long is gone
POLL_S = 0.5  # how long a poll waits for a change before it answers anyway


class ModelBook:
    """The Ray actor (async: its methods interleave only at ``await``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.epoch = uuid.uuid4().hex
        self.version = 0
        self.entries: dict[str, dict[str, Any]] = {}
        self.locks: dict[str, str] = {}  # model -> the gateway doing a load or unload of it
        self.applied: dict[str, tuple[int, float]] = {}  # gateway -> (version applied, when it said so)
        self._cond: asyncio.Condition | None = None

    # ---- helpers ------------------------------------------------------------------------------
    def _c(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def _notify(self) -> None:
        async with self._c():
            self._c().notify_all()

    async def _wait(self, timeout: float) -> None:
        async with self._c():
            try:
                await asyncio.wait_for(self._c().wait(), timeout)
            except TimeoutError:
                pass

    def _live(self, now: float) -> dict[str, int]:
        return {g: v for g, (v, t) in self.applied.items() if now - t < LIVE_S}

    def _expire(self, now: float) -> bool:
        """Free the locks of gateways that are gone; what they left half done is marked so."""
        live = self._live(now)
        changed = False
        for name, owner in list(self.locks.items()):
            if owner in live:
                continue
            del self.locks[name]
            entry = self.entries.get(name)
            if entry is not None and entry["state"] in ("LOADING", "UNLOADING"):
                op = "load" if entry["state"] == "LOADING" else "unload"
                self._write(
                    name,
                    "UNAVAILABLE",
                    f"its last {op} was interrupted (the gateway doing it stopped); load it again",
                    None,
                    None,
                )
                changed = True
        for g in [g for g, (_, t) in self.applied.items() if now - t > 10 * LIVE_S]:
            del self.applied[g]
        return changed

    def _write(self, name: str, state: str, reason: str, override: Any, fingerprint: Any) -> int:
        self.version += 1
        self.entries[name] = {
            "state": state,
            "reason": reason,
            "override": override,
            "fingerprint": fingerprint,
            "version": self.version,
        }
        return self.version

    def _snapshot(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "version": self.version, "entries": {k: dict(v) for k, v in self.entries.items()}}

    # ---- the gateways' side -------------------------------------------------------------------
    async def poll(self, gateway: str, applied: int, epoch: str | None, timeout: float = POLL_S) -> dict[str, Any]:
        """A gateway says it has applied version ``applied`` (of book ``epoch``); answers the book as soon
        as it holds a newer version, or after ``timeout``."""
        now = self.clock()
        self.applied[gateway] = (applied if epoch == self.epoch else 0, now)
        self._expire(now)
        await self._notify()  # (a wait_applied may be waiting for this gateway)
        deadline = now + timeout
        # (woken by every other gateway's poll, for wait_applied: answer only on a new version or the timeout)
        while epoch == self.epoch and applied >= self.version and (left := deadline - self.clock()) > 0:
            await self._wait(left)
        return self._snapshot()

    def snapshot(self) -> dict[str, Any]:
        return self._snapshot()

    async def acquire(self, name: str, gateway: str, timeout: float) -> bool:
        """Take ``name``'s lock for ``gateway`` (waiting up to ``timeout`` while another holds it)."""
        deadline = self.clock() + timeout
        while True:
            now = self.clock()
            self.applied[gateway] = (self.applied.get(gateway, (0, now))[0], now)
            if self._expire(now):
                await self._notify()
            owner = self.locks.get(name)
            if owner is None or owner == gateway:
                self.locks[name] = gateway
                return True
            if now >= deadline:
                return False
            await self._wait(min(0.5, deadline - now))

    async def release(self, name: str, gateway: str) -> None:
        if self.locks.get(name) == gateway:
            del self.locks[name]
            await self._notify()

    async def write(self, name: str, gateway: str, state: str, reason: str, override: Any, fingerprint: Any) -> int:
        """A new entry for ``name`` (its lock's holder only); returns the book's new version."""
        if self.locks.get(name) != gateway:
            raise RuntimeError(f"gateway {gateway} does not hold the lock of model {name!r}")
        version = self._write(name, state, reason, override, fingerprint)
        await self._notify()
        return version

    async def wait_applied(self, version: int, timeout: float) -> list[str]:
        """Wait until every live gateway has applied ``version``; the ones that have not, at ``timeout``."""
        deadline = self.clock() + timeout
        while True:
            now = self.clock()
            behind = sorted(g for g, v in self._live(now).items() if v < version)
            if not behind or now >= deadline:
                return behind
            await self._wait(min(0.25, deadline - now))

    def gateways(self) -> dict[str, int]:
        """For operators and tests: the live gateways and the version each has applied."""
        return self._live(self.clock())


def shared_models(settings: Any) -> bool:
    """Whether other gateways may serve the same replicas: several workers on this host, or a cluster
    the gateway joined (``ray_address``)."""
    return settings.backend == "ray" and ((settings.workers or 1) > 1 or settings.ray_address is not None)


def model_book() -> Any:
    """The cluster's model book (created by the first gateway that asks; blocking: call it from a thread)."""
    import ray

    cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(ModelBook)  # (async: calls interleave)
    return cls.options(
        name=ACTOR_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, max_concurrency=1000
    ).remote()


async def call(ref: Any) -> Any:
    """An actor call's result, awaited (through a future: a Ray Client ref, ray://, is awaitable only so)."""
    return await asyncio.wrap_future(ref.future())
