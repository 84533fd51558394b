import pytest
from batching_factories import ACC, items, linear, two_variants, view

from sloserve.batching import make_policy
from sloserve.batching.policies.slo import SLOPolicy
from sloserve.batching.profile import ProfileTable
from sloserve.batching.types import Dispatch, QueuedItem, Shed, Wait


def policy(**kw):
    kw.setdefault("max_batch_size", 32)
    kw.setdefault("latency_fn", linear(2.0, 1.0))  # 2 + n ms: batching barely helps
    return SLOPolicy(**kw)


def test_registered_and_built_by_name():
    p = make_policy("slo", max_batch_size=8, latency_fn=linear(1, 1), default_variant="v")
    assert p.name == "slo"


def test_empty_queue_waits_for_nothing():
    assert policy().plan(view([]), 0.0) == Wait(None, "empty")


def test_dispatches_largest_batch_meeting_earliest_deadline():
    p = policy()
    # 20 items all due at 10 ms: 2 + n <= 10 -> 8 rows
    its = [QueuedItem(i, 0.0, 0.010, variants=("v",)) for i in range(20)]
    d = p.plan(view(its), 0.0)
    assert isinstance(d, Dispatch) and len(d.ids) == 8 and d.reason == "deadline"


def test_deadline_order_within_a_priority_level():
    p = policy()
    its = [
        QueuedItem(0, 0.0, 0.050, variants=("v",)),
        QueuedItem(1, 0.001, 0.004, variants=("v",)),
        QueuedItem(2, 0.002, 0.005, variants=("v",)),
    ]
    d = p.plan(view(its, max_batch_size=1), 0.0)
    assert d.ids == (1,)


def test_a_higher_priority_level_goes_first_whatever_its_deadline():
    # Triton's numbering: level 1 is served before level 2, even with a later deadline
    p = policy()
    its = [
        QueuedItem(0, 0.0, 0.004, priority=2, variants=("v",)),
        QueuedItem(1, 0.001, 0.050, priority=1, variants=("v",)),
        QueuedItem(2, 0.002, 0.030, priority=1, variants=("v",)),
    ]
    d = p.plan(view(its, max_batch_size=1), 0.0)
    assert d.ids == (2,)


def test_full_batch_goes_at_once():
    p = policy(max_batch_size=4)
    d = p.plan(view(items(6, slo_s=1.0), max_batch_size=4), 0.0)
    assert isinstance(d, Dispatch) and d.ids == (0, 1, 2, 3) and d.reason == "full"


def test_waits_only_when_a_bigger_batch_pays_and_is_reachable():
    # strong batching gains (10 ms fixed cost); a busy stream of arrivals
    p = policy(latency_fn=linear(10.0, 0.1))
    stream = [QueuedItem(i, -0.01 + i * 0.001, -0.01 + i * 0.001 + 0.05, variants=("v",)) for i in range(10)]
    d = p.plan(view(stream), 0.0)
    assert isinstance(d, Wait) and d.reason == "filling"
    head = stream[0]
    assert d.until_s == pytest.approx(head.deadline_s - (10.0 + 0.1 * 10) / 1e3)
    # linear latency through 0: no gain from waiting -> dispatch now
    p2 = policy(latency_fn=linear(0.0, 1.0))
    d2 = p2.plan(view(list(stream)), 0.0)
    assert isinstance(d2, Dispatch) and d2.reason == "no_gain"


def test_sheds_what_cannot_make_it_even_alone():
    p = policy()
    its = [QueuedItem(0, 0.0, 0.0025, variants=("v",)), QueuedItem(1, 0.0, 0.02, variants=("v",))]
    d = p.plan(view(its), 0.0)
    assert isinstance(d, Shed) and d.ids == (0,)
    assert d.late_by_s[0] == pytest.approx(0.0005)


def test_busy_until_makes_shedding_earlier_and_unknown_busy_is_optimistic():
    p = policy()
    its = [QueuedItem(0, 0.0, 0.008, variants=("v",))]
    assert isinstance(p.plan(view(its, idle={"v": 0}), 0.0), Wait)  # busy, unknown until: keep
    p2 = policy()
    d = p2.plan(view(its, idle={"v": 0}, busy={"v": [0.007]}), 0.0)
    assert isinstance(d, Shed) and d.late_by_s[0] == pytest.approx(0.002)


