"""The autoscaling round both simulator modes share: snapshots in, placement-granted targets out."""

from __future__ import annotations

from dataclasses import dataclass

from sloserve.autoscaler.registry import Autoscaler
from sloserve.autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
from sloserve.autoscaler.typesplit import DemandSplit
from sloserve.sim.arrivals import Arrivals
from sloserve.sim.placement import PlacementHook


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One simulated model: its arrivals, its replicas' service model and bounds."""

    name: str
    arrivals: Arrivals
    service: ServiceModel
    device_type: str = "a100"
    min_replicas: int = 1
    max_replicas: int = 10_000
    initial_replicas: int = 1
    autoscaler_kwargs: dict | None = None  # per policy name: this model's config overrides
    # one device type of a model on several (sloserve/sim/typesize.py): its part of the model's demand
    split: DemandSplit | None = None
    group: str = ""  # the model this lane belongs to ("": a model of its own)


@dataclass(frozen=True, slots=True)
class Observation:
    """What the driver measured for one model since the previous round."""

    target: int
    ready: int
    ongoing: float
    windows: tuple[RateWindow, ...]
    future_peak_rps: float


class Controller:
    """Runs one autoscaler over every model each round, then asks placement what it may hold."""

    def __init__(self, autoscaler: Autoscaler, specs: list[ModelSpec], placement: PlacementHook):
        self.autoscaler = autoscaler
        self.specs = specs
        self.placement = placement
        self.states = [autoscaler.initial_state() for _ in specs]
        self.decide = autoscaler.spec.decide
        base = autoscaler.config.model_dump()
        self.configs = [
            autoscaler.config
            if not (kw := (s.autoscaler_kwargs or {}).get(autoscaler.name))
            else autoscaler.spec.config_type.model_validate({**base, **kw})
            for s in specs
        ]

    def round(self, now: float, obs: list[Observation]) -> list[int]:
        snaps = [
            ScalingSnapshot(
                spec.name,
                o.target,
                o.ready,
                spec.service,
                o.ongoing,
                o.windows,
                spec.min_replicas,
                spec.max_replicas,
                o.future_peak_rps,
                spec.split,
            )
            for spec, o in zip(self.specs, obs, strict=True)
        ]
        return self.round_snapshots(now, snaps)

    def round_snapshots(self, now: float, snaps: list[ScalingSnapshot]) -> list[int]:
        """One round from ready-made snapshots (the fluid driver builds them directly)."""
        decide, configs, states = self.decide, self.configs, self.states
        wants: dict[str, int] = {}
        holding: dict[str, int] = {}
        for i, snap in enumerate(snaps):
            decision, states[i] = decide(snap, configs[i], states[i], now)
            wants[snap.model] = decision.target_replicas
            holding[snap.model] = snap.target_replicas
        grant = self.placement.allocate(wants, holding, now)
        return [grant[s.name] for s in self.specs]
