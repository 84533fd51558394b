"""The model repository extension of the V2 protocol (as Triton and MLServer serve it): the index of
the repository's models with their state, ``load`` (with an optional config override) and
``unload``, while the server serves the others.

States: ``READY`` (serving), ``LOADING`` (being loaded, or reloaded: new requests get 503 +
Retry-After meanwhile), ``UNLOADING`` (taking no new request; those already admitted are answered)
and ``UNAVAILABLE`` (not loaded: its reason says why, ``unloaded``, ``not loaded`` or what made its
load fail). A load checks the folder first (``sloserve.models.repository.load_model_dir``, the check
start-up and ``sloserve models check`` run): a model that fails it answers 400 naming what is wrong,
and a model already serving keeps serving. A reload (a load of a model whose files or override
changed) drains the old one, then starts the new one. One load or unload of a model at a time.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from sloserve.batching.policy import CONTEXT_FIELDS, POLICIES, policy_settings
from sloserve.gateway.backends.base import Backend, ModelLoadError
from sloserve.gateway.config import Settings
from sloserve.gateway.errors import InvalidArgument, NotFound, ServingError, Unavailable
from sloserve.gateway.limits import SizeLimits, size_limits
from sloserve.gateway.loadstate import LOADING, READY, UNAVAILABLE, UNLOADING, fingerprint
from sloserve.gateway.modelstate import ModelState
from sloserve.models.repository import (
    LoadedModel,
    ModelProblem,
    ModelRepository,
    TensorSpec,
    VariantConfig,
    check_name,
    is_model_folder,
    load_model_dir,
    relative_to_repository,
)
from sloserve.models.schema import DynamicBatching

log = logging.getLogger("sloserve.repository")


MAX_CONFIG_BYTES = 64 * 1024  # a config override's JSON text (a demo model's config.json is under 2 KiB)
MAX_CONFIG_DEPTH = 16  # nesting of that JSON (config.json's own is 3: {"inputs": [{"shape": [...]}]})
_JSON_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')  # a string (skipped whole), or a bracket


def json_depth(text: str, limit: int) -> int:
    """How deep ``text``'s arrays and objects nest, counted without parsing it (strings skipped),
    up to ``limit + 1``: the scan stops as soon as it is deeper than ``limit``.

    >>> json_depth('{"a": [1, {"b": "[[["}]}', 16), json_depth("[" * 50_000, 16)
    (3, 17)
    """
    depth = deepest = 0
    for m in _JSON_NESTING.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif c in "]}":
            depth -= 1
    return deepest


def _knob_value(v: Any) -> bool:
    if v is None or isinstance(v, bool | int | float | str):
        return True
    return isinstance(v, list) and len(v) <= 4096 and all(isinstance(x, int | float) for x in v)


def _key_error(key: Any, message: str) -> PydanticCustomError:
    """A problem with one key of ``batching``, for the 400 to name it (``batching.<key>``)."""
    return PydanticCustomError("override_key", "{message}", {"key": f"{key!s:.64}", "message": message})


class BatchingOverride(BaseModel):
    """``batching`` of a load's config override: the policy and its tuning knobs, nothing else.

    Everything a policy is given beside its knobs (its context: the latency ``profile``, which may
    name a directory to read, ``latency_fn``, the model, its variants, accuracy and device type) comes
    from the repository and the operator's config file, never from a request. Each knob must be one
    that a registered policy declares; its value is checked by that policy when the model loads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str | None = Field(default=None, description="The batching policy (default: the server's).")
    max_batch_size: int | None = Field(default=None, ge=1, le=4096, description="Most rows in one batch.")
    knobs: dict[str, Any] = Field(
        default_factory=dict,
        description="The policy's tuning knobs, as ``batching`` holds them beside ``policy``: each a number, a "
        "string, a boolean, null or a list of numbers (the policy checks its value).",
    )

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, raw: Any) -> Any:
        """config.json's flat ``{"policy": ..., "max_wait_ms": ...}`` into ``policy`` and ``knobs``."""
        if not isinstance(raw, dict):
            return raw
        out: dict[str, Any] = {"knobs": {}}
        policy = raw.get("policy")
        if policy is not None and (not isinstance(policy, str) or policy not in POLICIES):
            raise _key_error("policy", f"{policy!r:.60} is not a batching policy; known: {sorted(POLICIES)}")
        names = (
            set(policy_settings(policy).model_fields)
            if policy
            else {k for p in POLICIES for k in policy_settings(p).model_fields}
        )
        for key, value in raw.items():
            if key in ("policy", "max_batch_size"):
                out[key] = value
            elif key in CONTEXT_FIELDS:
                raise _key_error(
                    key,
                    f"cannot be set by a load: a policy's {key} comes from the model repository and the operator's "
                    "config file (models.<m>.batching), never from a request",
                )
            elif key not in names:
                raise _key_error(
                    key,
                    f"not a setting of batching policy {policy or 'any'!r}; its settings: {', '.join(sorted(names))}",
                )
            elif not _knob_value(value):
                raise _key_error(
                    key, f"{value!r:.60} is not a knob's value (a number, string, boolean, null or list of numbers)"
                )
            else:
                out["knobs"][key] = value
        return out

    def as_config(self) -> dict[str, Any]:
        """Back to config.json's flat shape, with only what was given."""
        flat: dict[str, Any] = {k: v for k, v in (("policy", self.policy), ("max_batch_size", self.max_batch_size))}
        return {**{k: v for k, v in flat.items() if k in self.model_fields_set}, **self.knobs}


