"""swayam's seasonal term: the SeasonLog fast path against the plain tuple version it replaced.

The reference below is the seasonal code as it was before ``SeasonLog`` (a tuple of (time, rate)
pairs, copied and bisected every decision). Histories are random: irregular and regular clocks (the
simulator's even grid takes the guessed-index path), calls inside one bucket (a replaced sample),
rounds without reports (no sample), gaps, and decisions taken again from an older state (a fork of the
shared lists). Every decision and state must match the reference exactly, floats included.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sloserve.autoscaler import swayam
from sloserve.autoscaler.swayam import (
    SeasonLog,
    SwayamConfig,
    SwayamState,
    decide,
    seasonal_changes,
)
from sloserve.autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
from sloserve.batching.profile import Curve

SVC = ServiceModel(Curve((1, 8, 32), (0.010, 0.020, 0.050), (0.012, 0.024, 0.060)), slo_s=0.2, max_batch_size=32)


# ---- the reference: the tuple implementation, verbatim but for names


def _ref_first_after(points, t0, lo=0):
    return bisect.bisect_right(points, (t0, math.inf), lo)


def ref_seasonal_changes(season, now, horizon_s, periods_s, cycles, base_s):
    if not season:
        return None
    rise = high = -math.inf
    for period in periods_s:
        if now - cycles * period - base_s < season[0][0] - 1e-9:
            continue
        low = math.inf
        for k in range(1, cycles + 1):
            t0 = now - k * period
            b = _ref_first_after(season, t0 - base_s)
            i = _ref_first_after(season, t0, b)
            j = _ref_first_after(season, t0 + horizon_s, i)
            if i <= b or j <= i:
                return None
            d = max(r for _, r in season[i:j]) - sum(r for _, r in season[b:i]) / (i - b)
            low = min(low, d)
            high = max(high, d)
        rise = max(rise, low)
    if rise == -math.inf:
        return None
    return rise, high


def ref_add(season, now, rate, config):
    bucket = config.season_bucket_s
    span = max(config.season_periods_s) * config.season_cycles + config.season_base_s + bucket
    season = season[_ref_first_after(season, now - span) :]
    if season and now - season[-1][0] < bucket - 1e-9:
        season = season[:-1]
    return season + ((now, rate),)


def ref_level(season, now, base_s):
    i = _ref_first_after(season, now - base_s)
    return sum(r for _, r in season[i:]) / max(len(season) - i, 1)


# ---- histories

CONFIGS = [
    SwayamConfig(startup_s=10, interval_s=30),  # the scale run's (default periods 300/900/3600 s)
    SwayamConfig(startup_s=10, interval_s=10, season_periods_s=(60.0, 150.0), season_cycles=2, season_base_s=20.0),
    SwayamConfig(
        startup_s=5,
        interval_s=7,
        season_periods_s=(40.0, 90.0),
        season_cycles=3,
        season_base_s=15.0,
        season_bucket_s=10.0,
        hold_quantile=0.8,
        hold_window_s=120.0,
    ),
]


@st.composite
def histories(draw):
    cfg = draw(st.sampled_from(CONFIGS))
    regular = draw(st.booleans())
    n = draw(st.integers(5, 260))
    steps, rates = [], []
    for _ in range(n):
        if regular:
            step = cfg.interval_s
        else:  # jitter, calls inside one bucket, and now and then a long gap
            step = draw(st.one_of(st.floats(0.5, 3 * cfg.interval_s), st.sampled_from([cfg.interval_s, 400.0])))
        steps.append(step)
        # None: a round without gateway reports (no sample); spikes make seasonal bumps
        rates.append(draw(st.one_of(st.none(), st.sampled_from([0.0, 50.0, 400.0]), st.floats(0.0, 600.0))))
    forks = draw(st.lists(st.integers(0, n - 1), max_size=3))
    return cfg, steps, rates, set(forks)


def snap(rate, t, span):
    wins = () if rate is None else tuple(RateWindow(f"gw{g}", t - span, t, rate * span / 2, 0.5) for g in range(2))
    return ScalingSnapshot("m", 2, 2, SVC, 0.0, wins, 1, 100)


def as_pairs(season):
    return tuple(season)


# (histories of up to 260 rounds: drawing them is slow on a busy box, which is no failure of the policy)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_seasonal_fast_path_matches_the_tuple_version(h):
    cfg, steps, rates, forks = h
    state = SwayamState()
    ref = ()  # the reference's season tuple
    old = []  # (state, ref, now, rate) to decide again from: a fork of the shared lists
    now = 1000.0
    for n, (step, rate) in enumerate(zip(steps, rates, strict=True)):
        now += step  # a fake clock: the policy reads no other
        s = snap(rate, now, step)
        _, new = decide(s, cfg, state, now)
        if rate is not None:
            r = swayam.aggregate_rate(s.windows, 2)
            ref = ref_add(ref, now, r, cfg)
        assert as_pairs(new.season) == ref
        for horizon, at in ((cfg.startup_s + cfg.interval_s, now), (cfg.interval_s, now - cfg.interval_s)):
            want = ref_seasonal_changes(ref, at, horizon, cfg.season_periods_s, cfg.season_cycles, cfg.season_base_s)
            assert (
                seasonal_changes(new.season, at, horizon, cfg.season_periods_s, cfg.season_cycles, cfg.season_base_s)
                == want
            )
            assert (
                seasonal_changes(ref, at, horizon, cfg.season_periods_s, cfg.season_cycles, cfg.season_base_s) == want
            )  # a plain tuple still works
        if ref:
            assert SeasonLog.of(new.season)._level(now - cfg.season_base_s) == ref_level(ref, now, cfg.season_base_s)
        if n in forks:
            old.append((state, now, s))
        state = new
    # deciding again from an older state (which the newer ones share lists with) gives what it gave then
    for prev, t, s in old:
        d1, s1 = decide(s, cfg, prev, t)
        d2, s2 = decide(s, cfg, replace(prev, season=tuple(prev.season)), t)  # the same state rebuilt from pairs
        assert d1 == d2 and s1 == s2


def test_decisions_match_the_tuple_version_on_a_recurring_spike():
    """The decision sequence (targets, reasons, planned rates) with the log equals the one with a
    season rebuilt as a plain tuple before every call (the JSON round trip of the live adapter)."""
    cfg = SwayamConfig(startup_s=10, interval_s=10)
    a = b = SwayamState()
    for k in range(1, 1600):
        t = 10.0 * k
        rate = 100.0 + (500.0 if t % 300 in (0.0, 10.0) else 0.0) + (k % 7)
        s = snap(rate, t, 10.0)
        da, a = decide(s, cfg, a, t)
        db, b = decide(s, cfg, replace(b, season=tuple(b.season)), t)
        assert da == db and a == b
    assert (
        isinstance(a.season, SeasonLog) and len(a.season) == 724
    )  # (now - 7240 s, now]: 2 x 3600 s + 30 s + one bucket, per 10 s


def test_log_is_a_sequence_of_pairs_and_never_changes():
    log = SeasonLog(((0.0, 1.0), (10.0, 2.0)))
    a = log.add(20.0, 3.0, 100.0, 10.0)
    b = a.add(30.0, 4.0, 100.0, 10.0)  # appended in place: the lists are shared
    assert a._t is b._t
    c = a.add(30.0, 5.0, 100.0, 10.0)  # a is no longer the newest: a copy
    d = b.add(35.0, 6.0, 100.0, 10.0)  # same bucket: the latest sample replaced, on a copy
    assert tuple(a) == ((0.0, 1.0), (10.0, 2.0), (20.0, 3.0))
    assert tuple(b) == ((0.0, 1.0), (10.0, 2.0), (20.0, 3.0), (30.0, 4.0))
    assert tuple(c) == ((0.0, 1.0), (10.0, 2.0), (20.0, 3.0), (30.0, 5.0))
    assert tuple(d) == ((0.0, 1.0), (10.0, 2.0), (20.0, 3.0), (35.0, 6.0))
    assert a[-1] == (20.0, 3.0) and a[1:] == ((10.0, 2.0), (20.0, 3.0)) and len(a) == 3
    assert a == tuple(a) and a != b and hash(a) == hash(tuple(a))
    e = b.add(125.0, 7.0, 100.0, 10.0)  # drops the samples at or before 25 s
    assert tuple(e) == ((30.0, 4.0), (125.0, 7.0))
