"""One DataPlane behind both transports: metadata, readiness, validation and inference.

REST and gRPC decode the wire into an :class:`~sloserve.gateway.types.InferRequest`, call
:meth:`DataPlane.infer`, and encode the :class:`~sloserve.gateway.types.InferResponse` it returns. Which
transport a request came from is never part of the request.
"""

from __future__ import annotations

import functools
import random
import time
from typing import Any

import numpy as np

from sloserve.batching.batcher import Batcher, ShedHook
from sloserve.batching.clock import Clock, MonotonicClock
from sloserve.batching.options import split_key, variant_of
from sloserve.batching.policies.slo_settings import SLOSettings
from sloserve.batching.policy import POLICIES, make_policy, policy_settings
from sloserve.batching.profile import ProfileTable
from sloserve.gateway.backends.base import Backend, ModelLoadError
from sloserve.gateway.config import Settings
from sloserve.gateway.errors import (
    DeadlineUnreachable,
    InvalidArgument,
    NotFound,
    ServingError,
    TooManyRequests,
    Unavailable,
)
from sloserve.gateway.limits import size_limits
from sloserve.gateway.looplag import LoopLag, door_ms
from sloserve.gateway.metrics import Metrics
from sloserve.gateway.modelinfo import ModelStats, triton_config
from sloserve.gateway.repository import ModelManager
from sloserve.gateway.types import InferRequest, InferResponse
from sloserve.models.repository import LoadedModel, ModelConfig, ModelRepository

SERVER_NAME = "sloserve"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "slo_parameters", "accuracy_variants"]


