"""``swayam``: predictive, queueing-model sizing from the gateways' partial views (ours).

Per call, for one model:

1. **Aggregate** the gateways' reports: each gateway sees only its share of the traffic, so the
   total rate is ``sum(rate_g) / sum(share_g)`` over the gateways that reported (Swayam's
   frontends scale their local rate by their share; a missing report is extrapolated from the
   shares that did report; unknown shares count as ``1 / gateways seen``).
2. **Predict** the rate over the replica start-up horizon (``startup_s + interval_s``) with a
   windowed estimator with trend (``autoscaler.predict``; ``linreg`` by default).
3. **Size**: plan for ``predicted * (1 + margin_frac) + noise_z * sqrt(predicted / window)``
   and take the fewest replicas whose M/D/c tail latency meets the SLO percentile
   (``autoscaler.queueing.replicas_needed``).
4. **Scale in only after a keep-alive**: the target is the largest need of the last
   ``keep_alive_s``, so a replica idles that long before it goes and a warm buffer absorbs bursts.

>>> from batching.profile import Curve
>>> from autoscaler.types import ServiceModel, ScalingSnapshot, RateWindow
>>> svc = ServiceModel(Curve((1, 32), (0.01, 0.05), (0.01, 0.05)), slo_s=0.2, max_batch_size=32)
>>> snap = ScalingSnapshot("m", 1, 1, svc, windows=(RateWindow("g0", 0, 10, 500, 0.5),))
>>> d, s = decide(snap, SwayamConfig(), SwayamState(), now=10.0)
>>> d.target_replicas >= 1 and s.history[-1][1] == 100.0
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from autoscaler.predict import PREDICTORS
from autoscaler.queueing import replicas_needed
from autoscaler.types import RateWindow, ScaleDecision, ScalingSnapshot, clamp


class SwayamConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    predictor: str = Field(default="linreg", description="Rate predictor: last | ewma | holt | linreg.")
    window_s: float = Field(default=60.0, gt=0, description="History the predictor sees, seconds.")
    startup_s: float = Field(default=10.0, ge=0, description="Replica start-up (model load) time, seconds.")
    interval_s: float = Field(default=10.0, gt=0, description="Seconds between two decisions.")
    margin_frac: float = Field(default=0.1, ge=0, description="Relative head-room over the predicted rate.")
    noise_z: float = Field(default=2.0, ge=0, description="Poisson standard errors of head-room on the rate.")
    keep_alive_s: float = Field(default=120.0, ge=0, description="Idle time before a replica is scaled in.")

    def model_post_init(self, _ctx) -> None:
        if self.predictor not in PREDICTORS:
            raise ValueError(f"unknown predictor {self.predictor!r}; known: {sorted(PREDICTORS)}")


@dataclass(frozen=True, slots=True)
class SwayamState:
    history: tuple[tuple[float, float], ...] = ()  # (time_s, aggregate rate rps), oldest first
    needs: tuple[tuple[float, int], ...] = ()  # (time_s, need): decreasing needs of the last keep_alive_s
    gateways_seen: int = 1


def aggregate_rate(windows: tuple[RateWindow, ...], gateways_seen: int) -> float | None:
    """The model's total arrival rate estimated from partial views (None: no report).

    A gateway's reports are pooled (arrivals over time); each reporting gateway's share counts
    once, so a gateway that missed this round is extrapolated from the others' shares.
    """
    if not windows:
        return None
    default_share = 1.0 / max(gateways_seen, 1)
    names = {w.gateway for w in windows}
    if len(names) == len(windows):  # the usual case: one report per gateway
        rate = share = 0.0
        for w in windows:
            rate += w.arrivals / w.duration_s
            share += w.share if w.share > 0 else default_share
        return rate / max(share, 1e-9)
    per_gw: dict[str, list[float]] = {}
    for w in windows:
        acc = per_gw.setdefault(w.gateway, [0.0, 0.0, w.share])
        acc[0] += w.arrivals
        acc[1] += w.duration_s
    rate = share = 0.0
    for arrivals, duration, sh in per_gw.values():
        rate += arrivals / duration
        share += sh if sh > 0 else default_share
    return rate / max(share, 1e-9)


def _drop_before(points: tuple, t0: float) -> tuple:
    i = 0
    n = len(points)
    while i < n and points[i][0] <= t0:
        i += 1
    return points[i:] if i else points


def decide(snap: ScalingSnapshot, config: SwayamConfig, state: SwayamState, now: float
           ) -> tuple[ScaleDecision, SwayamState]:
    seen = state.gateways_seen
    if len(snap.windows) > seen:
        seen = max(seen, len({w.gateway for w in snap.windows}))
    rate = aggregate_rate(snap.windows, seen)
    history = state.history
    if rate is not None:
        history = _drop_before(history, now - config.window_s) + ((now, rate),)
    if not history:  # nothing measured yet: keep what runs
        return ScaleDecision(snap.target_replicas, "no-data"), SwayamState(history, state.needs, seen)
    horizon_s = config.startup_s + config.interval_s
    predicted = PREDICTORS[config.predictor](history, horizon_s)
    span = config.window_s if len(history) > 1 else config.interval_s
    planned = predicted * (1 + config.margin_frac) + config.noise_z * math.sqrt(predicted / span)
    need = replicas_needed(snap.service, planned, snap.max_replicas) if predicted > 0 else 0
    # needs of the last keep_alive_s as a monotonic queue: needs[0] is their maximum
    needs = _drop_before(state.needs, now - config.keep_alive_s)
    while needs and needs[-1][1] <= need:
        needs = needs[:-1]
    needs = needs + ((now, need),)
    target = clamp(needs[0][1], snap)
    if target > snap.target_replicas:
        reason = "scale-up"
    elif target < snap.target_replicas:
        reason = "scale-in-after-keep-alive"
    else:
        reason = "hold" if need < target else "steady"
    return ScaleDecision(target, reason, planned), SwayamState(history, needs, seen)