def test_wait_timer_points_at_next_infeasibility_when_no_replica():
    p = policy()
    its = [QueuedItem(0, 0.0, 0.010, variants=("v",))]
    d = p.plan(view(its, idle={"v": 0}), 0.0)
    assert isinstance(d, Wait) and d.until_s == pytest.approx(0.010 - 0.003, abs=1e-6)


def test_degrades_to_cheaper_variant_only_when_best_cannot_make_it():
    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC)
    v = ("big", "small")
    # big busy until 9 ms, head due at 10 ms: big cannot (9 + 4.5 > 10), small can
    its = [QueuedItem(0, 0.0, 0.010, variants=v)]
    d = p.plan(view(its, idle={"big": 0, "small": 1}, busy={"big": [0.009], "small": []}), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "small"
    # with big idle, big serves
    p2 = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC)
    d2 = p2.plan(view(list(its), idle={"big": 1, "small": 1}), 0.0)
    assert isinstance(d2, Dispatch) and d2.variant == "big"


def test_pinned_cheap_variant_is_served_at_level_zero():
    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC)
    d = p.plan(view([QueuedItem(0, 0.0, 0.02, variants=("small",))], idle={"big": 1, "small": 1}), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "small" and p.level == 0


def test_admission_refuses_what_queueing_already_dooms():
    p = policy(max_batch_size=4)
    queue = items(400, slo_s=0.05)  # 400 rows ahead at 4 rows / 6 ms = 600 ms of work
    late = QueuedItem(1000, 0.0, 0.1, variants=("v",))
    r = p.admit(view(queue, max_batch_size=4), late, 0.0)
    assert isinstance(r, Shed) and r.reason == "admission" and r.late_by_s[0] > 0.4
    ok = QueuedItem(1001, 0.0, 0.01, variants=("v",))  # earliest deadline: goes first
    assert p.admit(view(queue, max_batch_size=4), ok, 0.0) is None


def test_profile_table_source_with_calibration_and_variant_order():
    t = ProfileTable.from_points(
        {
            ("m", "big", "cpu"): ([1, 32], [4.5, 20.0], [5.0, 22.0]),
            ("m", "small", "cpu"): ([1, 32], [1.1, 4.2], [1.2, 4.5]),
        },
        {("m", "big"): 0.95, ("m", "small"): 0.85},
    )
    p = SLOPolicy(max_batch_size=32, profile=t, model="m")
    assert p._variants == ["big", "small"]
    assert p.calibrator is not None
    d = p.plan(view([QueuedItem(0, 0.0, 0.02)], idle={"big": 1, "small": 1}), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "big"


def test_incremental_order_survives_foreign_removals():
    p = policy(latency_fn=linear(10.0, 0.1))
    its = items(5, slo_s=1.0, gap_s=0.001)
    p.plan(view(its), 0.01)
    its2 = [its[0], its[2], its[4]] + items(2, slo_s=1.0, start_s=0.02)[0:0]
    assert [e[3] for e in (p._sync(view(its2)).entries)] == [0, 2, 4]


def test_shared_replicas_serve_the_cheaper_variant_only_for_a_queue_the_better_one_would_miss():
    """QueueView.shared: both variants on the same two replicas (idle and busy list the same ones)."""
    from sloserve.batching.types import QueueView

    def shared_view(its):
        return QueueView("m", its, {"big": 1, "small": 1}, 32, {"big": [0.004], "small": [0.004]}, shared=True)

    both = ("big", "small")
    # a light queue: big meets every deadline, so the freed replica waits to fill a big batch
    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC, calibrate=False)
    d = p.plan(shared_view(items(4, slo_s=0.02, variants=both)), 0.0)
    assert d == Wait(pytest.approx(0.014), "filling")
    d = p.plan(shared_view(items(4, slo_s=0.02, variants=both)), 0.014)
    assert isinstance(d, Dispatch) and d.variant == "big"
    # a queue two big replicas cannot serve in time (40 rows due in 12 ms: big does 16 per batch at
    # 12 ms): the freed replica runs a small batch, which drains it
    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC, calibrate=False)
    d = p.plan(shared_view(items(40, slo_s=0.012, variants=both)), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "small"
    # the same queue with separate replicas per variant: big takes its own idle replica first
    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC, calibrate=False)
    sep = QueueView(
        "m", items(40, slo_s=0.012, variants=both), {"big": 1, "small": 1}, 32, {"big": [0.004], "small": [0.004]}
    )
    assert p.plan(sep, 0.0).variant == "big"


