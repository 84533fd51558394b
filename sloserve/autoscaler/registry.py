"""The autoscaler registry: one signature, ``decide(snapshot, config, state, now) -> (ScaleDecision, state)``.

>>> a = make_autoscaler("ray-default", target_ongoing_requests=4)
>>> a.name, a.config.target_ongoing_requests
('ray-default', 4.0)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from sloserve.autoscaler import baselines, swayam
from sloserve.autoscaler.types import ScaleDecision, ScalingSnapshot

DecideFn = Callable[[ScalingSnapshot, Any, Any, float], tuple[ScaleDecision, Any]]


@dataclass(frozen=True, slots=True)
class AutoscalerSpec:
    """A policy: ``decide`` runs every round."""

    name: str
    decide: DecideFn
    config_type: type[BaseModel]
    state_type: type


AUTOSCALERS: dict[str, AutoscalerSpec] = {}


def register_autoscaler(spec: AutoscalerSpec) -> AutoscalerSpec:
    AUTOSCALERS[spec.name] = spec
    return spec


@dataclass(frozen=True, slots=True)
class Autoscaler:
    """A registered policy with its resolved config: ``decide(snap, state, now)``."""

    name: str
    config: BaseModel
    spec: AutoscalerSpec

    def initial_state(self) -> Any:
        return self.spec.state_type()

    def decide(self, snap: ScalingSnapshot, state: Any, now: float) -> tuple[ScaleDecision, Any]:
        return self.spec.decide(snap, self.config, state, now)


def make_autoscaler(name: str, **config: Any) -> Autoscaler:
    """Build a registered autoscaler; ``config`` is validated by its pydantic config type."""
    try:
        spec = AUTOSCALERS[name]
    except KeyError:
        raise ValueError(f"unknown autoscaler {name!r}; known: {sorted(AUTOSCALERS)}") from None
    return Autoscaler(name, spec.config_type.model_validate(config), spec)


register_autoscaler(AutoscalerSpec("swayam", swayam.decide, swayam.SwayamConfig, swayam.SwayamState))
register_autoscaler(
    AutoscalerSpec("ray-default", baselines.decide_ray_default, baselines.RayDefaultConfig, baselines.RayDefaultState)
)
register_autoscaler(AutoscalerSpec("kpa", baselines.decide_kpa, baselines.KpaConfig, baselines.KpaState))
register_autoscaler(AutoscalerSpec("oracle", baselines.decide_oracle, baselines.OracleConfig, baselines.OracleState))
