"""One served model as the data plane holds it: its resolved config (repository + the operator's
overrides), its batching policy and batcher, and its variant order."""

from __future__ import annotations

import functools
from typing import Any

from sloserve.batching.batcher import Batcher
from sloserve.batching.clock import Clock
from sloserve.batching.options import variant_of
from sloserve.batching.policies.slo_settings import SLOSettings
from sloserve.batching.policy import POLICIES, make_policy, policy_settings
from sloserve.batching.profile import ProfileTable
from sloserve.gateway import tracing
from sloserve.gateway.backends.base import Backend, ModelLoadError
from sloserve.gateway.config import Settings
from sloserve.gateway.metrics import Metrics
from sloserve.gateway.modelinfo import ModelStats, triton_config
from sloserve.gateway.queuepolicy import QueueRules
from sloserve.models.repository import LoadedModel, ModelConfig


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
        self.triton = loaded.triton  # a Triton model's config.pbtxt settings (its versions are its variants)
        self.queue = QueueRules.of(loaded.config.dynamic_batching)  # priority levels and queue timeouts (Triton's)
        self.inputs = {t.name: t for t in cfg.inputs}
        self.input_names = tuple(self.inputs)  # what a transport checks before it decodes a request
        self.outputs = {t.name: t for t in cfg.outputs}
        # A Triton tensor whose config 'reshape' differs from its 'dims': clients see the dims (metadata,
        # requests, answers), the model takes the reshape (the tensor's shape in cfg).
        reshape = loaded.triton.reshape if loaded.triton is not None else {}
        self.wire_inputs = {n: tuple(d) for n, d in reshape.items() if n in self.inputs}
        self.wire_outputs = {n: tuple(d) for n, d in reshape.items() if n in self.outputs}
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
        self.batcher.tracer = tracing.batch_tracer()  # None while tracing is off (sloserve/gateway/tracing.py)
        metrics.phases.watch_queue(cfg.name, lambda: self.batcher.queued_requests)
        for v in self.keys:  # read at scrape time only
            metrics.batch_slots.labels(cfg.name, v).set_function(functools.partial(backend.slots, cfg.name, v))

    def triton_config(self) -> dict[str, Any]:
        """The model's config in Triton's ``ModelConfig`` shape (sloserve/gateway/modelinfo.py)."""
        return triton_config(self.config, self.policy.name, self.triton)

    def metadata(self) -> dict[str, Any]:
        c = self.config
        return {
            "name": c.name,
            "versions": list(c.versions),
            "platform": c.platform,
            "inputs": [
                {"name": t.name, "datatype": t.datatype, "shape": [-1, *self.wire_inputs.get(t.name, t.shape)]}
                for t in c.inputs
            ],
            "outputs": [
                {"name": t.name, "datatype": t.datatype, "shape": [-1, *self.wire_outputs.get(t.name, t.shape)]}
                for t in c.outputs
            ],
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