def test_shared_replicas_without_driver_busy_times_see_every_variants_batch_in_flight():
    """The live batcher gives no busy_until_s: the policy's own predictions stand in, and on shared replicas a
    batch of one variant occupies the replica for the others too (and admission counts it once)."""
    from sloserve.batching.types import QueueView

    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC, calibrate=False)
    both = ("big", "small")
    d = p.plan(QueueView("m", items(32, slo_s=0.05, variants=both), {"big": 1, "small": 1}, 32, shared=True), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "big" and len(d.ids) == 32  # 4 + 16 ms on the one replica
    busy = QueueView("m", items(8, slo_s=0.05, variants=both, start_s=0.001), {"big": 0, "small": 0}, 32, shared=True)
    pools = p._pools(busy, 0.001)
    assert pools["small"].free_s == pools["big"].free_s == [pytest.approx(0.020)]
    own = QueueView("m", busy.items, {"big": 0, "small": 0}, 32)  # separate replicas: big's batch is not small's
    assert p._pools(own, 0.001)["small"].free_s == [] and p._pools(own, 0.001)["big"].free_s == [pytest.approx(0.020)]


def test_shared_replicas_serve_a_head_pinned_to_the_best_variant_first():
    """Under overload a freed shared replica goes to the cheaper variant first, except when the earliest
    deadline belongs to a request only the best may serve: it would otherwise wait until it is shed."""
    from sloserve.batching.types import QueueView

    both = ("big", "small")
    its = [QueuedItem(0, 0.0, 0.010, variants=("big",))] + [
        QueuedItem(i, 0.0, 0.012, variants=both) for i in range(1, 41)
    ]
    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC, calibrate=False)
    d = p.plan(QueueView("m", its, {"big": 1, "small": 1}, 32, {"big": [0.004], "small": [0.004]}, shared=True), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "big" and 0 in d.ids
    flexible = [QueuedItem(0, 0.0, 0.010, variants=both)] + its[1:]
    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC, calibrate=False)
    d = p.plan(
        QueueView("m", flexible, {"big": 1, "small": 1}, 32, {"big": [0.004], "small": [0.004]}, shared=True), 0.0
    )
    assert isinstance(d, Dispatch) and d.variant == "small"


def test_shared_replicas_turn_to_the_cheaper_variant_when_the_best_answers_late():
    """A queue the best variant can serve in time, but it has just answered more than late_target late
    (a profile that under-predicts it): a freed shared replica serves the cheaper one until that passes."""
    from sloserve.batching.types import BatchResult, QueueView

    def shared_view(its):
        return QueueView("m", its, {"big": 1, "small": 1}, 32, {"big": [], "small": []}, shared=True)

    both = ("big", "small")
    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC, calibrate=False)
    d = p.plan(shared_view(items(32, slo_s=0.05, variants=both, start_s=1.0)), 1.0)
    assert isinstance(d, Dispatch) and d.variant == "big"
    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC, calibrate=False)
    p.observe(BatchResult("m", "big", 32, 0.02, 0.99, late_rows=4))  # 12 % of big's rows late just now
    d = p.plan(shared_view(items(32, slo_s=0.05, variants=both, start_s=1.0)), 1.0)
    assert isinstance(d, Dispatch) and d.variant == "small"
    d = p.plan(shared_view(items(32, slo_s=0.05, variants=both, start_s=3.0)), 3.0)  # a window later
    assert isinstance(d, Dispatch) and d.variant == "big"


def test_shared_replicas_admission_counts_each_replica_once():
    """Two shared replicas, both busy until 30 ms, 60 rows ahead: admission prices them as two replicas of
    the variant an overload turns to (small: 1 + 0.1 n ms), each listed once, not once per variant."""
    from sloserve.batching.types import QueueView

    both = ("big", "small")
    its = items(60, slo_s=0.02, variants=both)
    busy = {"big": [0.03, 0.03], "small": [0.03, 0.03]}
    view = QueueView("m", its, {"big": 0, "small": 0}, 32, busy, shared=True)
    p = SLOPolicy(max_batch_size=32, latency_fn=two_variants, accuracy=ACC, calibrate=False)
    # 32 rows on one replica, 28 + this one on the other: done at 30 + 1 + 2.9 = 33.9 ms
    refused = p.admit(view, QueuedItem(98, 0.0, 0.033, variants=both), 0.0)
    assert refused is not None and refused.late_by_s[0] == pytest.approx(0.0009, abs=1e-5)
    assert p.admit(view, QueuedItem(99, 0.0, 0.034, variants=both), 0.0) is None
