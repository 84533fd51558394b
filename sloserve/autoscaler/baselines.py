"""Baselines with the ``swayam`` signature: ``ray-default``, ``kpa`` and the clairvoyant ``oracle``.

* ``ray-default`` -- Ray Serve 2.60's ``replica_queue_length_autoscaling_policy`` with its
  ``_apply_autoscaling_config`` wrapper: desired = ceil(mean ongoing requests over
  ``look_back_period_s`` / ``target_ongoing_requests``), applied only after the wish has held for
  ``upscale_delay_s`` (30 s) up or ``downscale_delay_s`` (600 s) down; 0 -> 1 at once.
* ``kpa`` -- Knative's KPA (``pkg/autoscaler/scaling/autoscaler.go``): desired pods from the mean
  concurrency over a 60 s stable window and a 6 s panic window; panic mode when the panic wish is
  >= 200% of the ready pods, holding the maximum until 60 s without panic; rate limits on up/down.
* ``oracle`` -- knows the true peak rate over the coming start-up horizon (the driver fills in
  ``ScalingSnapshot.future_peak_rps``) and runs exactly the replicas the queueing model needs for
  it, scaling in at once: a clairvoyant provisioner, no margin, no keep-alive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from sloserve.autoscaler.queueing import replicas_needed
from sloserve.autoscaler.types import ScaleDecision, ScalingSnapshot, clamp

_EPS = 1e-6


def _window_mean(samples: tuple[tuple[float, float], ...], since: float) -> float:
    vals = [v for t, v in samples if t > since]
    return sum(vals) / len(vals) if vals else 0.0


# ------------------------------------------------------------------ ray-default


class RayDefaultConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target_ongoing_requests: float = Field(default=2.0, gt=0, description="Ongoing requests per replica to aim at.")
    look_back_period_s: float = Field(default=30.0, gt=0, description="Window the ongoing count is averaged over.")
    upscale_delay_s: float = Field(default=30.0, ge=0, description="A scale-up wish must hold this long.")
    downscale_delay_s: float = Field(default=600.0, ge=0, description="A scale-down wish must hold this long.")


@dataclass(frozen=True, slots=True)
class RayDefaultState:
    samples: tuple[tuple[float, float], ...] = ()  # (time_s, ongoing requests)
    wish_since_s: float | None = None  # when the current up/down wish started
    wish_up: bool = True


def decide_ray_default(
    snap: ScalingSnapshot, config: RayDefaultConfig, state: RayDefaultState, now: float
) -> tuple[ScaleDecision, RayDefaultState]:
    since = now - config.look_back_period_s
    samples = tuple(p for p in state.samples if p[0] > since) + ((now, snap.ongoing_requests),)
    ongoing = _window_mean(samples, since)
    cur = snap.target_replicas
    if snap.ready_replicas == 0 and cur == 0:  # cold start: 0 -> 1 at once when anything waits
        target = clamp(1 if ongoing > 0 else 0, snap)
        return ScaleDecision(target, "cold-start" if target else "idle"), RayDefaultState(samples)
    running = max(snap.ready_replicas, 1)
    desired = math.ceil(running * ongoing / (config.target_ongoing_requests * running) - 1e-9)
    desired = clamp(desired, snap)
    if desired > cur:
        since_s = state.wish_since_s if (state.wish_since_s is not None and state.wish_up) else now
        if now - since_s + _EPS >= config.upscale_delay_s:
            return ScaleDecision(desired, "scale-up"), RayDefaultState(samples)
        return ScaleDecision(cur, "upscale-delay"), RayDefaultState(samples, since_s, True)
    if desired < cur:
        desired = max(desired, 1) if cur > 1 else desired
        since_s = state.wish_since_s if (state.wish_since_s is not None and not state.wish_up) else now
        if now - since_s + _EPS >= config.downscale_delay_s:
            return ScaleDecision(desired, "scale-down"), RayDefaultState(samples)
        return ScaleDecision(cur, "downscale-delay"), RayDefaultState(samples, since_s, False)
    return ScaleDecision(cur, "steady"), RayDefaultState(samples)


# ------------------------------------------------------------------ kpa


class KpaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    target_concurrency: float = Field(default=100.0, gt=0, description="container-concurrency-target-default.")
    target_utilization: float = Field(default=0.7, gt=0, le=1, description="Share of the target to aim at.")
    stable_window_s: float = Field(default=60.0, gt=0, description="Stable window.")
    panic_window_s: float = Field(default=6.0, gt=0, description="Panic window (10% of the stable one).")
    panic_threshold: float = Field(default=2.0, gt=1, description="Panic when the panic wish >= this x ready pods.")
    max_scale_up_rate: float = Field(default=1000.0, gt=1, description="Pods may grow at most this factor a step.")
    max_scale_down_rate: float = Field(default=2.0, gt=1, description="Pods may shrink at most this factor a step.")


@dataclass(frozen=True, slots=True)
class KpaState:
    samples: tuple[tuple[float, float], ...] = ()  # (time_s, concurrency)
    panic_since_s: float | None = None
    max_panic_pods: int = 0


def decide_kpa(snap: ScalingSnapshot, config: KpaConfig, state: KpaState, now: float) -> tuple[ScaleDecision, KpaState]:
    since = now - config.stable_window_s
    samples = tuple(p for p in state.samples if p[0] > since) + ((now, snap.ongoing_requests),)
    per_pod = config.target_concurrency * config.target_utilization
    stable = math.ceil(_window_mean(samples, since) / per_pod - 1e-9)
    panic = math.ceil(_window_mean(samples, now - config.panic_window_s) / per_pod - 1e-9)
    ready = max(snap.ready_replicas, 1)
    up_cap = math.ceil(config.max_scale_up_rate * ready)
    down_cap = math.floor(ready / config.max_scale_down_rate)
    stable = min(max(stable, down_cap), up_cap)
    panic = min(max(panic, down_cap), up_cap)
    over = panic / ready >= config.panic_threshold
    panic_since = state.panic_since_s
    if over:
        panic_since = now
    elif panic_since is not None and now > panic_since + config.stable_window_s:
        panic_since = None
    if panic_since is not None:
        desired = max(panic, state.max_panic_pods)
        return (ScaleDecision(clamp(desired, snap), "panic"), KpaState(samples, panic_since, desired))
    return ScaleDecision(clamp(stable, snap), "stable"), KpaState(samples, None, 0)


# ------------------------------------------------------------------ oracle


class OracleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    margin_frac: float = Field(default=0.0, ge=0, description="Head-room over the known future peak rate.")


@dataclass(frozen=True, slots=True)
class OracleState:
    pass


def decide_oracle(
    snap: ScalingSnapshot, config: OracleConfig, state: OracleState, now: float
) -> tuple[ScaleDecision, OracleState]:
    if snap.future_peak_rps is None:
        raise ValueError("oracle needs a clairvoyant driver: ScalingSnapshot.future_peak_rps is None")
    planned = snap.future_peak_rps * (1 + config.margin_frac)
    need = replicas_needed(snap.service, planned, snap.max_replicas)
    return ScaleDecision(clamp(need, snap), "clairvoyant", planned), state
