"""Lateness feedback in the slo policy: observed late answers raise the degrade level even when
the latency predictions say the best variant keeps up (fake clock, no sleep)."""

from sloserve.batching.policies.slo import SLOPolicy
from sloserve.batching.types import BatchResult, Dispatch, QueuedItem, QueueView


def lat(v, n):
    return 0.004 if v == "big" else 0.001


def policy():
    return SLOPolicy(max_batch_size=8, latency_fn=lat, accuracy={"big": 0.98, "small": 0.93}, calibrate=False)


def view(items):
    # big is busy until 102 ms (predicted), small is idle
    return QueueView("m", items, {"big": 0, "small": 1}, 8, busy_until_s={"big": (0.102,), "small": ()})


def items():
    return [QueuedItem(i, 0.1, 0.130, variants=("big", "small")) for i in range(4)]


def test_on_time_answers_keep_the_best_variant():
    p = policy()
    for k in range(8):
        p.observe(BatchResult("m", "big", 8, 0.004, finished_s=0.01 * k, late_rows=0))
    its = items()
    d = p.plan(view(its), 0.1)
    assert p.level == 0
    assert type(d) is not Dispatch and d.reason != "filling", d  # small takes nothing
    d = p.plan(view(its), 0.126)
    assert not (type(d) is Dispatch and d.variant == "small"), d


def test_late_answers_raise_the_level_and_spill_to_the_cheaper_variant():
    p = policy()
    for k in range(8):  # 64 rows answered, 8 of them late: 12.5% > late_target (1%)
        p.observe(BatchResult("m", "big", 8, 0.004, finished_s=0.01 * k, late_rows=1))
    its = items()
    d = p.plan(view(its), 0.1)
    assert p.level == 1
    if type(d) is not Dispatch:  # the cheap variant may wait to fill its batch first
        assert d.reason == "filling" and d.until_s is not None, d
        d = p.plan(view(its), d.until_s)
    assert type(d) is Dispatch and d.variant == "small", d


def test_too_few_rows_or_old_lateness_is_not_evidence():
    p = policy()
    p.observe(BatchResult("m", "big", 8, 0.004, finished_s=0.0, late_rows=8))  # 8 rows < late_min_rows
    p.plan(view(items()), 0.1)
    assert p.level == 0
    q = policy()
    for k in range(8):
        q.observe(BatchResult("m", "big", 8, 0.004, finished_s=0.01 * k, late_rows=8))
    q.plan(
        QueueView(
            "m",
            [QueuedItem(i, 2.0, 2.030, variants=("big", "small")) for i in range(4)],
            {"big": 0, "small": 1},
            8,
            busy_until_s={"big": (2.002,), "small": ()},
        ),
        2.0,
    )
    assert q.level == 0  # older than late_window_ms (1 s)


def test_bad_lateness_settings_and_misspelt_arguments_are_config_errors():
    import pytest

    from sloserve.batching.policy import make_policy

    with pytest.raises(ValueError, match="late_target"):
        make_policy("slo", late_target=-1)
    with pytest.raises(ValueError, match="late_windw_ms"):
        make_policy("slo", late_windw_ms=5)


def test_lateness_does_not_outlive_an_idle_window():
    """After a burst raised the level, a later burst (with nothing back for over a window in
    between) does not start degraded on the old evidence."""
    p = policy()
    for k in range(8):
        p.observe(BatchResult("m", "big", 8, 0.004, finished_s=0.01 * k, late_rows=1))
    p.plan(view(items()), 0.1)
    assert p.lateness.need(0.1, 1, 1) == 1
    assert p.lateness.need(5.0, 1, 1) == 0


def test_offline_replay_reports_late_rows_not_requests():
    """A late 4-row request is 4 late rows in the BatchResult, as the live batcher counts them."""
    from sloserve.batching.replay import Request, replay
    from sloserve.batching.types import BatchResult

    seen: list[BatchResult] = []

    class Spy:
        name = "spy"
        default_variant = "v"

        def plan(self, view, now):
            from sloserve.batching.types import Dispatch

            return Dispatch(tuple(it.id for it in view.items), "v", "all")

        def observe(self, result):
            seen.append(result)

    replay(Spy(), [Request(0, 0.0, 0.010, size=4), Request(1, 0.0, 1.0, size=2)], lambda v, n: 0.050, 1, variants=["v"])
    assert [(r.rows, r.late_rows) for r in seen] == [(6, 4)]


