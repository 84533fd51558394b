"""A model on two device types in the fluid simulator: each lane sized for its part of the demand."""

from sloserve.autoscaler.types import ServiceModel
from sloserve.autoscaler.typesplit import TypeOption
from sloserve.batching.profile import Curve
from sloserve.sim.arrivals import Arrivals
from sloserve.sim.control import ModelSpec
from sloserve.sim.engine import SimConfig
from sloserve.sim.fluid import simulate_fluid
from sloserve.sim.typesize import lanes, route, type_report

FAST = ServiceModel(Curve((1, 32), (0.001, 0.004), (0.001, 0.004)), 0.05, 32)
SLOW = ServiceModel(Curve((1, 32), (0.004, 0.016), (0.004, 0.016)), 0.05, 32)


def test_route_fills_the_first_lane_to_its_capacity_and_spills_the_rest():
    assert route(10.0, [FAST, SLOW], [1, 1]) == [10.0, 0.0]
    r = route(1e6, [FAST, SLOW], [1, 1])
    assert r[1] > 0 and sum(r) == 1e6


def test_a_step_fills_the_cheap_type_to_its_max_before_the_dear_one_scales():
    # the slow type is 8x cheaper: the most requests/s per unit of cost, capped at 2 replicas
    opts = (TypeOption("slow", SLOW, 2000.0, 1.0, 2), TypeOption("fast", FAST, 8000.0, 8.0, 50))
    rates = [0.5 * opts[0].bound_rps] * 6 + [3.0 * opts[0].bound_rps] * 6
    spec = ModelSpec("m", Arrivals(10.0, rates), SLOW, min_replicas=1, initial_replicas=1)
    cfg = SimConfig(startup_s=0.0, tick_s=10.0, autoscaler_kwargs={"swayam": {"interval_s": 10.0, "startup_s": 0.0}})
    res = simulate_fluid(lanes(spec, opts), "swayam", cfg)
    recs = {r.name: r for r in res["records"]}
    slow, fast = recs["m@slow"].series_target, recs["m@fast"].series_target
    assert max(slow[:6]) <= 2 and max(fast[:6]) == 1  # the low level: the dear type at its minimum
    assert max(slow) == 2 and max(fast[6:]) > 1  # the step: the cheap type at its cap, the dear one grows
    rep = type_report(res["summary"], {"slow": 1.0, "fast": 8.0})
    assert set(rep) == {"m@slow", "m@fast"} and rep["m@fast"]["cost"] > 0
