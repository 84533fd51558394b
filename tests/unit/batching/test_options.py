"""Serving options across device types: keys, ordering, dominated pairs, and the policies choosing a
(variant, device type) pair per batch. Explicit ``now`` everywhere, no clock."""

import pytest
from batching_factories import view

from sloserve.batching import make_policy
from sloserve.batching.options import is_option_key, option_key, plan_from_profiles, plan_options, split_key, variant_of
from sloserve.batching.policies.slo import SLOPolicy
from sloserve.batching.profile import ProfileTable
from sloserve.batching.types import BatchResult, Dispatch, QueuedItem

# ms at 1 and 32 rows (p50, p99): big is 4x faster on the gpu; small runs only on the cpu here
POINTS = {
    ("m", "big", "gpu"): ([1, 32], [1.0, 2.0], [1.0, 2.0]),
    ("m", "big", "cpu"): ([1, 32], [4.0, 20.0], [4.0, 20.0]),
    ("m", "small", "cpu"): ([1, 32], [1.0, 3.0], [1.0, 3.0]),
    ("m", "small", "gpu"): ([1, 32], [1.5, 2.5], [1.5, 2.5]),  # slower than big on the gpu: dominated
}
ACC = {"big": 0.95, "small": 0.85}
KEYS = ("big@gpu", "big@cpu", "small@cpu")


def table() -> ProfileTable:
    return ProfileTable.from_points(POINTS, {("m", v): a for v, a in ACC.items()})


def pair_policy(**kw) -> SLOPolicy:
    return SLOPolicy(
        max_batch_size=32,
        profile=table(),
        model="m",
        variants=list(KEYS),
        accuracy={k: ACC[variant_of(k)] for k in KEYS},
        calibrate=kw.pop("calibrate", False),
        **kw,
    )


def req(i: int, deadline_s: float, arrival_s: float = 0.0, keys=KEYS) -> QueuedItem:
    return QueuedItem(i, arrival_s, deadline_s, variants=keys)


def test_keys_split_and_join():
    assert option_key("big", "t4") == "big@t4"
    assert split_key("big@t4", "cpu") == ("big", "t4")
    assert split_key("big", "cpu") == ("big", "cpu")
    assert variant_of("big@t4") == "big" and variant_of("big") == "big"
    assert is_option_key("big@t4") and not is_option_key("big")
    with pytest.raises(ValueError, match="must not contain"):
        option_key("a@b", "cpu")


def test_plan_orders_types_fastest_first_and_drops_dominated_options():
    plan = plan_from_profiles(table(), "m", ACC, ["cpu", "gpu"], 32)
    assert plan.keys == KEYS  # big: gpu before cpu (1 ms vs 4 ms at one row)
    assert plan.dropped == (("small@gpu", "big@gpu"),)
    assert plan.device_types() == ("gpu", "cpu")
    assert plan.of_variant("big") == ("big@gpu", "big@cpu")


def test_an_option_faster_at_some_size_is_kept():
    lat = {("big", "gpu"): (2.0, 2.0), ("small", "gpu"): (1.0, 3.0)}  # small faster at one row only
    plan = plan_options(["big", "small"], ACC, ["gpu"], lambda v, d, n: lat[(v, d)][n > 1], [1, 8])
    assert plan.keys == ("big@gpu", "small@gpu") and plan.dropped == ()


def test_an_option_without_a_profile_is_never_dropped_and_ranks_last():
    def lat(v, d, n):
        return None if d == "t4" else 1.0

    plan = plan_options(["big", "small"], ACC, ["t4", "cpu"], lat, [1])
    # small@cpu is as fast as big@cpu (not faster anywhere): dropped; nothing is known of t4
    assert plan.keys == ("big@cpu", "big@t4", "small@t4")
    assert plan.dropped == (("small@cpu", "big@cpu"),)


