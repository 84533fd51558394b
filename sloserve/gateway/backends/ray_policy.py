"""Plug ``swayam`` into Ray Serve 2.60's custom autoscaling policy API (a thin adapter).

Ray calls ``policy(ctx: AutoscalingContext) -> (num_replicas, policy_state)`` on its controller
every control-loop tick; a *class* given as ``policy_function`` is instantiated once with
``policy_kwargs`` (JSON values). Use it as::

    from ray.serve.config import AutoscalingConfig, AutoscalingPolicy
    AutoscalingConfig(
        min_replicas=1, max_replicas=8,
        upscale_delay_s=0, downscale_delay_s=0,   # swayam has its own horizon and keep-alive
        policy=AutoscalingPolicy(policy_function="sloserve.gateway.backends.ray_policy:SwayamRayPolicy",
                                 policy_kwargs={"slo_ms": 50, "max_batch_size": 32,
                                                "batch_sizes": [1, 32], "p99_ms": [4, 30],
                                                "swayam": {"startup_s": 10}}))

**Where the rates come from.** Each gateway counts a model's arrivals and stamps
``(gateway_id, rate_rps, share, dispersion)`` on the batches it sends; each replica keeps the latest
stamp per gateway and returns them from ``record_autoscaling_stats()`` as custom metrics named
``sloserve_rate_rps/<gateway_id>``, ``sloserve_share/<gateway_id>`` and
``sloserve_dispersion/<gateway_id>`` (how clumped its arrivals are, ``sloserve.autoscaler.burst``). Ray aggregates them per
replica into ``ctx.aggregated_metrics``; this adapter takes, per gateway, the largest value over
replicas (every replica of the model sees the same stamp; a stale replica reports less), builds
one :class:`~sloserve.autoscaler.types.RateWindow` per gateway and calls the same pure
:func:`sloserve.autoscaler.swayam.decide` the simulator drives. Without custom metrics it falls back to
Little's law on Ray's own ``total_num_requests`` (rate ~= ongoing / mean latency).

The policy state lives in ``ctx.policy_state`` under ``"sloserve_swayam"`` as plain lists.

Its settings are :class:`~sloserve.autoscaler.swayam.SwayamConfig`'s, with the same defaults the simulator
measures (``swayam`` overrides them field by field): one source of defaults for the live autoscaler
and the simulator.
"""

from __future__ import annotations

from typing import Any

from sloserve.autoscaler.swayam import SwayamConfig, SwayamState, decide
from sloserve.autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
from sloserve.autoscaler.typesplit import DemandSplit, TypeOption
from sloserve.batching.profile import Curve

RATE_PREFIX = "sloserve_rate_rps/"
SHARE_PREFIX = "sloserve_share/"
DISPERSION_PREFIX = "sloserve_dispersion/"
STATE_KEY = "sloserve_swayam"


def windows_from_metrics(
    metrics: dict | None, now: float, interval_s: float, prefix: str = RATE_PREFIX
) -> tuple[RateWindow, ...]:
    """Gateway reports out of Ray's ``aggregated_metrics`` ({metric: {replica_id: value}})."""
    if not metrics:
        return ()
    out = []
    for name, per_replica in sorted(metrics.items()):
        if not name.startswith(prefix) or not per_replica:
            continue
        gw = name[len(prefix) :]
        rate = max(float(v) for v in per_replica.values())
        shares = metrics.get(SHARE_PREFIX + gw) or {}
        share = max((float(v) for v in shares.values()), default=0.0)
        disp = metrics.get(DISPERSION_PREFIX + gw) or {}
        dispersion = max((float(v) for v in disp.values()), default=1.0)
        out.append(RateWindow(gw, now - interval_s, now, rate * interval_s, share, dispersion))
    return tuple(out)


_PAIRS = ("season", "recent", "bursts")  # SwayamState's other (time_s, value) series


def state_to_json(s: SwayamState) -> dict[str, Any]:
    d: dict[str, Any] = {
        "history": [list(p) for p in s.history],
        "needs": [list(p) for p in s.needs],
        "gateways_seen": s.gateways_seen,
    }
    for name in _PAIRS:
        d[name] = [list(p) for p in getattr(s, name)]
    return d


def state_from_json(d: dict[str, Any] | None) -> SwayamState:
    if not d:
        return SwayamState()
    return SwayamState(
        tuple((float(t), float(r)) for t, r in d["history"]),
        tuple((float(t), int(n)) for t, n in d["needs"]),
        int(d.get("gateways_seen", 1)),
        season=tuple((float(t), float(v)) for t, v in d.get("season", ())),
        recent=tuple((float(t), int(v)) for t, v in d.get("recent", ())),
        bursts=tuple((float(t), float(v)) for t, v in d.get("bursts", ())),
    )


