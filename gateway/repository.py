"""The model repository extension of the V2 protocol (as Triton and MLServer serve it): the index of
the repository's models with their state, ``load`` (with an optional config override) and
``unload``, while the server serves the others.

States: ``READY`` (serving), ``LOADING`` (being loaded, or reloaded: new requests get 503 +
Retry-After meanwhile), ``UNLOADING`` (taking no new request; those already admitted are answered)
and ``UNAVAILABLE`` (not loaded: its reason says why, ``unloaded``, ``not loaded`` or what made its
load fail). A load checks the folder first (``models.repository.load_model_dir``, the check
start-up and ``sloserve models check`` run): a model that fails it answers 400 naming what is wrong,
and a model already serving keeps serving. A reload (a load of a model whose files or override
changed) drains the old one, then starts the new one. One load or unload of a model at a time.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.backends.base import ModelLoadError
from gateway.errors import InvalidArgument, NotFound, ServingError, Unavailable
from gateway.limits import size_limits
from models.repository import LoadedModel, ModelProblem, check_name, load_model_dir

if TYPE_CHECKING:
    from gateway.dataplane import DataPlane, ModelState

log = logging.getLogger("sloserve.repository")
READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


def fingerprint(model: LoadedModel) -> tuple:
    """What a reload compares: every file of the model folder (path, size, modification time; its
    latency profiles aside) and the config override."""
    files = []
    for p in sorted(model.root.rglob("*")):
        if p.is_file() and "profiles" not in p.relative_to(model.root).parts:
            st = p.stat()
            files.append((str(p.relative_to(model.root)), st.st_size, st.st_mtime_ns))
    return tuple(files), json.dumps(model.override, sort_keys=True)


def parse_load_parameters(name: str, params: Any) -> dict | None:
    """The config override of a load request's ``parameters`` (None: none); 400 for anything else."""
    if params is None:
        return None
    if not isinstance(params, dict):
        raise InvalidArgument(f"'parameters' must be an object, not {type(params).__name__}")
    override = None
    for key, value in params.items():
        if key == "config":
            if not isinstance(value, str):
                raise InvalidArgument("parameter 'config' must be a string holding a JSON object (config.json keys)")
            try:
                override = json.loads(value)
            except ValueError as e:
                raise InvalidArgument(f"parameter 'config' is not valid JSON: {e}") from None
            if not isinstance(override, dict):
                raise InvalidArgument("parameter 'config' must hold a JSON object (config.json keys)")
            if "name" in override and override["name"] != name:
                raise InvalidArgument(f"the config override names model {override['name']!r}, not {name!r}")
        elif key.startswith("file:"):
            raise InvalidArgument(
                f"file overrides ({key!r:.80}) are not supported: put the model's files in its folder of the "
                f"model repository and load it by name"
            )
        else:
            raise InvalidArgument(f"unknown load parameter {key!r:.64}; the one known is 'config'")
    return override