# ---- overload memory: a level that proved too little at a rate is not restored at that rate ----


def _lc(memory_s=10.0):
    from sloserve.batching.policies._levels import LevelController

    return LevelController(restore_headroom=0.25, restore_hold_s=0.5, memory_s=memory_s)


def _run(lc, t0, t1, rate, step=0.1):
    """update() every ``step`` from t0 to t1 with the profile saying level 0 would do (comfortable,
    never overloaded): only the remembered rate can hold the level up."""
    t = t0
    while t <= t1 + 1e-9:
        lc.update(t, 1, 0, lambda k: False, lambda k: True, rate=rate)
        t += step
    return lc.level


def test_a_level_is_not_restored_while_the_rate_it_failed_at_persists():
    lc = _lc()
    assert lc.update(0.0, 1, 1, lambda k: False, lambda k: True, rate=1000.0) == 1  # proved too little at 1000/s
    assert _run(lc, 0.1, 3.0, rate=900.0) == 1  # 900 > 75% of 1000: still the burst, stay degraded
    assert _run(lc, 3.1, 3.5, rate=700.0) == 1  # the rate fell; the hold (0.5 s) has not passed yet
    assert _run(lc, 3.6, 3.7, rate=700.0) == 0  # restored once the lower rate held for the hold
    assert lc.switches == 2


def test_the_memory_expires_and_zero_turns_it_off():
    lc = _lc(memory_s=2.0)
    lc.update(0.0, 1, 1, lambda k: False, lambda k: True, rate=1000.0)
    assert _run(lc, 0.1, 1.9, rate=950.0) == 1
    assert _run(lc, 2.0, 3.0, rate=950.0) == 0  # forgotten after memory_s: back to the profile's word
    off = _lc(memory_s=0.0)  # the behaviour before the memory: the hold alone
    off.update(0.0, 1, 1, lambda k: False, lambda k: True, rate=1000.0)
    assert _run(off, 0.1, 0.7, rate=1000.0) == 0


def test_a_rise_by_prediction_is_remembered_too_and_a_later_rise_updates_it():
    lc = _lc()
    lc.update(0.0, 2, 0, lambda k: True, lambda k: True, rate=800.0)  # predicted misses at 0 and 1
    assert lc.level == 2
    assert not lc.under_ceiling(0, 0.5, 700.0) and not lc.under_ceiling(1, 0.5, 700.0)
    assert lc.under_ceiling(1, 0.5, 600.0)
    lc.level = 1
    lc.update(1.0, 2, 2, lambda k: False, lambda k: True, rate=1200.0)  # level 1 failed again, at 1200/s
    assert lc.under_ceiling(1, 1.5, 900.0) and not lc.under_ceiling(0, 1.5, 700.0)


def test_the_policy_remembers_the_arrival_rate_when_lateness_raises_the_level():
    """End to end through SLOPolicy.plan: lateness raises the level at 1,000 rows/s; big's profile
    says it sustains 2,000/s (8 rows per 4 ms), so by the profile alone the level would come back
    after the hold. It stays up until the arrivals slow down."""

    def make(memory_ms):
        return SLOPolicy(
            max_batch_size=8,
            latency_fn=lat,
            accuracy={"big": 0.98, "small": 0.93},
            calibrate=False,
            restore_hold_ms=100.0,
            overload_memory_ms=memory_ms,
        )

    def late_answers(p):
        for k in range(8):
            p.observe(BatchResult("m", "big", 8, 0.004, finished_s=0.1 + 0.001 * k, late_rows=1))

    def step(p, t0, t1, every_ms):
        t = t0
        while t < t1:
            it = QueuedItem(int(t * 1e6), t, t + 0.030, variants=("big", "small"))
            p.plan(QueueView("m", [it], {"big": 1, "small": 1}, 8), t)
            p._q.forget([it.id])  # served elsewhere: only the level is under test here
            t += every_ms / 1e3
        return p.level

    p = make(10_000.0)
    assert step(p, 0.0, 0.1, 1) == 0  # 1,000 rows/s, all on time so far
    late_answers(p)
    assert step(p, 0.1, 0.2, 1) == 1  # then late answers come in at that rate
    assert step(p, 0.2, 1.5, 1) == 1  # comfortable by the profile (1,000 <= 75% of 2,000), late by experience
    assert step(p, 1.5, 3.5, 4) == 0  # 250/s: under 75% of the remembered 1,000/s; restored after the hold
    q = make(0.0)  # without the memory the profile's word brings it back mid-burst
    step(q, 0.0, 0.1, 1)
    late_answers(q)
    assert step(q, 0.1, 0.2, 1) == 1
    assert step(q, 0.2, 1.5, 1) == 0


