"""A variant's demand split over its device types: the pure split, and swayam sizing each type's
deployment on its part, on a fake clock (an explicit ``now`` per round)."""

import pytest

from sloserve.autoscaler.swayam import SwayamConfig, SwayamState, decide
from sloserve.autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
from sloserve.autoscaler.typesplit import DemandSplit, TypeOption, rank_types, split_demand, type_options
from sloserve.batching.profile import Curve

# the gpu is 4x faster per replica and costs 2x: the most requests/s per unit of cost
GPU = ServiceModel(Curve((1, 32), (0.001, 0.004), (0.001, 0.004)), slo_s=0.05, max_batch_size=32)
CPU = ServiceModel(Curve((1, 32), (0.004, 0.016), (0.004, 0.016)), slo_s=0.05, max_batch_size=32)
OPTS = (
    TypeOption("cpu", CPU, 2000.0, cost=1.0, max_replicas=20),
    TypeOption("gpu", GPU, 8000.0, cost=2.0, max_replicas=3),
)
CFG = SwayamConfig(
    predictor="last", noise_z=0.0, burst_z=0.0, season_periods_s=(), hold_quantile=0.0, keep_alive_s=30.0
)


def test_types_rank_by_throughput_per_cost_and_fill_up_to_their_bound():
    gpu, cpu = OPTS[1], OPTS[0]
    assert [o.device_type for o in rank_types(OPTS)] == ["gpu", "cpu"]
    assert split_demand(100.0, OPTS) == {"cpu": 0.0, "gpu": 100.0}
    s = split_demand(gpu.bound_rps + 500.0, OPTS)
    assert s["gpu"] == pytest.approx(gpu.bound_rps) and s["cpu"] == pytest.approx(500.0)
    over = split_demand(gpu.bound_rps + cpu.bound_rps + 10.0, OPTS)  # past every bound: the last type's
    assert over["cpu"] == pytest.approx(cpu.bound_rps + 10.0)
    cheap_cpu = type_options({"cpu": CPU, "gpu": GPU}, {"cpu": 2000.0, "gpu": 8000.0}, {"gpu": 8.0})
    assert [o.device_type for o in rank_types(cheap_cpu)] == ["cpu", "gpu"]  # a dearer gpu ranks last


def _round(states, targets, rate, now):
    out = {}
    for o in OPTS:
        snap = ScalingSnapshot(
            f"m@{o.device_type}",
            targets[o.device_type],
            targets[o.device_type],
            o.service,
            windows=(RateWindow("g0", now - 10.0, now, rate * 10.0, 1.0),),
            min_replicas=0,
            max_replicas=o.max_replicas,
            split=DemandSplit(OPTS, o.device_type),
        )
        d, states[o.device_type] = decide(snap, CFG, states[o.device_type], now)
        out[o.device_type] = d.target_replicas
    targets.update(out)
    return dict(out)


def test_a_burst_fills_the_best_type_to_its_bound_before_the_next_scales_and_scale_in_releases_the_dearer_first():
    gpu_bound = OPTS[1].bound_rps
    states = {o.device_type: SwayamState() for o in OPTS}
    targets = {"cpu": 0, "gpu": 0}
    seen = []
    now = 0.0
    rates = [0.3 * gpu_bound] * 3 + [0.9 * gpu_bound] * 3 + [2.0 * gpu_bound] * 3 + [0.3 * gpu_bound] * 12
    for r in rates:
        now += 10.0
        seen.append((r, _round(states, targets, r, now)))
    for _, t in seen[:6]:  # within the gpu's bound: the cpu does not scale
        assert t["cpu"] == 0 and t["gpu"] >= 1
    assert seen[6][1]["gpu"] == 3 and seen[6][1]["cpu"] >= 1  # the gpu at its max before the cpu grows
    peak_cpu = seen[8][1]["cpu"]
    assert peak_cpu > 0
    # the burst ends: both hold through the keep-alive; the cpu's part is zero, so it goes first
    after = [t for _, t in seen[9:]]
    cpu_gone = next(i for i, t in enumerate(after) if t["cpu"] == 0)
    gpu_down = next(i for i, t in enumerate(after) if t["gpu"] < 3)
    assert cpu_gone <= gpu_down
    assert after[-1]["cpu"] == 0 and 1 <= after[-1]["gpu"] < 3


def test_without_a_split_each_type_would_size_for_the_whole_demand():
    snap = ScalingSnapshot(
        "m@cpu", 0, 0, CPU, windows=(RateWindow("g0", 0.0, 10.0, 1000.0 * 10, 1.0),), min_replicas=0, max_replicas=20
    )
    whole, _ = decide(snap, CFG, SwayamState(), 10.0)
    from dataclasses import replace

    part, _ = decide(replace(snap, split=DemandSplit(OPTS, "cpu")), CFG, SwayamState(), 10.0)
    assert whole.target_replicas >= 1 and part.target_replicas == 0 and part.planned_rps == 0.0
