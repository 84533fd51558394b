"""Clumped arrivals: the dispersion the gateways and simulators measure, and swayam's burst term."""

import numpy as np
import pytest

from sloserve.autoscaler.burst import BinCounts, index_of_dispersion, thinned, unthinned
from sloserve.autoscaler.swayam import SwayamConfig, SwayamState, aggregate_clumping, decide
from sloserve.autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
from sloserve.batching.profile import Curve
from sloserve.gateway.backends.ray_policy import state_from_json, state_to_json, windows_from_metrics
from sloserve.gateway.rates import RateMeter
from sloserve.sim.arrivals import Arrivals

SVC = ServiceModel(Curve((1, 32), (0.004, 0.03), (0.005, 0.04)), slo_s=0.05, max_batch_size=32)


def test_poisson_counts_have_dispersion_near_one_and_clumps_more():
    rng = np.random.default_rng(0)
    assert index_of_dispersion(rng.poisson(50, 5000)) == pytest.approx(1.0, abs=0.06)
    clumped = rng.poisson(5, 5000) * 10  # clumps of ten
    assert index_of_dispersion(clumped) == pytest.approx(10.0, rel=0.06)
    assert index_of_dispersion([]) == 1.0 and index_of_dispersion([0, 0, 0]) == 1.0


def test_bin_counts_count_empty_bins_and_reset():
    c = BinCounts(0.0)
    for t in (0.1, 0.2, 0.3, 2.5):
        c.add(t)
    assert c.dispersion(4.0) == pytest.approx(index_of_dispersion([3, 0, 1, 0]))
    c.reset(4.0)
    c.add(4.5)
    c.add(5.5)
    assert c.dispersion(6.0) == pytest.approx(0.0)  # one a second: more regular than Poisson


def test_thinning_is_inverted_by_the_share():
    assert unthinned(thinned(7.0, 0.25), 0.25) == pytest.approx(7.0)
    # a random quarter of a clumped stream: what one of four gateways measures
    rng = np.random.default_rng(1)
    whole = rng.poisson(20, 20000) * 4
    part = rng.binomial(whole, 0.25)
    assert unthinned(index_of_dispersion(part), 0.25) == pytest.approx(index_of_dispersion(whole), rel=0.08)


def test_rate_meter_dispersion_over_whole_seconds():
    t = [0.0]
    m = RateMeter(lambda: t[0], window_s=5, dispersion_s=10)
    for sec in range(1, 12):
        t[0] = sec + 0.5
        m.add(100 if sec % 2 else 0)  # 100 rows every other second
    t[0] = 12.1
    assert m.dispersion() == pytest.approx(index_of_dispersion([100, 0] * 5))
    assert RateMeter(lambda: 0.5).dispersion() == 1.0  # too early to tell


def _snap(dispersion: float, rate: float = 2000.0, gateways: int = 1) -> ScalingSnapshot:
    share = 1.0 / gateways
    d = thinned(dispersion, share)
    wins = tuple(RateWindow(f"g{i}", 0.0, 10.0, rate * 10 * share, share, d) for i in range(gateways))
    return ScalingSnapshot("m", 1, 1, SVC, windows=wins)


def test_clumped_arrivals_get_more_replicas_and_poisson_ones_none_extra():
    cfg, off = SwayamConfig(), SwayamConfig(burst_z=0)
    poisson, _ = decide(_snap(1.0), cfg, SwayamState(), now=10.0)
    plain, _ = decide(_snap(1.0), off, SwayamState(), now=10.0)
    clumped, state = decide(_snap(300.0), cfg, SwayamState(), now=10.0)
    assert poisson.target_replicas == plain.target_replicas
    assert clumped.target_replicas > poisson.target_replicas
    assert clumped.planned_rps == pytest.approx(poisson.planned_rps + cfg.burst_z * np.sqrt(299.0 * 2000.0), rel=1e-6)
    assert state.bursts == ((10.0, pytest.approx(299.0)),)


def test_the_burst_term_is_the_same_seen_through_four_gateways():
    one, _ = decide(_snap(300.0), SwayamConfig(), SwayamState(), now=10.0)
    four, _ = decide(_snap(300.0, gateways=4), SwayamConfig(), SwayamState(), now=10.0)
    assert four.planned_rps == pytest.approx(one.planned_rps, rel=1e-9)


def test_clumping_is_a_mean_over_the_window_and_noisy_rounds_below_one_count():
    # rounds of Poisson noise either side of 1 average out instead of ratcheting the term up
    wins = [(RateWindow("g", 0, 10, 1000, 1.0, d),) for d in (0.6, 1.4, 0.7, 1.3)]
    state, cfg = SwayamState(), SwayamConfig(interval_s=10)
    for i, w in enumerate(wins):
        d, state = decide(ScalingSnapshot("m", 1, 1, SVC, windows=w), cfg, state, now=10.0 * (i + 1))
    assert sum(v for _, v in state.bursts) == pytest.approx(0.0, abs=1e-9)
    assert aggregate_clumping((), 1) is None


def test_the_ray_adapter_carries_dispersion_and_keeps_the_bursts_in_its_state():
    metrics = {
        "sloserve_rate_rps/gw": {"r1": 100.0},
        "sloserve_share/gw": {"r1": 0.5},
        "sloserve_dispersion/gw": {"r1": 4.0},
    }
    (w,) = windows_from_metrics(metrics, now=20.0, interval_s=10.0)
    assert (w.dispersion, w.share, w.arrivals) == (4.0, 0.5, 1000.0)
    s = SwayamState(bursts=((10.0, 3.0),))
    assert state_from_json(state_to_json(s)).bursts == ((10.0, 3.0),)


def test_scaled_timestamps_keep_per_second_counts_without_millisecond_clumps():
    ts = np.array([0.2, 0.21, 1.5, 3.9])
    a = Arrivals(1.0, np.array([2.0, 1.0, 0.0, 1.0]), ts)
    s = a.scaled(5.0)
    counts = np.bincount(s.timestamps.astype(int), minlength=4)
    assert counts.tolist() == [10, 5, 0, 5]
    assert np.ptp(s.timestamps[s.timestamps < 1]) > 0.1  # spread over the second, not within a millisecond
    assert np.all(np.isin(ts, s.timestamps))  # the originals keep their times


def test_rate_meter_leaves_out_the_idle_seconds_before_the_first_arrival():
    """A gateway started before its traffic: a steady 100 rows/s that began at 5.5 s is not a clump."""
    t = [0.0]
    m = RateMeter(lambda: t[0], window_s=5, dispersion_s=10)
    for tenth in range(55, 120):
        t[0] = tenth / 10
        m.add(10)
    t[0] = 12.0
    assert m.dispersion() == pytest.approx(0.0)  # 100 in each whole second since the first


def test_rate_meter_keeps_every_second_of_the_window_while_counting_the_current_one():
    """Steady arrivals, the latest in the current second: the window's oldest second is still there
    (dropping it read as one empty second in ten, an index of dispersion of 10 at 100 rows/s)."""
    t = [0.0]
    m = RateMeter(lambda: t[0], window_s=5, dispersion_s=10)
    for tenth in range(0, 305):
        t[0] = tenth / 10
        m.add(10)
    assert m.dispersion() == pytest.approx(0.0)