def test_the_remembered_rate_follows_the_burst_up_so_the_level_returns_when_it_ends():
    """At a burst's onset the rate window still holds mostly the load before it: the level rises at
    700/s while the burst is 1,800/s. Remembering 700 would keep the level up at the old 600/s base
    for memory_s; following the rate up brings it back once the burst is over."""
    lc = _lc()
    lc.update(0.0, 1, 1, lambda k: False, lambda k: True, rate=700.0)
    assert _run(lc, 0.1, 3.0, rate=1800.0) == 1  # the burst: 1,800 > 75% of what is remembered
    assert lc.ceiling(0, 3.0) == 1800.0
    assert _run(lc, 3.1, 3.7, rate=600.0) == 0  # back at the base rate: restored after the hold
    assert lc.ceiling(0, 3.7) == 1800.0  # still remembered, with the time of the failure
    assert lc.ceiling(0, 10.1) is None


def test_a_request_only_a_cheaper_variant_can_make_is_not_a_failed_level():
    lc = _lc()
    lc.update(0.0, 1, 1, lambda k: False, lambda k: True, rate=1000.0, failed_level=0)  # scan need only
    assert lc.level == 1 and lc.ceiling(0, 0.0) is None
    assert _run(lc, 0.1, 0.7, rate=1000.0) == 0  # restored after the hold, at the same rate
    lc.update(1.0, 1, 1, lambda k: False, lambda k: True, rate=1000.0, failed_level=1)  # lateness
    assert lc.ceiling(0, 1.0) == 1000.0
    lc2 = _lc()
    lc2.update(0.0, 1, 0, lambda k: k == 0, lambda k: True, rate=900.0, failed_level=0)  # a predicted miss
    assert lc2.level == 1 and lc2.ceiling(0, 0.0) == 900.0


def test_the_new_settings_refuse_bad_values_with_their_own_names():
    import pytest

    from sloserve.batching.policy import make_policy

    for kwargs, name in (
        ({"overload_memory_ms": -1}, "overload_memory_ms"),
        ({"overload_memory_ms": "ten"}, "overload_memory_ms"),
        ({"calibration_recent": -3}, "calibration_recent"),
        ({"calibration_recent": 2.5}, "calibration_recent"),
        ({"size_quantile": "p90"}, "size_quantile"),
        ({"no_such_knob": 1}, "no_such_knob"),
    ):
        with pytest.raises(ValueError, match=name):
            make_policy("slo", **kwargs)
    make_policy("slo", overload_memory_ms=0, calibration_recent=0)  # all valid


def test_late_now_reads_the_last_window_and_keeps_no_more_than_it():
    from sloserve.batching.policies._levels import LatenessMonitor

    m = LatenessMonitor(target=0.01, window_s=1.0, min_rows=32)
    for i in range(10_000):  # a long-running gateway whose model never asks (not shared): bounded anyway
        m.observe(i * 0.01, 0, 8, 0)
    assert len(m._recent) <= 102
    assert not m.late_now(100.0, 0)
    m.observe(100.0, 0, 32, 1)  # 1 of 32 + 800 recent rows: under 1 %
    assert not m.late_now(100.0, 0)
    m.observe(100.01, 0, 32, 30)
    assert m.late_now(100.01, 0) and not m.late_now(102.0, 0)  # the window moved on: no evidence left
    m.observe(103.0, 1, 64, 64)  # lateness of a cheaper variant is not the best one's
    assert not m.late_now(103.0, 0) and m.late_now(103.0, 1)
