"""How each model's replicas are laid out on Ray Serve, and this gateway's view of its demand.

A model's variants have a deployment each; with ``shared_replicas`` one deployment holds every
variant; on several device types (``models.<name>.device_types``) each serving option (variant,
device type) has its own. Each deployment asks Ray for a device as configured (``cpu``, ``T4``); profiles
name the CPU by its model (``sloserve.replica.runtime.device_type``). The rate meters hold what this
gateway measured of each model's arrivals and each variant's batches, for the stamps the replicas'
autoscaling reads.
"""

from __future__ import annotations

import time
from typing import Any

from sloserve.batching.options import OptionPlan, split_key, variant_of
from sloserve.batching.profile import ProfileTable
from sloserve.gateway.backends.options import model_plan
from sloserve.gateway.backends.ray_serve import swayam_autoscaling
from sloserve.gateway.config import Settings
from sloserve.gateway.rates import RateMeter
from sloserve.models.repository import LoadedModel, ModelRepository


class ModelLayout:
    """The served models, each one's deployments and devices, and its rate meters."""

    def __init__(self, repo: ModelRepository, settings: Settings):
        self.repo = repo
        self.settings = settings
        self.models: dict[str, LoadedModel] = {}  # what it serves; the repository API changes it
        # This gateway's view of each model's demand (best variant) and of each variant's load,
        # stamped on the batches for the replicas' autoscaling metrics.
        self.arrivals: dict[str, RateMeter] = {}
        self.served: dict[tuple[str, str], RateMeter] = {}
        self.best: dict[str, str] = {}
        self.top: dict[str, str] = {}  # a shared deployment's label: its replicas' default variant, the most accurate
        self.shared_models: set[str] = set()  # models whose replicas hold every variant (read on every batch)
        self.autoscaled: dict[str, bool] = {}
        # a model on several device types (models.<name>.device_types): its options, and the device
        # each option's deployment asks Ray for, as configured (cpu, T4, ...)
        self.plans: dict[str, OptionPlan] = {}
        self.key_device: dict[tuple[str, str], str] = {}
        for lm in repo.models.values():
            self.setup(lm)

    def setup(self, lm: LoadedModel) -> None:
        """The gateway's side of one model: its rate meters and how its replicas are laid out."""
        m, cfg, over = lm.config.name, lm.config, self.settings.models.get(lm.config.name)
        self.models[m] = lm
        self.arrivals[m] = RateMeter(time.monotonic)
        for v in cfg.variants:
            self.served[(m, v.name)] = RateMeter(time.monotonic)
        self.best[m] = cfg.best_variant
        self.plans.pop(m, None)
        devices = over.devices() if over is not None else []
        if len(devices) > 1:
            named = {self.profile_name(d): d for d in devices}
            slo_ms = over.slo_ms if over is not None and over.slo_ms else cfg.slo_ms
            cost = {self.profile_name(t): c for t, c in self.settings.device_cost.items()}
            plan = model_plan(ProfileTable.load(self.repo.root), cfg, list(named), slo_ms, cost)
            self.plans[m] = plan
            for key in plan.served:  # a dominated option too: it serves requests pinning its variant
                self.key_device[(m, key)] = named[split_key(key, "")[1]]
                self.served[(m, key)] = RateMeter(time.monotonic)
            self.best[m] = plan.keys[0]  # its variant's demand is the model's; the others' what they serve
        self.top[m] = cfg.variants_by_accuracy[0].name
        if len(cfg.variants) > 1 and over is not None and over.shared_replicas:
            self.shared_models.add(m)
        else:
            self.shared_models.discard(m)
        self.autoscaled[m] = bool(over and over.autoscaling)

    def forget(self, name: str, keys: list[tuple[str, str]]) -> LoadedModel | None:
        """Drop ``name`` and the rate meters of its deployed ``keys``; returns what it served."""
        for key in keys:
            self.served.pop(key, None)
        lm = self.models.pop(name, None)
        self.arrivals.pop(name, None)
        return lm

    def forget_plan(self, name: str) -> None:
        """Drop ``name``'s serving options and their devices (once its replicas are reported gone)."""
        self.plans.pop(name, None)
        for k in [k for k in self.key_device if k[0] == name]:
            del self.key_device[k]

    def device_of(self, model: str, key: str | None = None) -> str:
        """The device a deployment asks Ray for, as configured (``cpu``, ``T4``): the model's, or one
        option's (``key``) on a model with several."""
        if key is not None and (model, key) in self.key_device:
            return self.key_device[(model, key)]
        over = self.settings.models.get(model)
        if over is not None and over.device_types:
            return over.device_types[0]
        return over.device_type if over and over.device_type else "cpu"

    @staticmethod
    def profile_name(device: str) -> str:
        from sloserve.replica.runtime import device_type

        return device_type("cpu") if device.lower() == "cpu" else device.lower()

    def device_type_of(self, model: str) -> str:
        """The device type name profiles and replicas use (CPU model slug for cpu replicas); the
        fastest type of a model on several."""
        plan = self.plans.get(model)
        if plan is not None:
            return plan.device_types()[0]
        return self.profile_name(self.device_of(model))

    def shared(self, model: str) -> bool:
        """Whether ``model``'s replicas hold all its variants (``shared_replicas``: one deployment)."""
        return model in self.shared_models

    def note_arrival(self, model: str, rows: int) -> None:
        meter = self.arrivals.get(model)
        if meter is not None:
            meter.add(rows)

    def demand(self, model: str, variant: str) -> RateMeter:
        """The meter a deployment's stamps carry: the model's arrivals for its best variant, else what
        the variant served."""
        # a shared deployment serves the whole model: its demand is the model's arrivals, whatever variant runs
        # (every type of the most accurate variant of a model on several: the model's demand, which
        # each type's policy splits with the others, sloserve.autoscaler.typesplit)
        best = variant == self.best[model] or self.shared(model)
        if not best and model in self.plans:
            best = variant_of(variant) == variant_of(self.best[model])
        return self.arrivals[model] if best else self.served[(model, variant)]

    def autoscaling_config(self, model: str, variant: str) -> dict[str, Any] | None:
        """Ray Serve autoscaling config running the swayam policy on this variant's profile."""
        over = self.settings.models.get(model)
        if over is None or over.autoscaling is None:
            return None
        table = ProfileTable.load(self.repo.root)
        cfg = self.models[model].config
        v, dev = split_key(variant, self.device_type_of(model))  # an option: its own pair's profile
        cost = {self.profile_name(t): c for t, c in self.settings.device_cost.items()}
        return swayam_autoscaling(over, cfg, table, dev, v, self.shared(model), self._split_types(model, variant), cost)

    def _split_types(self, model: str, key: str) -> list[str] | None:
        """The device types sharing the model's demand when ``key`` is an option of its most accurate
        variant (``sloserve.autoscaler.typesplit``); None otherwise (a cheaper option sizes on what it served)."""
        plan = self.plans.get(model)
        if plan is None or variant_of(key) != variant_of(self.best[model]):
            return None
        return [split_key(k, "")[1] for k in plan.of_variant(variant_of(key), pinned=True)]

    def replicas_of(self, model: str) -> int:
        """Replicas per variant: the operator's ``models.<m>.instances``, else a Triton model's
        ``instance_group`` counts, else the server's ``instances``."""
        over = self.settings.models.get(model)
        if over is not None and over.instances:
            return over.instances
        lm = self.models.get(model)
        triton = lm.triton if lm is not None else None
        return (triton.replicas() if triton is not None else None) or self.settings.instances

    def fault_delay_s(self, model: str) -> float:
        over = self.settings.models.get(model)
        return over.fault_delay_ms / 1e3 if over else 0.0

    def deployed_keys(self, lm: LoadedModel) -> list[str]:
        """What gets a deployment of its own: a shared model one (its replicas holding every variant,
        best first, the default), a model on several device types one per option (variant, device
        type), else one per variant."""
        plan = self.plans.get(lm.config.name)
        ranked = [v.name for v in lm.config.variants_by_accuracy]
        if plan is not None:
            return list(plan.served)
        return ranked[:1] if self.shared(lm.config.name) else [v.name for v in lm.config.variants]