class ConfigOverride(BaseModel):
    """A load's config override: some of config.json's keys (sloserve/models/repository.py, ``ModelConfig``),
    typed; no other key, and none that names a file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    versions: tuple[str, ...] | None = None
    platform: str | None = None
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    max_batch_size: int | None = Field(default=None, ge=1, le=4096)
    slo_ms: float | None = Field(default=None, gt=0)
    variants: tuple[VariantConfig, ...] | None = Field(default=None, min_length=1)
    default_variant: str | None = None
    batching: BatchingOverride | None = None
    dynamic_batching: DynamicBatching | None = None
    description: str | None = None

    def as_config(self) -> dict[str, Any]:
        """The config.json keys it replaces, in config.json's JSON shape."""
        out = self.model_dump(mode="json", exclude_unset=True, exclude={"batching"})
        if "batching" in self.model_fields_set:
            out["batching"] = self.batching.as_config() if self.batching is not None else None
        return out


def _parse_config_override(name: str, value: Any) -> dict:
    """``parameters.config``: a JSON object of config.json keys, bounded in size and depth before it is
    parsed; every problem a 400 naming the key."""
    if not isinstance(value, str):
        raise InvalidArgument("parameter 'config' must be a string holding a JSON object (config.json keys)")
    if len(value) > MAX_CONFIG_BYTES:
        raise InvalidArgument(
            f"parameter 'config' is {len(value):,} characters, over the {MAX_CONFIG_BYTES:,} a config override may "
            "take; put a larger config in the model's config.json"
        )
    depth = json_depth(value, MAX_CONFIG_DEPTH)
    if depth > MAX_CONFIG_DEPTH:
        raise InvalidArgument(
            f"parameter 'config' nests arrays and objects more than {MAX_CONFIG_DEPTH} deep (a model config nests 3)"
        )
    try:
        doc = orjson.loads(value)
    except (orjson.JSONDecodeError, RecursionError) as e:
        raise InvalidArgument(f"parameter 'config' is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("parameter 'config' must hold a JSON object (config.json keys)")
    try:
        override = ConfigOverride.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in (*err["loc"], *(err.get("ctx") or {}).get("key", "").split(".")) if p != "")
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"not a key of config.json; a config override takes {', '.join(ConfigOverride.model_fields)}"
        raise InvalidArgument(f"parameter 'config': '{where}': {msg:.300}") from None
    except RecursionError:  # (bounded above; never a 500 whatever happens)
        raise InvalidArgument("parameter 'config' nests too deep") from None
    if override.name is not None and override.name != name:
        raise InvalidArgument(f"the config override names model {override.name!r}, not {name!r}")
    return override.as_config()


def parse_load_parameters(name: str, params: Any) -> dict | None:
    """The config override of a load request's ``parameters`` (None: none); 400 for anything else."""
    if params is None:
        return None
    if not isinstance(params, dict):
        raise InvalidArgument(f"'parameters' must be an object, not {type(params).__name__}")
    override = None
    for key, value in params.items():
        if key == "config":
            override = _parse_config_override(name, value)
        elif isinstance(key, str) and key.startswith("file:"):
            raise InvalidArgument(
                f"file overrides ({key!r:.80}) are not supported: put the model's files in its folder of the "
                f"model repository and load it by name"
            )
        else:
            raise InvalidArgument(f"unknown load parameter {key!r:.64}; the one known is 'config'")
    return override


class ModelHost(Protocol):
    """The data plane as the repository API drives it (sloserve/gateway/dataplane.py, ``DataPlane``):
    the models it serves, and how one is built, put in service and taken out."""

    repo: ModelRepository
    models: dict[str, ModelState]
    settings: Settings
    backend: Backend
    size_limits: SizeLimits

    @property
    def serving(self) -> bool: ...

    def new_state(self, loaded: LoadedModel) -> ModelState: ...

    def install(self, m: ModelState) -> None: ...

    def uninstall(self, name: str) -> ModelState | None: ...


