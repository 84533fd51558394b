"""Snapshots in, decisions out: what an autoscaling policy sees and returns, for one model.

A policy is ``decide(snapshot, config, state, now) -> (ScaleDecision, state)``; the snapshot
is everything the driver (the simulator, or Ray Serve's controller through
``sloserve.gateway.backends.ray_policy``) measured since the previous call. ``now`` is seconds on the driver's
clock; policies never read a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sloserve.batching.profile import Curve


@dataclass(frozen=True, slots=True)
class RateWindow:
    """One gateway's partial view: ``arrivals`` requests for the model in ``[start_s, end_s)``.

    ``share`` is the fraction of the model's traffic the load balancer sends to this gateway
    (1/n for n gateways behind a round-robin balancer); 0 means unknown (treated as 1/n_reports).
    ``dispersion`` is the index of dispersion of the gateway's arrival counts per ``bin_s`` in the
    window (``sloserve.autoscaler.burst``): 1 for Poisson arrivals (or not measured), more when they clump.
    """

    gateway: str
    start_s: float
    end_s: float
    arrivals: float
    share: float = 0.0
    dispersion: float = 1.0
    bin_s: float = 1.0

    @property
    def duration_s(self) -> float:
        return max(self.end_s - self.start_s, 1e-9)


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """How one replica of the model serves batches: its latency curve and SLO.

    ``curve`` gives batch latency (p50/p99, seconds) against batch rows on the replica's device
    type; ``max_batch_size`` caps the batch; ``slo_s`` is the per-request latency budget and
    ``slo_percentile`` the share of requests that must meet it (the SLA, e.g. 0.99).
    """

    curve: Curve
    slo_s: float
    max_batch_size: int = 64
    slo_percentile: float = 0.99
    fallback: ServiceModel | None = None


class DemandPart(Protocol):
    """One deployment's part of its variant's demand (``sloserve.autoscaler.typesplit.DemandSplit``)."""

    def part(self, demand_rps: float) -> float: ...


@dataclass(frozen=True, slots=True)
class ScalingSnapshot:
    """One model's load and replicas at one instant.

    ``target_replicas``: the count last decided (starting + ready); ``ready_replicas``: those
    serving now. ``ongoing_requests``: queued + running requests over all replicas, averaged by the
    driver over the time since the previous call (what Ray Serve's default policy reads).
    ``windows``: gateway reports since the previous call (what ``swayam`` reads).
    ``future_peak_rps``: the true peak rate over the coming start-up horizon; only a clairvoyant
    driver fills it in and only ``oracle`` reads it. ``split``: this deployment is one device type
    of a variant on several (``sloserve.autoscaler.typesplit``); the windows carry the variant's whole demand
    and ``swayam`` sizes for this type's part of the rate it plans for.
    """

    model: str
    target_replicas: int
    ready_replicas: int
    service: ServiceModel
    ongoing_requests: float = 0.0
    windows: tuple[RateWindow, ...] = ()
    min_replicas: int = 0
    max_replicas: int = 1_000_000
    future_peak_rps: float | None = None
    split: DemandPart | None = None


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """Run ``target_replicas`` replicas; ``reason`` says why, ``planned_rps`` the rate sized for."""

    target_replicas: int
    reason: str
    planned_rps: float = 0.0


def clamp(n: int, snap: ScalingSnapshot) -> int:
    return max(snap.min_replicas, min(snap.max_replicas, n))
