"""swayam's between-rounds up-check: fake clock, hand-made snapshots, no sleep."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.queueing import capacity_rps, replicas_needed
from autoscaler.registry import make_autoscaler
from autoscaler.swayam import up_trigger_rps
from autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
from batching.profile import Curve

SVC = ServiceModel(Curve((1, 8, 32), (0.010, 0.020, 0.050), (0.012, 0.024, 0.060)), slo_s=0.2, max_batch_size=32)
KW = dict(startup_s=10, interval_s=10, keep_alive_s=60, hold_quantile=0, season_periods_s=())


def snap(target, rate, t, span, gateways=2):
    wins = tuple(RateWindow(f"gw{g}", t - span, t, rate * span / gateways, 1 / gateways) for g in range(gateways))
    return ScalingSnapshot("m", target, target, SVC, 0.0, wins, 1, 100)


@settings(max_examples=80, deadline=None)
@given(st.floats(min_value=0.0, max_value=5000.0), st.floats(min_value=0.0, max_value=5.0),
       st.floats(min_value=0.5, max_value=30.0))
def test_trigger_is_where_the_noise_guard_is_crossed(cap, z, w):
    r = up_trigger_rps(cap, z, w)
    assert r >= cap * (1 - 1e-12)
    assert r - z * math.sqrt(r / w) == pytest.approx(cap, abs=1e-6 * max(cap, 1.0))


def test_up_check_is_off_by_default_and_rounds_say_no_recheck():
    a = make_autoscaler("swayam", **KW)
    d, s = a.decide(snap(2, 100.0, 10.0, 10.0), a.initial_state(), 10.0)
    assert d.recheck_above_rps == math.inf
    d2, s2 = a.check_up(snap(d.target_replicas, 10_000.0, 12.0, 2.0), s, 12.0)
    assert d2.target_replicas == d.target_replicas and s2 is s
    for name in ("ray-default", "kpa"):  # the baselines have no up-check and never ask for one
        b = make_autoscaler(name)
        db, _ = b.decide(snap(2, 100.0, 10.0, 10.0), b.initial_state(), 10.0)
        assert db.recheck_above_rps == math.inf
        assert b.check_up(snap(2, 10_000.0, 12.0, 2.0), b.initial_state(), 12.0)[0].target_replicas == 2


def test_up_check_scales_up_between_rounds_only_above_its_trigger():
    a = make_autoscaler("swayam", up_check_window_s=2.0, up_check_z=3.0, **KW)
    base = 0.8 * capacity_rps(SVC, 2)
    d, s = a.decide(snap(2, base, 10.0, 10.0), a.initial_state(), 10.0)
    n = d.target_replicas
    trig = d.recheck_above_rps
    assert trig == pytest.approx(up_trigger_rps(capacity_rps(SVC, n), 3.0, 2.0))
    assert d.recheck_window_s == 2.0
    # just below the trigger: nothing changes, the state is the same object (skipping the call is exact)
    d1, s1 = a.check_up(snap(n, 0.999 * trig, 12.0, 2.0), s, 12.0)
    assert d1.target_replicas == n and s1 is s and d1.recheck_above_rps == pytest.approx(trig)
    # a step to 3x the capacity of the target: up at once, to what the measured rate needs
    step = 3.0 * capacity_rps(SVC, n)
    d2, s2 = a.check_up(snap(n, step, 13.0, 2.0), s, 13.0)
    assert d2.reason == "fast-scale-up" and d2.target_replicas == replicas_needed(SVC, d2.planned_rps)
    assert d2.target_replicas > n and d2.recheck_above_rps > trig
    assert s2.needs[-1] == (13.0, d2.target_replicas) and s2.history == s.history  # the round's history is untouched
    # the up-check never scales in
    d3, s3 = a.check_up(snap(d2.target_replicas, 1.0, 14.0, 2.0), s2, 14.0)
    assert d3.target_replicas == d2.target_replicas and s3 is s2
    # the next round sees the step in its own window and the keep-alive holds the fast need
    d4, _ = a.decide(snap(d2.target_replicas, base, 20.0, 10.0), s2, 20.0)
    assert d4.target_replicas >= d2.target_replicas


def test_up_check_noise_guard_ignores_a_noisy_short_window():
    a = make_autoscaler("swayam", up_check_window_s=2.0, up_check_z=3.0, **KW)
    cap = capacity_rps(SVC, 3)
    d, s = a.decide(snap(3, 0.9 * cap, 10.0, 10.0), a.initial_state(), 10.0)
    # 2 % over the capacity over 2 s is within 3 standard errors: no change
    d1, s1 = a.check_up(snap(d.target_replicas, 1.02 * cap, 12.0, 2.0), s, 12.0)
    assert d1.target_replicas == d.target_replicas and s1 is s