class SharedSet(Protocol):
    """One model set for several gateways (sloserve/gateway/modelsync.py, ``SharedModels``): set on the
    manager, it takes every load and unload."""

    async def load(self, name: str, override: dict | None) -> str: ...

    async def unload(self, name: str) -> str: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class ModelManager:
    """The models of one data plane as the repository API sees them (see the module docstring)."""

    def __init__(self, dp: ModelHost):
        self.dp = dp
        self._state: dict[str, tuple[str, str]] = {}  # the models not READY: (state, reason)
        self._locks: dict[str, asyncio.Lock] = {}
        self.fingerprints = {name: fingerprint(lm) for name, lm in dp.repo.models.items()}
        self._stopping = False
        self.shared: SharedSet | None = None  # one model set for several gateways (sloserve/gateway/modelsync.py)

    @property
    def root(self) -> Path:
        return self.dp.repo.root

    def _in_folder(self, name: str) -> bool:
        try:
            check_name("model", name)
        except ValueError:
            return False
        return is_model_folder(self.root / name)

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

    def set_state(self, name: str, state: str, reason: str) -> None:
        self._state[name] = (state, reason)

    def clear_state(self, name: str) -> None:
        self._state.pop(name, None)

    def state_of(self, name: str) -> str:
        return READY if name in self.dp.models else self._state.get(name, (UNAVAILABLE, ""))[0]

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    def _check_serving(self) -> None:
        workers = self.dp.settings.workers or 1
        if workers > 1 and self.shared is None:
            raise InvalidArgument(
                f"this gateway is one of {workers} worker processes sharing the port, each with replicas of its "
                "own (backend: inprocess): a model loaded or unloaded through one would be missing from the "
                "others; change the model repository and restart the service, run it with workers: 1, or use backend: ray"
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
        if self.shared is not None:  # (its own locks: the model book's, then this gateway's)
            return await self.shared.load(name, override)
        async with self._lock(name):
            self._check_serving()
            current = self.dp.models.get(name)
            try:
                loaded = await asyncio.get_running_loop().run_in_executor(
                    None, load_model_dir, self.root, name, override
                )
                if current is not None and self.fingerprints.get(name) == fingerprint(loaded):
                    return "unchanged"
                self._check_fits(loaded)
                self.dp.new_state(loaded)  # the batching settings, checked before the old one goes
            except FileNotFoundError as e:
                raise NotFound(f"cannot load model '{name}': {self.for_client(e)}") from None
            except (ModelProblem, ModelLoadError) as e:
                log.warning("cannot load model %r: %s", name, e)  # (the log keeps the absolute paths)
                why = self.for_client(e)
                if current is None:
                    self._state[name] = (UNAVAILABLE, f"its last load failed: {why}")
                raise InvalidArgument(f"cannot load model '{name}': {why}") from None
            self._state[name] = (LOADING, "being reloaded" if current is not None else "loading")
            try:
                if current is not None:
                    await self.retire(name, current, f"model '{name}' is being reloaded; retry shortly")
                await self.dp.backend.add_model(loaded)
                state = self.dp.new_state(loaded)  # (the backend now knows how it lays out the model's replicas)
            except ModelLoadError as e:
                log.warning("cannot load model %r: %s", name, e)
                why = self.for_client(e)
                self._state[name] = (UNAVAILABLE, f"its last load failed: {why}")
                raise InvalidArgument(f"cannot load model '{name}': {why}") from None
            except BaseException:
                self._state[name] = (UNAVAILABLE, "its last load was interrupted")
                raise
            self.dp.install(state)
            self.dp.repo.models[name] = loaded
            self.fingerprints[name] = fingerprint(loaded)
            self._state.pop(name, None)
            log.info("model %r %s", name, "reloaded" if current is not None else "loaded")
            return "reloaded" if current is not None else "loaded"

    def for_client(self, e: Exception) -> str:
        """A load error as every client reads it (the index's reasons, a model's 404, the load's 400):
        paths relative to the model repository, never the server's absolute ones."""
        return relative_to_repository(str(e), self.root)

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
        if self.shared is not None:
            if name not in self.dp.models and not self.known(name):
                raise self.not_serving(name)
            return await self.shared.unload(name)
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
                await self.retire(name, current, f"model '{name}' was unloaded; it takes no new requests")
            finally:
                self._state[name] = (UNAVAILABLE, "unloaded")
                self.fingerprints.pop(name, None)
                self.dp.repo.models.pop(name, None)
            log.info("model %r unloaded", name)
            return "unloaded"

    async def retire(self, name: str, state: ModelState, why: str, stop_replicas: bool = True) -> None:
        """Take ``name`` out of serving, let what it admitted finish, and (``stop_replicas``) stop its
        replicas; else only forget them (another gateway stops them once every gateway has drained)."""
        self.dp.uninstall(name)
        await state.batcher.drain(self.dp.settings.unload_drain_s, why)
        if stop_replicas:
            await self.dp.backend.remove_model(name)
        else:
            await self.dp.backend.remove_model(name, delete=False)

    def stop(self) -> None:
        """The server is stopping: no load or unload from now on."""
        self._stopping = True
