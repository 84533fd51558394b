"""The four autoscalers, driven with hand-made snapshots and explicit time (no clock, no sleep)."""

import pytest
from hypothesis import given, settings, strategies as st

from autoscaler.predict import PREDICTORS
from autoscaler.queueing import capacity_rps, late_fraction, replicas_needed, tail_latency_s
from autoscaler.registry import AUTOSCALERS, make_autoscaler
from autoscaler.swayam import aggregate_rate
from autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
from batching.profile import Curve

SVC = ServiceModel(Curve((1, 8, 32), (0.010, 0.020, 0.050), (0.012, 0.024, 0.060)), slo_s=0.2, max_batch_size=32)


def snap(target=1, ready=None, rate=None, ongoing=0.0, future=None, gateways=2, t=0.0, span=10.0):
    wins = ()
    if rate is not None:
        wins = tuple(RateWindow(f"gw{g}", t - span, t, rate * span / gateways, 1 / gateways) for g in range(gateways))
    return ScalingSnapshot("m", target, target if ready is None else ready, SVC, ongoing, wins, 1, 100, future)


def test_registry_names_and_errors():
    assert set(AUTOSCALERS) == {"swayam", "ray-default", "kpa", "oracle"}
    with pytest.raises(ValueError, match="known"):
        make_autoscaler("hpa")
    with pytest.raises(Exception):
        make_autoscaler("swayam", margin_frac=-1)


def test_queueing_monotone_and_consistent():
    caps = [capacity_rps(SVC, c) for c in range(1, 12)]
    assert all(b > a for a, b in zip(caps, caps[1:]))
    for c in (1, 3, 8):
        cap = capacity_rps(SVC, c)
        assert tail_latency_s(SVC, c, cap * 0.99) <= SVC.slo_s
        assert late_fraction(SVC, c, cap * 0.5) < 0.01 < late_fraction(SVC, c, cap * 1.3)
        assert replicas_needed(SVC, cap) == c


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0.1, max_value=5000))
def test_replicas_needed_is_the_fewest(rate):
    n = replicas_needed(SVC, rate)
    assert capacity_rps(SVC, n) >= rate
    assert n == 1 or capacity_rps(SVC, n - 1) < rate


def test_partial_views_aggregate():
    w = (RateWindow("a", 0, 10, 300, 0.75), RateWindow("b", 0, 10, 100, 0.25))
    assert aggregate_rate(w, 2) == pytest.approx(40.0)
    assert aggregate_rate(w[:1], 2) == pytest.approx(40.0)  # b missed a round: extrapolated
    assert aggregate_rate((RateWindow("a", 0, 10, 100), RateWindow("a", 10, 20, 100)), 1) == pytest.approx(10.0)
    assert aggregate_rate((), 2) is None


def test_predictors_follow_a_ramp():
    ramp = tuple((t, 10.0 + t) for t in range(0, 60, 10))
    assert PREDICTORS["linreg"](ramp, 20) == pytest.approx(80.0)
    assert PREDICTORS["holt"](ramp, 20) > PREDICTORS["ewma"](ramp, 20)
    assert PREDICTORS["last"](ramp, 20) == 60.0


def test_swayam_scales_ahead_and_keeps_alive():
    a = make_autoscaler("swayam", startup_s=10, interval_s=10, keep_alive_s=60)
    s = a.initial_state()
    d, s = a.decide(snap(rate=None), s, 0.0)
    assert d.reason == "no-data" and d.target_replicas == 1
    targets = []
    for k in range(1, 7):  # a ramp: the prediction runs ahead of the measured rate
        d, s = a.decide(snap(target=d.target_replicas, rate=100.0 * k, t=10.0 * k), s, 10.0 * k)
        targets.append(d.target_replicas)
    assert targets == sorted(targets) and targets[-1] >= replicas_needed(SVC, 600.0)
    peak = targets[-1]
    for k in range(7, 12):  # load falls: hold for the keep-alive (60 s after the last high need)
        d, s = a.decide(snap(target=d.target_replicas, rate=10.0, t=10.0 * k), s, 10.0 * k)
        assert d.target_replicas == peak
    for k in range(13, 20):
        d, s = a.decide(snap(target=d.target_replicas, rate=10.0, t=10.0 * k), s, 10.0 * k)
    assert d.target_replicas == 1


def test_ray_default_delays():
    a = make_autoscaler("ray-default", target_ongoing_requests=10)
    s = a.initial_state()
    d, s = a.decide(snap(target=1, ongoing=50.0), s, 0.0)
    assert d.target_replicas == 1 and d.reason == "upscale-delay"
    for t in range(1, 30):
        d, s = a.decide(snap(target=1, ongoing=50.0), s, float(t))
        assert d.target_replicas == 1
    d, s = a.decide(snap(target=1, ongoing=50.0), s, 30.0)
    assert d.target_replicas == 5
    for t in range(31, 700, 10):
        d, s = a.decide(snap(target=d.target_replicas, ongoing=0.0), s, float(t))
        if t < 31 + 600:  # the down wish starts once the look-back forgets the load; then 600 s
            assert d.target_replicas == 5, t
    assert d.target_replicas == 1


def test_kpa_panics_and_holds():
    a = make_autoscaler("kpa", target_concurrency=10, target_utilization=1.0)
    s = a.initial_state()
    for t in range(0, 60, 2):
        d, s = a.decide(snap(target=1, ready=1, ongoing=5.0), s, float(t))
    assert d.target_replicas == 1 and d.reason == "stable"
    d, s = a.decide(snap(target=1, ready=1, ongoing=200.0), s, 60.0)
    assert d.reason == "panic" and d.target_replicas >= 2
    high = d.target_replicas
    d, s = a.decide(snap(target=high, ready=high, ongoing=5.0), s, 62.0)
    assert d.reason == "panic" and d.target_replicas == high  # never down in panic
    for t in range(64, 200, 2):
        d, s = a.decide(snap(target=d.target_replicas, ready=d.target_replicas, ongoing=5.0), s, float(t))
    assert d.reason == "stable" and d.target_replicas == 1


def test_oracle_needs_the_future():
    a = make_autoscaler("oracle")
    with pytest.raises(ValueError):
        a.decide(snap(), a.initial_state(), 0.0)
    d, _ = a.decide(snap(future=capacity_rps(SVC, 4)), a.initial_state(), 0.0)
    assert d.target_replicas == 4
