"""One served model set for every gateway on a Ray cluster: the repository API's side of the model
book (sloserve/gateway/backends/ray_book.py).

With several gateways over the same replicas (``--workers``, or services on several hosts joined by
``ray_address``), a load or unload through any of them goes through the book:

- **load** (or reload) through gateway A: A takes the model's lock in the book; checks the folder
  and the override (a 400 changes nothing); writes ``LOADING``; for a reload, every gateway takes
  the old model out of serving and answers what it admitted before it says it applied that, and
  A waits for all of them (``unload_drain_s``) before it deletes the old applications; A deploys
  the new ones and waits for a replica; writes ``READY`` with the override; every other gateway
  loads the same folder with the same override and attaches to the applications A deployed; A
  answers the load once every live gateway serves the model (or ``model_load_timeout_s`` passed).
- **unload** through A: ``UNLOADING``; every gateway stops taking the model's requests and answers
  the admitted ones; once all have said so (or ``unload_drain_s`` passed), A deletes the
  applications and writes ``UNAVAILABLE``.
- A gateway that starts (a restarted worker, a new host) drops at once the models the book says are
  not served, and then loads those it serves.

While another gateway holds a model's lock, a load or unload of it waits for the lock (up to
``model_load_timeout_s``), then proceeds against what the first one left: two concurrent loads of a
model end with it loaded once. A gateway that stops mid-operation loses the lock after
``ray_book.LIVE_S`` and the book marks the model as interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from sloserve.gateway.backends.base import ModelLoadError
from sloserve.gateway.backends.ray_book import POLL_S, call, model_book
from sloserve.gateway.errors import InvalidArgument, NotFound, ServingError, Unavailable
from sloserve.gateway.loadstate import LOADING, READY, UNAVAILABLE, UNLOADING, fingerprint
from sloserve.gateway.repository import ModelManager
from sloserve.models.repository import LoadedModel, ModelProblem, load_model_dir

log = logging.getLogger("sloserve.repository")


def _lost() -> tuple[type[BaseException], ...]:
    """What a call to the book raises when Ray, or the book's node, went away."""
    import ray.exceptions

    return (ray.exceptions.RayError, TimeoutError, ConnectionError)


def _unreachable(e: BaseException) -> Unavailable:
    return Unavailable(
        f"the cluster's model book cannot be reached ({type(e).__name__}): Ray is restarting or lost; retry shortly",
        retry_after_s=2.0,
    )


def _same(a: Any, b: Any) -> bool:
    return (a or None) == (b or None)


def _same_model(local: Any, book: Any) -> bool:
    """The same files (names and sizes: another host's copy has other times) and the same override."""
    if local is None or book is None:
        return False
    files = [tuple(f[:2]) for f in local[0]], local[1]
    return files == ([tuple(f[:2]) for f in book[0]], book[1])


