"""The four autoscalers, driven with hand-made snapshots and explicit time (no clock, no sleep)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sloserve.autoscaler.predict import PREDICTORS
from sloserve.autoscaler.queueing import (
    capacity_rps,
    late_fraction,
    replicas_needed,
    tail_latency_s,
)
from sloserve.autoscaler.registry import AUTOSCALERS, make_autoscaler
from sloserve.autoscaler.swayam import aggregate_rate
from sloserve.autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
from sloserve.batching.profile import Curve

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
    with pytest.raises(ValueError):
        make_autoscaler("swayam", margin_frac=-1)


def test_queueing_monotone_and_consistent():
    caps = [capacity_rps(SVC, c) for c in range(1, 12)]
    assert all(b > a for a, b in zip(caps, caps[1:], strict=False))
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
    a = make_autoscaler(
        "swayam", startup_s=10, interval_s=10, keep_alive_s=60, predictor="linreg", hold_quantile=0, season_periods_s=()
    )
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


def _drive(a, rates, t0=0.0, step=10.0):
    """Feed swayam one 10 s window per rate (fake clock); the targets it decides."""
    s, d, out = a.initial_state(), None, []
    for k, r in enumerate(rates):
        t = t0 + step * (k + 1)
        d, s = a.decide(snap(target=d.target_replicas if d else 1, rate=r, t=t, span=step), s, t)
        out.append(d.target_replicas)
    return out, s


def test_swayam_seasonal_spike_is_provisioned_ahead_and_released():
    # 100 rps, with a 600 rps spike for the 20 s after every 5-minute mark
    rates = [600.0 if (10 * (k + 1)) % 300 in (10, 20) else 100.0 for k in range(120)]
    a = make_autoscaler(
        "swayam",
        startup_s=10,
        interval_s=10,
        keep_alive_s=60,
        season_periods_s=(300.0,),
        season_cycles=2,
        hold_quantile=0,
    )
    targets, _ = _drive(a, rates)
    hi, lo = replicas_needed(SVC, 600.0), replicas_needed(SVC, 100.0)
    # decisions at t = 1190 (index 118) are made before the window [1200, 1210) is seen
    before = [k for k in range(60, 119) if (10 * (k + 2)) % 300 == 10]  # the tick just before a spike
    assert before and all(targets[k] >= hi for k in before)
    # after two cycles of history the spike is known: right after it the target falls at once (no keep-alive)
    after = [k for k in range(60, 119) if (10 * (k + 1)) % 300 == 40]
    assert after and all(targets[k] == max(lo, 1) for k in after)
    # without the seasonal term the same spike is only seen once it is there, and held for the keep-alive
    b = make_autoscaler("swayam", startup_s=10, interval_s=10, keep_alive_s=60, season_periods_s=(), hold_quantile=0)
    plain, _ = _drive(b, rates)
    assert all(plain[k] < hi for k in before) and all(plain[k] >= hi for k in after)


def test_swayam_holds_a_recurring_level_but_not_a_lone_spike():
    a = make_autoscaler(
        "swayam",
        startup_s=10,
        interval_s=10,
        keep_alive_s=30,
        hold_quantile=0.8,
        hold_window_s=300,
        season_periods_s=(),
    )
    lo, hi = replicas_needed(SVC, 100.0), replicas_needed(SVC, 600.0)
    # the rate returns to 600 for 20 s of every minute: the quantile hold keeps the replicas between
    flicker = [600.0 if k % 6 in (0, 1) else 100.0 for k in range(60)]
    targets, _ = _drive(a, flicker)
    assert all(t >= hi for t in targets[20:])
    # one lone 20 s spike after a quiet spell: released once the keep-alive has passed
    lone = [100.0] * 40 + [600.0] * 2 + [100.0] * 10
    targets, _ = _drive(a, lone)
    assert targets[41] >= hi and targets[-1] == max(lo, 1)


def test_late_fraction_memo_gives_the_same_numbers():
    """The fluid tables ask late_fraction for 13 replica counts x 400 rates per service and share
    its steady batches and on-time limits through a memo: it must not change one value."""
    memo: dict = {}
    for c in (1, 2, 3, 6, 12, 48, 128):
        for k in range(120):
            rate = c * k * 6.0
            assert late_fraction(SVC, c, rate, memo) == late_fraction(SVC, c, rate)
    tight = ServiceModel(
        Curve((1, 8, 32), (0.010, 0.020, 0.050), (0.012, 0.024, 0.060)), slo_s=0.015, max_batch_size=32
    )
    memo = {}
    for c in (1, 2, 8):
        for rate in (0.0, 5.0, 50.0, 500.0):
            assert late_fraction(tight, c, rate, memo) == late_fraction(tight, c, rate)


def test_swayam_plans_a_clear_spike_of_varying_height_at_its_largest():
    # 100 rps, with a spike for the 20 s after every 5-minute mark whose height alternates 300 / 600 rps
    def rate(t):
        return (600.0 if (t // 300) % 2 else 300.0) if t % 300 in (10, 20) else 100.0

    rates = [rate(10 * (k + 1)) for k in range(120)]
    kw = dict(startup_s=10, interval_s=10, keep_alive_s=60, season_periods_s=(300.0,), season_cycles=2, hold_quantile=0)
    before = [k for k in range(60, 119) if (10 * (k + 2)) % 300 == 10]  # the tick just before a spike
    largest, _ = _drive(make_autoscaler("swayam", **kw), rates)
    smallest, _ = _drive(make_autoscaler("swayam", season_spike_frac=None, **kw), rates)
    hi = replicas_needed(SVC, 600.0)
    assert before and all(largest[k] >= hi for k in before)  # every spike covered, the 600 rps ones too
    assert any(smallest[k] < hi for k in before)  # the smallest recent height misses the taller spikes
    # a small recurring rise (under season_spike_frac of its level) stays at its smallest
    small = [110.0 if (10 * (k + 1)) % 300 in (10, 20) else 100.0 for k in range(120)]
    assert (
        _drive(make_autoscaler("swayam", **kw), small)[0]
        == _drive(make_autoscaler("swayam", season_spike_frac=None, **kw), small)[0]
    )


def test_linreg_shift_does_not_extrapolate_a_step():
    step = tuple((float(t), 100.0 if t < 40 else 400.0) for t in range(0, 60, 10))
    assert PREDICTORS["linreg"](step, 20) > 400.0  # a line across the step runs past the new level
    assert PREDICTORS["linreg-shift"](step, 20) == pytest.approx(400.0)
    ramp = tuple((t, 100.0 + t) for t in range(0, 60, 10))  # small steps: a trend, extrapolated as before
    assert PREDICTORS["linreg-shift"](ramp, 20) == pytest.approx(PREDICTORS["linreg"](ramp, 20))
