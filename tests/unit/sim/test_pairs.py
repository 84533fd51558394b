"""The pair choice in virtual time (sloserve/sim/pairs.py): on a burst over what the best pair carries, the
slo policy's pair per batch beats the best single variant and the best single pair in effective
accuracy, using the slower type and the cheaper variant only while the burst lasts."""

from sloserve.batching.options import variant_of
from sloserve.batching.profile import ProfileTable
from sloserve.sim.pairs import best_of, burst_arrivals, compare, systems_for

ACC = {"big": 0.95, "small": 0.80}
# ms (batch sizes, p50, p99): big is 3x faster on the gpu; small is cheap on the cpu
TABLE = ProfileTable.from_points(
    {
        ("m", "big", "gpu"): ([1, 8, 32], [2.0, 4.0, 10.0], [2.2, 4.4, 11.0]),
        ("m", "big", "cpu"): ([1, 8, 32], [6.0, 12.0, 30.0], [6.6, 13.2, 33.0]),
        ("m", "small", "cpu"): ([1, 8, 32], [0.5, 1.0, 2.5], [0.55, 1.1, 2.75]),
        ("m", "small", "gpu"): ([1, 8, 32], [2.5, 5.0, 12.0], [2.75, 5.5, 13.2]),  # dominated by big@gpu
    }
)


def test_systems_are_the_pairs_each_variant_and_each_single_pair():
    from sloserve.batching.options import plan_from_profiles

    plan = plan_from_profiles(TABLE, "m", ACC, ["gpu", "cpu"], 32)
    names = [s.name for s in systems_for(plan, {"gpu": 1, "cpu": 2})]
    assert names == ["pairs", "variant:big", "variant:small", "pair:big@gpu", "pair:big@cpu", "pair:small@cpu"]
    pairs = systems_for(plan, {"gpu": 1, "cpu": 2})[0]
    assert dict(pairs.replicas) == {"big@gpu": 1, "big@cpu": 2, "small@cpu": 2}


def test_pairs_beat_every_single_choice_under_a_burst():
    arrivals = burst_arrivals(1500.0, 3.0, 3.0, seed=3)
    res = compare(TABLE, "m", ACC, {"gpu": 1, "cpu": 1}, arrivals, 0.025, 32, seed=3)
    pairs = res["pairs"]
    best_variant, best_pair = best_of(res, "variant:"), best_of(res, "pair:")
    assert best_variant is not None and best_pair is not None
    assert pairs.effective_accuracy > best_variant.effective_accuracy
    assert pairs.effective_accuracy > best_pair.effective_accuracy
    assert pairs.attainment > 0.97
    # outside the burst (first and last thirds) the best pair answers (nearly) everything on time
    calm = [b for b in pairs.timeline if b["t"] < 0.9 or b["t"] >= 2.1]
    on_best = sum(b["on_time"]["big@gpu"] for b in calm)
    assert on_best >= 0.97 * sum(b["requests"] for b in calm)
    # in the burst the slower type and the cheaper variant take work
    burst = [b for b in pairs.timeline if 1.1 <= b["t"] < 1.9]
    assert sum(b["on_time"]["big@cpu"] for b in burst) > 0
    assert sum(b["on_time"]["small@cpu"] for b in burst) > 0


def test_a_run_is_deterministic_under_its_seed():
    arrivals = burst_arrivals(500.0, 3.0, 1.5, seed=1)
    a = compare(TABLE, "m", ACC, {"gpu": 1, "cpu": 1}, arrivals, 0.02, 32, seed=1, only=["pairs"])
    b = compare(TABLE, "m", ACC, {"gpu": 1, "cpu": 1}, arrivals, 0.02, 32, seed=1, only=["pairs"])
    assert a["pairs"].rows == b["pairs"].rows and {variant_of(k) for k in a["pairs"].rows} == {"big", "small"}


def test_types_are_sized_by_requests_per_cost():
    from sloserve.batching.options import plan_from_profiles
    from sloserve.sim.pairs import size_by_throughput

    plan = plan_from_profiles(TABLE, "m", ACC, ["gpu", "cpu"], 32)
    # big: ~3200 rows/s a gpu replica, ~1070 a cpu one (largest batch within half the 25 ms SLO)
    equal = size_by_throughput(TABLE, "m", plan, 6000.0, 0.025, 32)
    assert equal == {"gpu": 2, "cpu": 1}
    cheap_cpu = size_by_throughput(TABLE, "m", plan, 6000.0, 0.025, 32, cost={"gpu": 10.0, "cpu": 1.0})
    assert cheap_cpu["cpu"] > 1 and cheap_cpu["gpu"] == 1