class ModelManager:
    """The models of one data plane as the repository API sees them (see the module docstring)."""

    def __init__(self, dp: DataPlane):
        self.dp = dp
        self._state: dict[str, tuple[str, str]] = {}  # the models not READY: (state, reason)
        self._locks: dict[str, asyncio.Lock] = {}
        self._files = {name: fingerprint(lm) for name, lm in dp.repo.models.items()}
        self._stopping = False

    @property
    def root(self) -> Path:
        return self.dp.repo.root

    def _in_folder(self, name: str) -> bool:
        try:
            check_name("model", name)
        except ValueError:
            return False
        return (self.root / name / "config.json").is_file()

    def known(self, name: str) -> bool:
        """Served, being loaded or unloaded, once loaded, or a folder of the repository."""
        return name in self.dp.models or name in self._state or self._in_folder(name)

    def not_serving(self, name: str) -> ServingError:
        """The error for a request to a model that is not serving, saying why and what to do."""
        state, reason = self._state.get(name, ("", ""))
        if state == LOADING:
            return Unavailable(f"model '{name}' is {reason}; retry shortly", retry_after_s=1.0)
        if state == UNLOADING:
            return Unavailable(f"model '{name}' is being unloaded and takes no new requests", retry_after_s=1.0)
        load = f"load it with POST /v2/repository/models/{name}/load"
        if state == UNAVAILABLE:
            return NotFound(f"model '{name}' is unavailable ({reason:.400}); {load}")
        if self._in_folder(name):
            return NotFound(f"model '{name}' is in the repository but not loaded; {load}")
        return NotFound(f"unknown model '{name:.128}'; this server serves {sorted(self.dp.models)}")

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model of the repository folder, served or once loaded, with its state and reason."""
        try:
            folders = set(self.dp.repo.model_names())
        except FileNotFoundError:
            folders = set()
        out = []
        for name in sorted(folders | set(self.dp.models) | set(self._state)):
            m = self.dp.models.get(name)
            if m is not None:
                state, reason = READY, ""
            else:
                state, reason = self._state.get(name, (UNAVAILABLE, "not loaded"))
            if ready_only and state != READY:
                continue
            version = m.config.versions[-1] if m is not None else ""
            out.append({"name": name, "version": version, "state": state, "reason": reason})
        return out

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    def _check_serving(self) -> None:
        workers = self.dp.settings.workers or 1
        if workers > 1:
            raise InvalidArgument(
                f"this gateway is one of {workers} worker processes sharing the port: a model loaded or "
                "unloaded through one would be missing from the others; change the model repository and "
                "restart the service, or run it with workers: 1"
            )
        if self._stopping or not self.dp.serving:
            raise Unavailable("the server is starting or shutting down; retry shortly", retry_after_s=1.0)

    async def load(self, name: str, params: Any = None) -> str:
        """Load ``name`` from its folder (``params``: the request's ``parameters``; ``config`` is a JSON
        object whose keys replace config.json's). A model already serving is reloaded when its files or
        its override changed, else left as it is. Returns what happened: loaded, reloaded, unchanged."""
        try:
            check_name("model", name)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        override = parse_load_parameters(name, params)
        self._check_serving()
        async with self._lock(name):
            self._check_serving()
            current = self.dp.models.get(name)
            try:
                loaded = await asyncio.get_running_loop().run_in_executor(
                    None, load_model_dir, self.root, name, override
                )
                if current is not None and self._files.get(name) == fingerprint(loaded):
                    return "unchanged"
                self._check_fits(loaded)
                self.dp.new_state(loaded)  # the batching settings, checked before the old one goes
            except FileNotFoundError as e:
                raise NotFound(f"cannot load model '{name}': {e}") from None
            except (ModelProblem, ModelLoadError) as e:
                if current is None:
                    self._state[name] = (UNAVAILABLE, f"its last load failed: {e}")
                raise InvalidArgument(f"cannot load model '{name}': {e}") from None
            self._state[name] = (LOADING, "being reloaded" if current is not None else "loading")
            try:
                if current is not None:
                    await self._retire(name, current, f"model '{name}' is being reloaded; retry shortly")
                await self.dp.backend.add_model(loaded)
                state = self.dp.new_state(loaded)  # (the backend now knows how it lays out the model's replicas)
            except ModelLoadError as e:
                self._state[name] = (UNAVAILABLE, f"its last load failed: {e}")
                raise InvalidArgument(f"cannot load model '{name}': {e}") from None
            except BaseException:
                self._state[name] = (UNAVAILABLE, "its last load was interrupted")
                raise
            self.dp.install(state)
            self.dp.repo.models[name] = loaded
            self._files[name] = fingerprint(loaded)
            self._state.pop(name, None)
            log.info("model %r %s", name, "reloaded" if current is not None else "loaded")
            return "reloaded" if current is not None else "loaded"

    def _check_fits(self, loaded: LoadedModel) -> None:
        """The request sizes the gateway reads are fixed when it starts (grpc's receive limit cannot
        move): a model whose largest request is bigger is refused, naming the setting that moves them."""
        need = size_limits(self.dp.settings, [loaded.config])
        have = self.dp.size_limits
        if not have.fits(need):
            raise ModelProblem(
                f"its largest request ({loaded.config.max_batch_size} rows) takes up to {need.body:,} bytes in "
                f"JSON and {need.grpc:,} on gRPC, more than this gateway reads ({have.body:,} and {have.grpc:,}, "
                "set when it started from the largest request of the models it served then): restart it with "
                "max_request_bytes set that high, or lower the model's max_batch_size"
            )

    async def unload(self, name: str, params: Any = None) -> str:
        """Stop serving ``name``: no new request from now on, the ones admitted answered (for at most
        ``unload_drain_s``), then its replicas go. Returns unloaded, or not loaded when it was not."""
        if params is not None and (not isinstance(params, dict) or set(params) - {"unload_dependents"}):
            raise InvalidArgument("the one unload parameter is 'unload_dependents' (a model here has no dependents)")
        self._check_serving()
        async with self._lock(name):
            current = self.dp.models.get(name)
            if current is None:
                if not self.known(name):
                    raise self.not_serving(name)
                if self._state.get(name, (UNAVAILABLE,))[0] == UNAVAILABLE:
                    self._state[name] = (UNAVAILABLE, "unloaded")
                return "not loaded"
            self._state[name] = (UNLOADING, "answering the requests already admitted")
            try:
                await self._retire(name, current, f"model '{name}' was unloaded; it takes no new requests")
            finally:
                self._state[name] = (UNAVAILABLE, "unloaded")
                self._files.pop(name, None)
                self.dp.repo.models.pop(name, None)
            log.info("model %r unloaded", name)
            return "unloaded"

    async def _retire(self, name: str, state: ModelState, why: str) -> None:
        """Take ``name`` out of serving, let what it admitted finish, and stop its replicas."""
        self.dp.uninstall(name)
        await state.batcher.drain(self.dp.settings.unload_drain_s, why)
        await self.dp.backend.remove_model(name)

    def stop(self) -> None:
        """The server is stopping: no load or unload from now on."""
        self._stopping = True