class SharedModels:
    """One gateway's link to the book: its operations, and its copy of every other gateway's."""

    def __init__(self, manager: ModelManager, gateway: str):
        self.m = manager
        self.gateway = gateway
        self.book: Any = None
        self.epoch: str | None = None
        self.applied = 0  # the book's version this gateway has applied
        self.entries: dict[str, dict[str, Any]] = {}
        self.own: set[str] = set()  # models whose operation this gateway is doing (it applies them itself)
        self.served: dict[str, int] = {}  # model -> the book's version of it this gateway serves
        self._task: asyncio.Task | None = None
        self._ops: dict[str, asyncio.Lock] = {}

    @property
    def dp(self):
        return self.m.dp

    # ---- start and stop ----------------------------------------------------------------------
    def drop_unserved(self) -> list[str]:
        """Before serving (blocking, on the main thread): the book's entries; the models it says are
        not served, or served with another override, are taken out of this gateway's start-up set."""
        import ray

        self.book = model_book()
        snap = ray.get(self.book.snapshot.remote())
        dropped = []
        for name, e in snap["entries"].items():
            lm = self.dp.repo.models.get(name)
            if lm is None:
                continue
            if e["state"] != READY or not _same(e["override"], lm.override):
                self.dp.uninstall(name)
                self.dp.repo.models.pop(name, None)
                getattr(self.dp.backend, "models", {}).pop(name, None)  # (not deployed at start)
                self.m.set_state(name, e["state"], e["reason"] or "being loaded by another gateway")
                dropped.append(name)
        return dropped

    async def start(self) -> None:
        """The first poll, applied before this gateway serves; then keep polling."""
        loop = asyncio.get_running_loop()
        if self.book is None:
            self.book = await loop.run_in_executor(None, model_book)
        await self._poll_once(0.0)
        self._task = loop.create_task(self._run())

    async def stop(self) -> None:
        """Stop polling; a gateway that is not the last one leaves the applications to the others."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        with contextlib.suppress(Exception):
            live = await asyncio.wait_for(call(self.book.gateways.remote()), 2.0)
            if set(live) - {self.gateway}:
                self.dp.backend.keep_apps = True

    # ---- following the book --------------------------------------------------------------------
    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                await self._poll_once(POLL_S)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Ray restarting: keep what is served, try again
                failures += 1
                if failures == 3:
                    log.warning("cannot reach the model book (%s); serving what this gateway has", e)
                await asyncio.sleep(min(0.2 * failures, 2.0))

    async def _poll_once(self, timeout: float) -> None:
        snap = await asyncio.wait_for(
            call(self.book.poll.remote(self.gateway, self.applied, self.epoch, timeout)), timeout + 5.0
        )
        if snap["epoch"] != self.epoch:  # a new book (first poll, or it restarted): it knows nothing yet
            self.epoch, self.applied = snap["epoch"], 0
        if snap["version"] <= self.applied:
            return
        self.entries = snap["entries"]
        for name, e in sorted(self.entries.items(), key=lambda kv: kv[1]["version"]):
            if e["version"] > self.applied and name not in self.own:
                await self._apply(name, e)
        self.applied = snap["version"]

    async def _apply(self, name: str, e: dict[str, Any]) -> None:
        """Make this gateway serve ``name`` as entry ``e`` says (another gateway's operation)."""
        m, dp = self.m, self.dp
        async with m._lock(name):
            local = dp.models.get(name)
            state = e["state"]
            if (
                state == READY
                and local is not None
                and (self.served.get(name) == e["version"] or _same_model(m.fingerprints.get(name), e["fingerprint"]))
            ):
                self.served[name] = e["version"]
                return  # it serves this already
            if local is not None:
                why = f"model '{name}' is being reloaded; retry shortly" if state != UNLOADING else None
                await m.retire(name, local, why or f"model '{name}' was unloaded; it takes no new requests", False)
            if state != READY:
                m.set_state(name, state, e["reason"])
                return
            m.set_state(name, LOADING, "loading")
            try:
                loaded = await asyncio.get_running_loop().run_in_executor(
                    None, load_model_dir, m.root, name, e["override"]
                )
                await dp.backend.add_model(loaded, deploy=False)
                await self._install(name, loaded)
            except (ModelProblem, ModelLoadError, OSError) as err:
                log.warning("cannot serve model %r as another gateway loaded it: %s", name, err)
                m.set_state(name, UNAVAILABLE, f"loaded by another gateway, but not here: {m.for_client(err)}")

    async def _install(self, name: str, loaded: LoadedModel) -> None:
        state = self.dp.new_state(loaded)
        self.dp.install(state)
        self.dp.repo.models[name] = loaded
        self.m.fingerprints[name] = fingerprint(loaded)
        self.m.clear_state(name)
        if name in self.entries:
            self.served[name] = self.entries[name]["version"]

    # ---- this gateway's operations -------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _locked(self, name: str):
        """One operation on ``name`` at a time: this gateway's (two requests through it), then the
        cluster's (the book's lock), then the model's local lock (no change of another gateway's is
        being applied to it here; while this gateway holds the book's lock, it applies its own)."""
        op = self._ops.setdefault(name, asyncio.Lock())
        async with op:
            wait_s = self.dp.settings.model_load_timeout_s
            try:
                got = await asyncio.wait_for(call(self.book.acquire.remote(name, self.gateway, wait_s)), wait_s + 10)
            except Exception as e:  # Ray, or the book's node, gone: nothing was changed
                raise _unreachable(e) from None
            if not got:
                raise Unavailable(
                    f"another gateway is still loading or unloading model '{name}'; retry shortly", retry_after_s=2.0
                )
            self.own.add(name)
            try:
                async with self.m._lock(name):
                    self.m._check_serving()
                    yield
            except ServingError:
                raise
            except _lost() as e:  # lost mid-way: a 503 saying so, never a 500
                raise _unreachable(e) from None
            finally:
                self.own.discard(name)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(call(self.book.release.remote(name, self.gateway)), 5.0)

    async def _write(self, name: str, state: str, reason: str = "", loaded: LoadedModel | None = None) -> int:
        fp = list(fingerprint(loaded)) if loaded is not None else None
        override = loaded.override if loaded is not None else None
        version = await call(self.book.write.remote(name, self.gateway, state, reason, override, fp))
        if state != READY:
            self.m.set_state(name, state, reason)
        return version

    async def _everywhere(self, version: int, timeout: float) -> None:
        behind = await call(self.book.wait_applied.remote(version, timeout))
        if behind:
            log.warning("gateways %s did not apply the model set in %.1f s; going on", behind, timeout)

    async def load(self, name: str, override: dict | None) -> str:
        if not self.dp.settings.ray_deploy:
            raise InvalidArgument(
                "this gateway attaches to applications deployed elsewhere (ray_deploy: false): load models "
                "through the gateway or the Ray Serve config that deploys them"
            )
        async with self._locked(name):
            return await self._load(name, override)

    async def _load(self, name: str, override: dict | None) -> str:
        m, dp, s = self.m, self.dp, self.dp.settings
        current = dp.models.get(name)
        loop = asyncio.get_running_loop()
        try:
            loaded = await loop.run_in_executor(None, load_model_dir, m.root, name, override)
            if current is not None and m.fingerprints.get(name) == fingerprint(loaded):
                return "unchanged"
            m._check_fits(loaded)
            dp.new_state(loaded)  # the batching settings, checked before the old one goes
        except FileNotFoundError as e:
            raise NotFound(f"cannot load model '{name}': {m.for_client(e)}") from None
        except (ModelProblem, ModelLoadError) as e:
            log.warning("cannot load model %r: %s", name, e)
            raise InvalidArgument(f"cannot load model '{name}': {m.for_client(e)}") from None
        version = await self._write(name, LOADING, "being reloaded" if current is not None else "loading")
        try:
            if current is not None:
                await m.retire(name, current, f"model '{name}' is being reloaded; retry shortly", False)
            await self._everywhere(version, s.unload_drain_s + 2.0)  # the old one drained everywhere
            if current is not None:
                await dp.backend.remove_model(name)
            await dp.backend.add_model(loaded)
        except ModelLoadError as e:
            why = m.for_client(e)
            await self._write(name, UNAVAILABLE, f"its last load failed: {why}")
            raise InvalidArgument(f"cannot load model '{name}': {why}") from None
        except BaseException:
            with contextlib.suppress(Exception):
                await self._write(name, UNAVAILABLE, "its last load was interrupted")
            raise
        await self._install(name, loaded)
        version = await self._write(name, READY, "", loaded)
        await self._everywhere(version, s.model_load_timeout_s)  # every gateway serves it
        log.info("model %r %s on every gateway", name, "reloaded" if current is not None else "loaded")
        return "reloaded" if current is not None else "loaded"

    async def unload(self, name: str) -> str:
        async with self._locked(name):
            m, dp = self.m, self.dp
            current = dp.models.get(name)
            entry = self.entries.get(name)
            if current is None and (entry is None or entry["state"] == UNAVAILABLE):
                if m.state_of(name) == UNAVAILABLE:
                    m.set_state(name, UNAVAILABLE, "unloaded")
                return "not loaded"
            version = await self._write(name, UNLOADING, "answering the requests already admitted")
            if current is not None:
                await m.retire(name, current, f"model '{name}' was unloaded; it takes no new requests", False)
            await self._everywhere(version, dp.settings.unload_drain_s + 2.0)
            await dp.backend.remove_model(name)
            await self._write(name, UNAVAILABLE, "unloaded")
            log.info("model %r unloaded on every gateway", name)
            return "unloaded"