def test_best_pair_serves_while_it_meets_the_deadlines():
    p = pair_policy()
    d = p.plan(view([req(0, 0.010)], idle={k: 1 for k in KEYS}), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "big@gpu" and p.level == 0


def test_a_slower_type_of_the_best_variant_takes_the_overflow():
    p = pair_policy()
    # big@gpu busy until 9 ms; the head is due at 8 ms: big on the cpu (4 ms) still makes it
    its = [req(0, 0.008)]
    d = p.plan(view(its, idle={"big@gpu": 0, "big@cpu": 1, "small@cpu": 1}, busy={"big@gpu": [0.009]}), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "big@cpu"


def test_a_cheaper_variant_when_no_type_of_the_best_makes_it():
    p = pair_policy()
    # big@gpu busy until 5 ms; due at 3 ms: big@cpu (4 ms) cannot, small@cpu (1 ms) can
    its = [req(0, 0.003)]
    d = p.plan(view(its, idle={"big@gpu": 0, "big@cpu": 1, "small@cpu": 1}, busy={"big@gpu": [0.005]}), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "small@cpu"


def test_under_sustained_load_the_choice_falls_and_comes_back():
    """A fake-clock run: a burst far over big@gpu's capacity spreads batches over the slower type
    and the cheaper variant; once it is over, the best pair serves alone again."""
    p = pair_policy()
    replicas = dict.fromkeys(KEYS, 1)
    busy: dict[str, float] = {}
    queue: list[QueuedItem] = []
    chosen: dict[str, list[str]] = {"burst": [], "after": []}
    rid = 0
    now = 0.0
    step = 0.0002
    while now < 0.4:
        phase = "burst" if now < 0.2 else "after"
        per_step = 6 if phase == "burst" else (1 if int(now / step) % 40 == 0 else 0)
        for _ in range(per_step):
            queue.append(req(rid, now + 0.006, now))
            rid += 1
        for _ in range(4):
            idle = {k: replicas[k] - (busy.get(k, 0.0) > now) for k in KEYS}
            d = p.plan(view(list(queue), idle=idle, busy={k: [t] for k, t in busy.items() if t > now}), now)
            if type(d) is not Dispatch and not hasattr(d, "late_by_s"):
                break
            ids = set(d.ids)
            queue = [q for q in queue if q.id not in ids]
            if type(d) is Dispatch:
                dur = p.lat.latency_s(d.variant, len(d.ids))
                busy[d.variant] = now + dur
                chosen[phase].append(d.variant)
                p.observe(BatchResult("m", d.variant, len(d.ids), dur, now + dur, device_type="x"))
        now += step
    assert set(chosen["burst"]) >= {"big@gpu", "big@cpu", "small@cpu"}
    tail = chosen["after"][-5:]
    assert tail and set(tail) == {"big@gpu"}


def test_the_calibrator_learns_each_pair_under_its_own_key():
    p = pair_policy(calibrate=True)
    assert p.calibrator is not None
    for i in range(10):
        p.observe(BatchResult("m", "big@cpu", 1, 0.008, float(i), device_type="ignored"))
    assert p.calibrator.samples(("m", "big", "cpu")) == 10
    assert p.calibrator.samples(("m", "big", "gpu")) == 0
    assert p.lat.latency_s("big@cpu", 1) > p.lat.latency_s("big@gpu", 1)


def test_a_pinned_type_is_honoured():
    p = pair_policy()
    d = p.plan(view([req(0, 0.050, keys=("big@cpu",))], idle={k: 1 for k in KEYS}), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "big@cpu"


@pytest.mark.parametrize("name", ["timeout", "fixed", "aimd", "nexus"])
def test_other_policies_serve_option_keys(name):
    kw = {"max_batch_size": 8, "default_variant": KEYS[0]}
    if name == "nexus":
        kw.update(profile=table(), model="m", slo_ms=20.0)
    if name == "aimd":
        kw.update(slo_ms=20.0)
    p = make_policy(name, **kw)
    its = [req(i, 0.02) for i in range(8)]
    d = p.plan(view(its, idle={k: 1 for k in KEYS}, max_batch_size=8), 0.0)
    assert isinstance(d, Dispatch) and d.variant == "big@gpu"
    p.observe(BatchResult("m", d.variant, len(d.ids), 0.002, 0.002, device_type="gpu"))
