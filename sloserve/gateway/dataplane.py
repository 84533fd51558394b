"""One DataPlane behind both transports: metadata, readiness, validation and inference.

REST and gRPC decode the wire into an :class:`~sloserve.gateway.types.InferRequest`, call
:meth:`DataPlane.infer`, and encode the :class:`~sloserve.gateway.types.InferResponse` it returns. Which
transport a request came from is never part of the request.

Its parts: the door every request passes before its body is decoded (sloserve/gateway/admission.py),
each served model's state (sloserve/gateway/modelstate.py), the checks of a request against its model
(sloserve/gateway/requestcheck.py), and the repository API that loads and unloads models while serving
(sloserve/gateway/repository.py).
"""

from __future__ import annotations

import time
from typing import Any

from sloserve.batching.batcher import ShedHook
from sloserve.batching.clock import Clock, MonotonicClock
from sloserve.batching.options import variant_of
from sloserve.batching.profile import ProfileTable
from sloserve.gateway import tracing
from sloserve.gateway.admission import Admission, InflightBytes, Ticket
from sloserve.gateway.backends.base import Backend
from sloserve.gateway.config import Settings
from sloserve.gateway.errors import DeadlineUnreachable, NotFound, ServingError, Unavailable
from sloserve.gateway.limits import size_limits
from sloserve.gateway.metrics import Metrics
from sloserve.gateway.modelstate import ModelState
from sloserve.gateway.repository import ModelManager
from sloserve.gateway.requestcheck import allowed_variants, to_wire, validate
from sloserve.gateway.types import InferRequest, InferResponse
from sloserve.models.repository import LoadedModel, ModelRepository

__all__ = ["EXTENSIONS", "SERVER_NAME", "SERVER_VERSION", "DataPlane", "InflightBytes", "ModelState", "Ticket"]

SERVER_NAME = "sloserve"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "slo_parameters", "accuracy_variants"]


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
        # the door (sloserve/gateway/admission.py): the bytes held, the requests open, the event loop's lag
        self.admission = Admission(settings, self.metrics, self.clock, lambda name: name in self.models)
        self.inflight = self.admission.inflight
        self.loop_lag = self.admission.loop_lag
        self._started = False
        self._draining = False
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
        """A request for ``model`` is at the door (sloserve/gateway/admission.py): raises
        ``TooManyRequests`` when its declared bytes would pass ``max_inflight_bytes``."""
        return self.admission.admit(model, declared_bytes)

    @property
    def open_requests(self) -> int:
        """Requests past the door and not yet answered (tickets not released)."""
        return self.admission.open_requests

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
    async def infer(self, req: InferRequest, on_shed: ShedHook | None = None) -> InferResponse:
        """Validate, queue and answer ``req``. ``on_shed`` (a transport's): called with the error the
        moment the batcher sheds the request, so the transport can write the answer from inside
        that decision (``sloserve/gateway/transports/fastpath.py``)."""
        arrival = req.arrival_s or self.admission.arrival_now()
        variant_label = "none"
        m = None
        # a sampled request's trace (sloserve/gateway/tracing.py)
        trace = tracing.current() if tracing.TRACER is not None else None
        if trace is not None:
            trace.decoded()
        try:
            m = self.model(req.model, req.version)
            if not self._started or self._draining:
                why = "shutting down: retry on another replica" if self._draining else "starting; retry shortly"
                raise Unavailable(f"the server is {why}", retry_after_s=1.0)
            arrays, rows = validate(m, req)
            variants = allowed_variants(m, req)
            slo_ms = req.params.slo_ms
            # Triton's priority level and queue timeout (sloserve/gateway/queuepolicy.py)
            level = m.queue.level(req.params.priority)
            limit = m.queue.limit(level, req.params.timeout_us)
            best_effort = slo_ms is None
            # the SLO the request is counted against: its own, or the model's (the service objective)
            target = arrival + (m.config.slo_ms if slo_ms is None else slo_ms) / 1000.0
            # no deadline asked for: served behind deadline traffic, never refused for the model's; a
            # queue timeout is no deadline (it bounds the wait, the error it meets is the timeout's)
            wait_s = max(self.settings.best_effort_wait_s, (limit.timeout_s or 0.0) if limit else 0.0)
            deadline = arrival + wait_s if best_effort else target
            self.backend.note_arrival(m.config.name, rows)
            out = await m.batcher.submit(
                arrays,
                rows,
                deadline,
                variants,
                level,
                arrival,
                on_shed,
                best_effort=best_effort,
                limit=limit,
                trace=trace,
            )
        except ServingError as e:
            if trace is not None:
                trace.error(e)
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
        if trace is not None:  # the latency carries the trace as its exemplar
            trace.answered()
            self.metrics.observe_request(m.config.name, variant, "ok", latency, done <= target, trace.exemplar)
        else:
            self.metrics.observe_request(m.config.name, variant, "ok", latency, done <= target)
        self.metrics.phases.observe(m.config.name, variant, out.queue_s, out.compute_s)
        m.stats.success(latency, out.queue_s, out.compute_s, rows, time.time())
        outputs = to_wire(m, out.outputs)
        if req.outputs is not None:
            outputs = {o.name: outputs[o.name] for o in req.outputs}
        return InferResponse(
            model=m.config.name,
            version=req.version or (variant if m.triton is not None else m.config.versions[-1]),
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