class ModelState:
    """A model's resolved config (repository + overrides), its batcher and its variant order.

    ``keys``: what the batcher and the policy choose among, best first: the variants, or for a model
    on several device types its serving options (``sloserve.batching.options``: ``plan`` is the backend's).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        settings: Settings,
        backend: Backend,
        metrics: Metrics,
        clock: Clock,
        profiles: ProfileTable | None = None,
    ):
        over = settings.models.get(loaded.config.name)
        cfg = loaded.config
        if over is not None and over.slo_ms is not None:
            cfg = cfg.model_copy(update={"slo_ms": over.slo_ms})
        self.config: ModelConfig = cfg
        self.inputs = {t.name: t for t in cfg.inputs}
        self.input_names = tuple(self.inputs)  # what a transport checks before it decodes a request
        self.outputs = {t.name: t for t in cfg.outputs}
        self.by_accuracy = [v.name for v in cfg.variants_by_accuracy]
        best = cfg.best_variant
        self.default_variants = tuple([best] + [v for v in self.by_accuracy if v != best])
        self.accuracy = {v.name: v.accuracy for v in cfg.variants}
        self.plan = plan = backend.options_of(cfg.name)
        self.device_types: tuple[str, ...] = (
            plan.device_types() if plan is not None else (backend.device_type_of(cfg.name),)
        )
        # every served option: the fallback chain, then the dominated ones (served only when pinned)
        self.keys: list[str] = list(plan.served) if plan is not None else list(self.by_accuracy)
        key_accuracy = {k: self.accuracy[variant_of(k)] for k in self.keys}
        batching = dict(cfg.batching)
        if over is not None and over.batching is not None:
            batching = dict(over.batching)
        policy_name = batching.pop("policy", None) or settings.default_policy
        context = {
            "max_batch_size": cfg.max_batch_size,
            "default_variant": best if plan is None else self.keys[0],
            "model": cfg.name,
            "profile": profiles,
            "device_type": backend.device_type_of(cfg.name),
            "accuracy": key_accuracy,
            "variants": list(self.keys),
        }
        try:
            knobs = {**_gateway_defaults(policy_name, settings), **batching}
            self.policy = make_policy(policy_name, **{**context, **knobs})  # a batching key overrides the model's
        except ValueError as e:  # the server refuses to start, saying which setting to fix
            raise ModelLoadError(f"models.{cfg.name}.batching {batching}: {e}") from None
        hook, depth = metrics.batcher_hook(cfg.name)
        self.stats = stats = ModelStats()

        def on_event(kind: str, rec: Any) -> None:
            if kind == "batch":
                stats.batch(rec[1], rec[2])  # (variant, rows, compute_s, reason)
            hook(kind, rec)

        max_rows = over.max_queue_rows if over and over.max_queue_rows else settings.max_queue_rows
        self.batcher = Batcher(
            cfg.name,
            self.policy,
            backend,
            self.keys,
            cfg.max_batch_size,
            max_queue_rows=max_rows,
            clock=clock,
            on_event=on_event,
            late_grace_s=settings.late_grace_s,
            no_replica_wait_s=settings.no_replica_wait_s,
            # validation fixes every non-batch dimension and the datatype: batches need no shape check
            uniform_inputs=all(-1 not in t.shape for t in cfg.inputs),
        )
        depth.set_function(lambda: self.batcher.queued_rows)
        for v in self.keys:  # read at scrape time only
            metrics.batch_slots.labels(cfg.name, v).set_function(functools.partial(backend.slots, cfg.name, v))

    def triton_config(self) -> dict[str, Any]:
        """The model's config in Triton's ``ModelConfig`` shape (sloserve/gateway/modelinfo.py)."""
        return triton_config(self.config, self.policy.name)

    def metadata(self) -> dict[str, Any]:
        c = self.config
        return {
            "name": c.name,
            "versions": list(c.versions),
            "platform": c.platform,
            "inputs": [{"name": t.name, "datatype": t.datatype, "shape": [-1, *t.shape]} for t in c.inputs],
            "outputs": [{"name": t.name, "datatype": t.datatype, "shape": [-1, *t.shape]} for t in c.outputs],
            "parameters": {
                "max_batch_size": c.max_batch_size,
                "slo_ms": c.slo_ms,
                "variants": [
                    {"name": v.name, "accuracy": v.accuracy, "cost_flops": v.cost_flops} for v in c.variants_by_accuracy
                ],
                "default_variant": c.best_variant,
                "batching_policy": self.policy.name,
                **({"device_types": list(self.device_types)} if self.plan is not None else {}),
            },
        }


class InflightBytes:
    """Request bytes held in the gateway at once (being decoded, queued or in a batch), over every
    model and transport, bounded by ``max_inflight_bytes``: past it a request is refused with 429 +
    Retry-After before its body is read (when it declares a Content-Length), so a flood of large
    requests cannot grow the gateway's memory without bound. One event loop: no lock.

    >>> held = InflightBytes(1024)
    >>> n = held.take(1000, "digits"); held.give(n); held.held
    0
    """

    def __init__(self, limit: int, on_refuse=None):
        self.limit = limit
        self.held = 0
        self.on_refuse = on_refuse or (lambda model: None)

    def take(self, n: int, model: str) -> int:
        if n > 0 and self.held + n > self.limit:
            self.on_refuse(model)
            raise TooManyRequests(
                f"the gateway holds {self.held} request bytes, and {n} more would pass its "
                f"max_inflight_bytes={self.limit}; retry later",
                retry_after_s=1.0,
            )
        self.held += max(n, 0)
        return max(n, 0)

    def give(self, n: int) -> None:
        self.held -= n


class Ticket:
    """One request's pass through the data plane's door, for every transport.

    Made by :meth:`DataPlane.admit` before the body is read: it stamps the arrival and reserves the
    body's declared bytes (429 past ``max_inflight_bytes``). :meth:`read` runs when the whole body is
    in: the event-loop door (503 while the loop lags past ``loop_lag_shed_ms``) and the bytes beyond
    the declared ones. :meth:`release` (or leaving the ``with`` block) gives the bytes back, whatever
    happened.
    """

    __slots__ = ("arrival_s", "dp", "held", "model", "open")

    def __init__(self, dp: DataPlane, model: str, declared_bytes: int):
        self.dp, self.model, self.held, self.open = dp, model, 0, False
        self.arrival_s = dp.arrival_now()
        self.held = dp.inflight.take(declared_bytes, model)
        self.open = True
        dp.open_requests += 1

    def grow(self, n_bytes: int) -> None:
        """``n_bytes`` of the body are in so far: a chunked body, or one longer than it declared, is
        counted as it streams (429 the moment it would pass ``max_inflight_bytes``)."""
        if n_bytes > self.held:
            self.held += self.dp.inflight.take(n_bytes - self.held, self.model)

    def read(self, n_bytes: int) -> None:
        self.dp.door(self.model)
        self.grow(n_bytes)

    def release(self) -> None:
        self.dp.inflight.give(self.held)
        self.held = 0
        if self.open:
            self.open = False
            self.dp.open_requests -= 1

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class DataPlane:
    def __init__(
        self,
        repo: ModelRepository,
        backend: Backend,
        settings: Settings,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
    ):
        self.repo = repo
        self.backend = backend
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.clock = clock or MonotonicClock()
        self.profiles = ProfileTable.load(repo.root)
        self.models: dict[str, ModelState] = {
            name: ModelState(m, settings, backend, self.metrics, self.clock, self.profiles)
            for name, m in repo.models.items()
        }
        self.metrics.watch_policies({name: m.policy for name, m in self.models.items()})
        # fixed for the gateway's life (grpc's receive limit cannot move): a model loaded later must fit
        self.size_limits = size_limits(settings, (m.config for m in self.models.values()))
        self.repository = ModelManager(self)  # the repository API: index, load, unload (sloserve/gateway/repository.py)
        self.inflight = InflightBytes(settings.max_inflight_bytes, self._refused_bytes)
        self.open_requests = 0  # requests past the door and not yet answered (tickets not released)
        _inflight_gauge(self.metrics, self.inflight)
        self._started = False
        self._draining = False
        # the event loop's lag (sloserve/gateway/looplag.py): a metric, and optionally counted against deadlines
        self.loop_lag = LoopLag() if isinstance(self.clock, MonotonicClock) else None
        self._lag_shed_s = door_ms(settings) / 1e3 if self.loop_lag is not None else 0.0
        self._door_rng = random.Random(0)
        if self.loop_lag is not None:
            self.metrics.loop_lag.set_function(lambda: self.loop_lag.estimate_s if self.loop_lag is not None else 0.0)
        gauge = self.metrics.replicas
        backend.on_replicas = lambda m, v, d, state, n: gauge.labels(m, v, d, state).set(n)
        runtime = self.metrics.replica_runtime
        backend.on_runtime = lambda m, v, d, provider, n: runtime.labels(m, v, d, provider).set(n)
        backend.on_capacity = self._capacity_changed
        peak = self.metrics.replica_peak
        backend.on_held = lambda m, v, n: peak.labels(m, v).set(n)

    def _capacity_changed(self, model: str) -> None:
        state = self.models.get(model)
        if state is not None:
            state.batcher.capacity_changed()

    def admit(self, model: str, declared_bytes: int = 0) -> Ticket:
        """A request for ``model`` is at the door (see :class:`Ticket`): raises ``TooManyRequests``
        when its declared bytes would pass ``max_inflight_bytes``."""
        return Ticket(self, model, declared_bytes)

    def arrival_now(self) -> float:
        """A request's arrival stamp (it also keeps the event-loop lag probe running)."""
        if self.loop_lag is not None:
            self.loop_lag.touch()
        return self.clock.now()

    def door(self, model: str) -> None:
        """Refuse a request before it is decoded while the event loop lags past ``loop_lag_shed_ms``
        (the probes' mean, counted while the latest probe is late too): a share ``(lag - t) / t`` of
        them between ``t`` and ``2t``, every one above. Raises :class:`DeadlineUnreachable` (reason
        ``overload``); a no-op when the setting is 0 and for a model that does not exist (its 404)."""
        t = self._lag_shed_s
        ll = self.loop_lag  # (t is 0 without it)
        if not t or ll is None or model not in self.models:  # (an unknown model adds no series)
            return
        # the loop's own lag (a core taken by another process is no reason to refuse); a stall that is
        # over lets the door go
        lag = ll.own_estimate_s if ll.own_last_s > t else 0.0
        if lag <= t or (lag < 2 * t and self._door_rng.random() >= (lag - t) / t):
            return
        self.metrics.observe_request(model, "none", "shed", 0.0, False)
        self.metrics.shed.labels(model, "overload").inc()
        raise DeadlineUnreachable(
            f"the gateway is overloaded: its event loop runs {lag * 1e3:.1f} ms behind (loop_lag_shed_ms "
            f"{t * 1e3:g}); retry after Retry-After, or spread the load over more gateway processes",
            retry_after_s=max(0.05, 4 * lag),
            reason="overload",
        )

    async def start(self) -> None:
        if self.loop_lag is not None:
            self.loop_lag.start()
        await self.backend.start()
        for m in self.models.values():
            m.batcher.start()
        self._started = True

    # ---- models loaded and unloaded while serving (sloserve/gateway/repository.py) -------------------
    @property
    def serving(self) -> bool:
        """Started and not stopping: models may be loaded and unloaded."""
        return self._started and not self._draining

    def new_state(self, loaded: LoadedModel) -> ModelState:
        """A model's state (config with overrides, policy, batcher), not yet serving; a batching setting
        that does not fit its policy is a :class:`ModelLoadError` naming it."""
        return ModelState(
            loaded, self.settings, self.backend, self.metrics, self.clock, ProfileTable.load(self.repo.root)
        )

    def install(self, m: ModelState) -> None:
        """``m`` serves from now on (its replicas are up)."""
        self.models[m.config.name] = m
        self.metrics.watch_policies({m.config.name: m.policy})
        m.batcher.start()

    def uninstall(self, name: str) -> ModelState | None:
        """``name`` takes no new request from now on (its batcher still answers what it admitted)."""
        self.metrics.forget_policy(name)
        return self.models.pop(name, None)

    def drain(self) -> None:
        """The server is stopping: not ready from now on, and new requests are refused (503); the
        ones already queued or in a batch are still answered."""
        self._draining = True
        self.repository.stop()

    async def stop(self) -> None:
        self._draining = True
        self._started = False
        if self.loop_lag is not None:
            self.loop_lag.stop()
        self.repository.stop()
        for m in self.models.values():
            await m.batcher.close()
        await self.backend.stop()

    # ---- health and metadata --------------------------------------------------------------
    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Serving: started, the backend up (connected to Ray), and every model ready."""
        return (
            self._started
            and not self._draining
            and self.backend.ready()
            and all(self._has_replicas(m) for m in self.models.values())
        )

    def _has_replicas(self, m: ModelState) -> bool:
        return all(self.backend.replica_count(m.config.name, v) > 0 for v in m.keys)

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}

    def model(self, name: str, version: str | None = None) -> ModelState:
        m = self.models.get(name)
        if m is None:
            raise self.repository.not_serving(name)
        if version not in (None, "") and version not in m.config.versions:
            raise NotFound(f"model '{name}' has no version '{version:.32}'; versions: {list(m.config.versions)}")
        return m

    def input_names(self, name: str, version: str | None = None) -> tuple[str, ...]:
        """The inputs of the model an infer request names, which bound its decoding (a transport asks
        before it decodes the request); a model that is not served is refused here, counted as
        :meth:`infer` counts it."""
        try:
            return self.model(name, version).input_names
        except ServingError as e:
            self.metrics.observe_request("unknown", "none", e.kind, 0.0, None)
            raise

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """The model can answer: the server started, the backend up, a running replica for each variant."""
        if name not in self.models and self.repository.known(name):
            return False  # in the repository, not loaded (or loading, or unloading)
        m = self.model(name, version)
        return self._started and not self._draining and self.backend.ready() and self._has_replicas(m)

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        """The model's config in Triton's ``ModelConfig`` shape."""
        return self.model(name, version).triton_config()

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's ``ModelStatisticsResponse``: one model's (at ``version``: its versions share one set of
        variants, so one set of counters), or every served model's."""
        chosen = (
            [(self.model(name, version), version)] if name else [(self.models[n], None) for n in sorted(self.models)]
        )
        return {"model_stats": [m.stats.triton(m.config.name, v or m.config.versions[-1]) for m, v in chosen]}

    # ---- inference ------------------------------------------------------------------------
    def validate(self, m: ModelState, req: InferRequest) -> tuple[dict[str, np.ndarray], int]:
        """Check inputs against the model's metadata; return the arrays and the batch rows."""
        cfg = m.config
        unknown = [n for n in req.inputs if n not in m.inputs]
        if unknown:
            raise InvalidArgument(f"model '{cfg.name}' has no input '{unknown[0]:.64}'; inputs: {list(m.inputs)}")
        arrays: dict[str, np.ndarray] = {}
        rows = None
        for name, spec in m.inputs.items():
            if name not in req.inputs:
                raise InvalidArgument(
                    f"missing input '{name}' ({spec.datatype}, shape [-1, {', '.join(map(str, spec.shape))}])"
                )
            datatype, arr = req.inputs[name]
            if datatype != spec.datatype:
                raise InvalidArgument(
                    f"input '{name}' has datatype {datatype}; model '{cfg.name}' expects {spec.datatype}"
                )
            want = [-1, *spec.shape]
            if arr.ndim != len(want) or any(w != -1 and w != d for w, d in zip(want, arr.shape, strict=False)):
                raise InvalidArgument(
                    f"input '{name}' has shape {list(arr.shape)}; model '{cfg.name}' expects {want} "
                    f"(first dimension = batch rows, 1..{cfg.max_batch_size})"
                )
            n = arr.shape[0]
            if n < 1:
                raise InvalidArgument(f"input '{name}' has an empty batch (shape {list(arr.shape)})")
            if n > cfg.max_batch_size:
                raise InvalidArgument(
                    f"input '{name}' carries {n} rows, over model '{cfg.name}' max_batch_size "
                    f"{cfg.max_batch_size}; split the request"
                )
            if rows is None:
                rows = n
            elif n != rows:
                raise InvalidArgument(f"inputs disagree on the batch dimension ({rows} vs {n} rows)")
            arrays[name] = arr
        if req.outputs is not None:
            for o in req.outputs:
                if o.name not in m.outputs:
                    raise InvalidArgument(
                        f"model '{cfg.name}' has no output '{o.name:.64}'; outputs: {list(m.outputs)}"
                    )
        return arrays, rows or 0

    def allowed_variants(self, m: ModelState, req: InferRequest) -> tuple[str, ...]:
        """The keys that may serve ``req``, best first: its variants (pinned, at or above
        ``min_accuracy``, or all), each on its device types in the backend's order for a model on several
        (only the pinned ``device_type`` when it names one). A pinned variant runs on all its
        options; otherwise only the fallback chain's (dominated options left out)."""
        variants = self._variants(m, req)
        pin = req.params.device_type
        if m.plan is None:
            if pin is not None:
                self._device_type(m, pin)  # one type: only it may be pinned
            return variants
        dev = self._device_type(m, pin) if pin is not None else None
        pinned = req.params.variant is not None
        keys = tuple(
            k
            for v in variants
            for k in m.plan.of_variant(v, pinned=pinned)
            if dev is None or split_key(k, "")[1] == dev
        )
        if not keys:  # (a dominated option's dominator is on the same type: not reached with a known type)
            served = sorted({variant_of(k) for k in m.keys if dev is None or split_key(k, "")[1] == dev})
            where = f" on device type '{dev}'" if dev is not None else ""
            raise InvalidArgument(f"model '{m.config.name}' serves none of {list(variants)}{where}; it serves {served}")
        return keys

    def _device_type(self, m: ModelState, name: str) -> str:
        """The model's device type ``name`` names (its profile name, any case; ``cpu`` for the CPU's)."""
        n = name.lower()
        for d in m.device_types:
            if d == n or (n == "cpu" and d.startswith("cpu")):
                return d
        raise InvalidArgument(
            f"unknown device_type '{name:.64}' for model '{m.config.name}'; device types: {list(m.device_types)}"
        )

    def _variants(self, m: ModelState, req: InferRequest) -> tuple[str, ...]:
        p = req.params
        if p.variant is not None:
            if p.variant not in m.accuracy:
                raise InvalidArgument(
                    f"unknown variant '{p.variant:.64}' for model '{m.config.name}'; variants: {m.by_accuracy}"
                )
            if p.min_accuracy is not None and m.accuracy[p.variant] < p.min_accuracy:
                raise InvalidArgument(
                    f"variant '{p.variant}' has accuracy {m.accuracy[p.variant]:.4f}, below the "
                    f"min_accuracy {p.min_accuracy} asked for"
                )
            return (p.variant,)
        if p.min_accuracy is not None:
            ok = tuple(v for v in m.default_variants if m.accuracy[v] >= p.min_accuracy)
            if not ok:
                best = m.by_accuracy[0]
                raise InvalidArgument(
                    f"no variant of '{m.config.name}' reaches min_accuracy {p.min_accuracy}; the best is "
                    f"'{best}' at {m.accuracy[best]:.4f}"
                )
            return ok
        return m.default_variants

    async def infer(self, req: InferRequest, on_shed: ShedHook | None = None) -> InferResponse:
        """Validate, queue and answer ``req``. ``on_shed`` (a transport's): called with the error the
        moment the batcher sheds the request, so the transport can write the answer from inside
        that decision (``sloserve/gateway/transports/fastpath.py``)."""
        arrival = req.arrival_s or self.arrival_now()
        variant_label = "none"
        m = None
        try:
            m = self.model(req.model, req.version)
            if not self._started or self._draining:
                why = "shutting down: retry on another replica" if self._draining else "starting; retry shortly"
                raise Unavailable(f"the server is {why}", retry_after_s=1.0)
            arrays, rows = self.validate(m, req)
            variants = self.allowed_variants(m, req)
            slo_ms = req.params.slo_ms
            best_effort = slo_ms is None
            # the SLO the request is counted against: its own, or the model's (the service objective)
            target = arrival + (m.config.slo_ms if slo_ms is None else slo_ms) / 1000.0
            # no deadline asked for: served behind deadline traffic, never refused for the model's
            deadline = arrival + self.settings.best_effort_wait_s if best_effort else target
            self.backend.note_arrival(m.config.name, rows)
            out = await m.batcher.submit(
                arrays, rows, deadline, variants, req.params.priority, arrival, on_shed, best_effort=best_effort
            )
        except ServingError as e:
            if m is not None:
                m.stats.fail(self.clock.now() - arrival)
            self.metrics.observe_request(
                req.model if m else "unknown",
                variant_label,
                e.kind,
                0.0,
                False if isinstance(e, DeadlineUnreachable) else None,
            )
            raise
        done = self.clock.now()
        latency = done - arrival
        variant = variant_of(out.variant)  # (a key of a model on several device types: its variant)
        self.metrics.observe_request(m.config.name, variant, "ok", latency, done <= target)
        m.stats.success(latency, out.queue_s, out.compute_s, rows, time.time())
        outputs = out.outputs
        if req.outputs is not None:
            outputs = {o.name: outputs[o.name] for o in req.outputs}
        return InferResponse(
            model=m.config.name,
            version=req.version or m.config.versions[-1],
            outputs=outputs,
            id=req.id,
            requested=req.outputs,
            binary_output=req.binary_output,
            parameters={
                "variant": variant,
                "accuracy": m.accuracy[variant],
                "batch_size": out.batch_rows,
                "queue_ms": round(out.queue_s * 1e3, 3),
                "compute_ms": round(out.compute_s * 1e3, 3),
                "device_type": out.device_type,
            },
        )

    def _refused_bytes(self, model: str) -> None:
        self.metrics.observe_request(model if model in self.models else "unknown", "none", "rejected", 0.0, None)


def _inflight_gauge(metrics: Metrics, inflight: InflightBytes) -> None:
    from prometheus_client import Gauge

    g = Gauge(
        "sloserve_inflight_bytes",
        "Request bytes held in the gateway (decoding, queued, in a batch).",
        registry=metrics.registry,
    )
    g.set_function(lambda: inflight.held)


def _gateway_defaults(policy: str, settings: Settings) -> dict[str, Any]:
    """The slo policy's knobs the gateway sets for every model (``dispatch_margin_ms``,
    ``slo_max_wait_ms``, ``slo_size_quantile``); a model's own batching config overrides them."""
    if policy not in POLICIES or not issubclass(policy_settings(policy), SLOSettings):
        return {}
    return {
        "safety_ms": settings.dispatch_margin_ms,
        "max_wait_ms": settings.slo_max_wait_ms,
        "size_quantile": settings.slo_size_quantile,
    }
