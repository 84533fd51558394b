from sloserve.batching.calibration import Calibrator
from sloserve.batching.latency import LatencyModel
from sloserve.batching.profile import ProfileTable
from sloserve.batching.types import BatchResult

KEY = ("m", "v", "cpu")


def table():
    return ProfileTable.from_points({KEY: ([1, 8, 32], [1.0, 4.0, 16.0], [1.5, 6.0, 24.0])})


def feed(c, rows, latency_s, n, t0=0.0, device="cpu"):
    for i in range(n):
        c.observe(BatchResult("m", "v", rows, latency_s, t0 + i * 0.01, device_type=device))


def test_no_observations_returns_the_prior():
    c = Calibrator(table())
    assert c.latency_s(*KEY, 8) == table().latency_s(*KEY, 8)
    assert c.drift() == {}


def test_stale_profile_converges_to_observed_and_drift_reports_ratio():
    c = Calibrator(table(), min_samples=8, prior_weight=4.0)
    feed(c, 8, 0.012, 200)  # the replica is 3x slower than the profile's p50
    assert abs(c.drift()[KEY] - 3.0) < 1e-9
    assert abs(c.latency_s(*KEY, 8, "p50") - 0.012) < 0.012 * 0.05
    # unseen sizes follow the profile's shape, scaled by the pooled ratio
    assert abs(c.latency_s(*KEY, 32, "p50") - 0.048) < 0.048 * 0.05


def test_tail_comes_from_window_quantile():
    c = Calibrator(table(), min_samples=8, prior_weight=0.0)
    for i in range(100):
        c.observe(BatchResult("m", "v", 1, 0.001 if i % 10 else 0.005, float(i)))
    assert c.latency_s(*KEY, 1, "p50") == 0.001
    assert c.latency_s(*KEY, 1, "p99") == 0.005


def test_window_forgets_old_regime_by_age():
    c = Calibrator(table(), min_samples=4, prior_weight=0.0, max_age_s=1.0)
    feed(c, 8, 0.016, 50, t0=0.0)
    feed(c, 8, 0.004, 10, t0=100.0)
    assert abs(c.drift()[KEY] - 1.0) < 1e-9


def test_foreign_profile_and_missing_profile():
    c = Calibrator(table(), min_samples=4, prior_weight=0.0)
    feed(c, 8, 0.008, 20, device="gpu-x")  # no gpu-x profile: the cpu one is the prior
    assert abs(c.drift()[("m", "v", "gpu-x")] - 2.0) < 1e-9
    c2 = Calibrator(None, min_samples=4, prior_weight=0.0, prior_ms_per_row=1.0)
    for i in range(20):
        c2.observe(BatchResult("m", "w", 4, 0.002, float(i)))
    assert abs(c2.latency_s("m", "w", "cpu", 4, "p50") - 0.002) < 1e-9


def test_failed_batches_are_ignored_and_snapshot_is_a_table():
    c = Calibrator(table(), min_samples=4, prior_weight=0.0)
    c.observe(BatchResult("m", "v", 8, 1.0, 0.0, ok=False))
    assert c.version == 0
    feed(c, 8, 0.008, 20)
    snap = c.snapshot(max_rows=16)
    assert isinstance(snap, ProfileTable)
    assert abs(snap.latency_s(*KEY, 8, "p50") - 0.008) < 1e-9


def test_latency_model_refreshes_from_calibrator():
    m = LatencyModel(table(), 32, model="m", refresh_every=4)
    before = m.latency_s("v", 8)
    for i in range(40):
        m.observe(BatchResult("m", "v", 8, 0.04, float(i)))
    assert m.latency_s("v", 8) > 2 * before
    t = m.table("v")
    assert all(t[i] <= t[i + 1] for i in range(len(t) - 1))


# ---- a regime change: the tail follows from the second slow batch (the ``recent`` floor) ----