def split_from_kwargs(split: dict[str, Any], slo_s: float, max_batch_size: int, slo_percentile: float) -> DemandSplit:
    """The :class:`~sloserve.autoscaler.typesplit.DemandSplit` of ``SwayamRayPolicy``'s ``split`` kwargs."""
    options = []
    for t, d in split["types"].items():
        p99 = tuple(x / 1e3 for x in d["p99_ms"])  # on the p99 profile, as each deployment sizes itself
        svc = ServiceModel(Curve(tuple(d["batch_sizes"]), p99, p99), slo_s, max_batch_size, slo_percentile)
        options.append(
            TypeOption(t, svc, float(d["throughput_rps"]), float(d.get("cost", 1.0)), int(d["max_replicas"]))
        )
    return DemandSplit(tuple(options), str(split["own"]))


class SwayamRayPolicy:
    """A Ray Serve custom autoscaling policy (class form) wrapping :func:`sloserve.autoscaler.swayam.decide`.

    ``policy_kwargs``: ``slo_ms``, ``slo_percentile`` (0.99), ``max_batch_size``, the latency
    profile of one replica as ``batch_sizes`` + ``p99_ms`` (+ optional ``p50_ms``), and
    ``swayam`` (a dict of :class:`~sloserve.autoscaler.swayam.SwayamConfig` fields over its defaults).
    ``fallback_batch_sizes`` + ``fallback_p99_ms``: the profile of the cheaper variant the same
    replicas hold (``shared_replicas``), which swayam sizes its warm buffer with (``fallback_buffer``).
    ``split``: this deployment is one device type of a variant on several, whose stamps carry the
    model's whole demand: ``{"own": type, "types": {type: {batch_sizes, p99_ms, throughput_rps, cost,
    max_replicas}}}``; swayam sizes it for its part (``sloserve.autoscaler.typesplit``).
    """

    def __init__(
        self,
        slo_ms: float,
        batch_sizes: list[int],
        p99_ms: list[float],
        max_batch_size: int = 64,
        p50_ms: list[float] | None = None,
        slo_percentile: float = 0.99,
        swayam: dict[str, Any] | None = None,
        fallback_batch_sizes: list[int] | None = None,
        fallback_p99_ms: list[float] | None = None,
        split: dict[str, Any] | None = None,
    ):
        curve = Curve(tuple(batch_sizes), tuple(x / 1e3 for x in (p50_ms or p99_ms)), tuple(x / 1e3 for x in p99_ms))
        fallback = None
        if fallback_batch_sizes and fallback_p99_ms:  # the replicas also hold a cheaper variant (shared_replicas)
            fb = Curve(
                tuple(fallback_batch_sizes),
                tuple(x / 1e3 for x in fallback_p99_ms),
                tuple(x / 1e3 for x in fallback_p99_ms),
            )
            fallback = ServiceModel(fb, slo_ms / 1e3, max_batch_size, slo_percentile)
        self.service = ServiceModel(curve, slo_ms / 1e3, max_batch_size, slo_percentile, fallback)
        self.config = SwayamConfig.model_validate(swayam or {})
        self.split = split_from_kwargs(split, slo_ms / 1e3, max_batch_size, slo_percentile) if split else None

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        now = float(ctx.current_time)
        policy_state = dict(ctx.policy_state or {})
        windows = windows_from_metrics(ctx.aggregated_metrics, now, self.config.interval_s)
        if not windows:  # no gateway stamps: Little's law on Ray's ongoing-request count
            mean_latency_s = self.service.curve.at(1, "p50") + self.service.slo_s / 2
            rate = float(ctx.total_num_requests) / mean_latency_s
            windows = (
                RateWindow("ray-ongoing", now - self.config.interval_s, now, rate * self.config.interval_s, 1.0),
            )
        snap = ScalingSnapshot(
            model=ctx.deployment_name,
            target_replicas=int(ctx.target_num_replicas),
            ready_replicas=int(ctx.current_num_replicas),
            service=self.service,
            ongoing_requests=float(ctx.total_num_requests),
            windows=windows,
            min_replicas=int(ctx.capacity_adjusted_min_replicas),
            max_replicas=int(ctx.capacity_adjusted_max_replicas),
            split=self.split,
        )
        decision, state = decide(snap, self.config, state_from_json(policy_state.get(STATE_KEY)), now)
        policy_state[STATE_KEY] = state_to_json(state)
        policy_state["sloserve_reason"] = decision.reason
        return decision.target_replicas, policy_state
