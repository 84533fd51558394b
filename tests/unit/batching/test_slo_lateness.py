"""Lateness feedback in the slo policy: observed late answers raise the degrade level even when
the latency predictions say the best variant keeps up (fake clock, no sleep)."""

from batching.slo import SLOPolicy
from batching.types import BatchResult, Dispatch, QueuedItem, QueueView


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
    q.plan(QueueView("m", [QueuedItem(i, 2.0, 2.030, variants=("big", "small")) for i in range(4)],
                     {"big": 0, "small": 1}, 8, busy_until_s={"big": (2.002,), "small": ()}), 2.0)
    assert q.level == 0  # older than late_window_ms (1 s)


def test_bad_lateness_settings_and_misspelt_arguments_are_config_errors():
    import pytest

    from batching.policy import make_policy

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
    from batching.offline import Request, replay
    from batching.types import BatchResult

    seen: list[BatchResult] = []

    class Spy:
        name = "spy"
        default_variant = "v"

        def plan(self, view, now):
            from batching.types import Dispatch
            return Dispatch(tuple(it.id for it in view.items), "v", "all")

        def observe(self, result):
            seen.append(result)

    replay(Spy(), [Request(0, 0.0, 0.010, size=4), Request(1, 0.0, 1.0, size=2)], lambda v, n: 0.050, 1,
           variants=["v"])
    assert [(r.rows, r.late_rows) for r in seen] == [(6, 4)]