def test_the_tail_follows_a_regime_change_from_the_second_slow_batch():
    c = Calibrator(table(), min_samples=8, prior_weight=0.0)
    feed(c, 8, 0.004, 200)  # as profiled: ratio 1
    assert c.latency_s(*KEY, 8) == 0.004
    c.observe(BatchResult("m", "v", 8, 0.008, 3.0))  # one slow batch: an outlier, moves nothing
    assert c.latency_s(*KEY, 8) == 0.004
    urgent = c.urgent
    c.observe(BatchResult("m", "v", 8, 0.008, 3.01))  # a second one: a new regime
    assert abs(c.latency_s(*KEY, 8) - 0.008) < 1e-12
    assert abs(c.latency_s(*KEY, 32) - 0.032) < 1e-12  # other sizes too, by the profile's shape
    assert c.latency_s(*KEY, 8, "p50") == 0.004  # the median (what shedding asks) is not floored
    assert c.urgent == urgent + 1
    off = Calibrator(table(), min_samples=8, prior_weight=0.0, recent=0)  # the window alone
    feed(off, 8, 0.004, 200)
    feed(off, 8, 0.008, 2, t0=3.0)
    assert off.latency_s(*KEY, 8) == 0.004  # 2 of 202 samples: under the window's top 1%


def test_the_floor_lets_go_when_the_slow_batches_pass_and_does_not_bind_at_a_steady_state():
    c = Calibrator(table(), min_samples=8, prior_weight=0.0)
    feed(c, 8, 0.004, 200)
    feed(c, 8, 0.008, 2, t0=3.0)
    feed(c, 8, 0.004, 7, t0=4.0)  # one slow batch left among the last 8: no longer a floor
    assert c.latency_s(*KEY, 8) == 0.004
    s = Calibrator(table(), min_samples=8, prior_weight=0.0)
    for i in range(300):  # a steady spread of ratios 1.00-1.19: the window's p99 rules
        s.observe(BatchResult("m", "v", 8, 0.004 * (1.0 + (i * 7 % 20) / 100), i * 0.01))
    assert abs(s.latency_s(*KEY, 8) - 0.004 * 1.19) < 1e-12


def test_latency_model_rebuilds_at_once_on_a_regime_change():
    m = LatencyModel(table(), 32, model="m", refresh_every=64)
    for i in range(200):
        m.observe(BatchResult("m", "v", 8, 0.004, i * 0.01))
    assert m.latency_s("v", 8) == 0.004
    m.observe(BatchResult("m", "v", 8, 0.010, 3.0))
    m.observe(BatchResult("m", "v", 8, 0.010, 3.01))  # 2 batches, far fewer than refresh_every
    assert abs(m.latency_s("v", 8) - 0.010) < 1e-12
    assert m.max_rows_within("v", 0.006) < 8  # the policy now sizes batches for the new regime


def test_the_floor_is_a_regime_change_not_one_batch_size_running_slower():
    """Batches of 1 run as profiled and batches of 8 at 1.5x, interleaved, steadily: each size keeps its
    own tail; the recent floor (pooled over sizes) must not lift the batch of 1 to 1.5x."""
    c = Calibrator(table(), min_samples=8, prior_weight=0.0)
    for i in range(200):
        c.observe(BatchResult("m", "v", 1, 0.001, i * 0.01))
        c.observe(BatchResult("m", "v", 8, 0.006, i * 0.01 + 0.005))
    assert c.latency_s(*KEY, 1) == 0.001
    assert abs(c.latency_s(*KEY, 8) - 0.006) < 1e-12


def test_recent_ratios_age_out_with_the_window():
    c = Calibrator(table(), min_samples=4, prior_weight=0.0, max_age_s=1.0)
    feed(c, 8, 0.004, 50, t0=0.0)
    feed(c, 8, 0.012, 2, t0=0.6)  # a slow spell
    assert abs(c.latency_s(*KEY, 8) - 0.012) < 1e-12
    feed(c, 8, 0.004, 1, t0=5.0)  # much later: the slow spell is older than max_age_s
    assert c.latency_s(*KEY, 8) == 0.004
