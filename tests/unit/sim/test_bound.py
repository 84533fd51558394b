"""sloserve.sim.bound: the hindsight-tuned reactive bound on what a causal autoscaler can reach."""

import doctest

import numpy as np
import pytest

import sloserve.sim.bound
from sloserve.sim.arrivals import Arrivals
from sloserve.sim.bound import bound, hindsight_rate
from sloserve.sim.engine import SimConfig
from sloserve.sim.profiles import default_profiles, service_for
from sloserve.sim.run import make_spec

SVC = service_for(default_profiles(), "gpt2-gen", "t4", slo_ms=1000)


def test_doctests():
    assert doctest.testmod(sloserve.sim.bound).failed == 0


def test_hindsight_rate_sees_only_the_past():
    r = np.array([10.0, 50.0, 10.0, 10.0])
    assert hindsight_rate(r, 60.0, 59.0, 30.0) == 10.0  # the rise at 60 s is not seen before it happens
    assert hindsight_rate(r, 60.0, 60.0, 30.0) == 50.0
    assert hindsight_rate(r, 60.0, 150.0, 60.0) == 50.0  # (90, 150] reaches back into the peak minute
    assert hindsight_rate(r, 60.0, 180.0, 60.0) == 10.0
    assert hindsight_rate(r, 60.0, 10_000.0, 60.0) == 10.0  # past the end: the last interval
    with pytest.raises(ValueError, match="must exceed the look-ahead"):  # it would read the rate after now
        hindsight_rate(r, 60.0, 150.0, 60.0, seasonal_period_s=20.0, horizon_s=20.0)


def _spec(rates):
    return make_spec("m", Arrivals(60.0, np.asarray(rates, float)), SVC, "t4", peak_replicas=4)


def test_a_flat_trace_costs_what_the_oracle_does():
    res = bound(_spec([100.0] * 20), SimConfig(seed=0), lookbacks_s=(60.0,), margins=(0.0, 0.1))
    assert res["best"]["margin"] == 0.0 and abs(res["best"]["vs_oracle"] - 1.0) < 0.02


def test_unseen_steps_cost_a_reactive_policy_more_than_the_oracle():
    # a step to 3x for one minute in every five: the oracle pays for it only while it lasts
    rates = [60.0 if i % 5 else 180.0 for i in range(40)]
    res = bound(_spec(rates), SimConfig(seed=0), lookbacks_s=(60.0, 300.0), margins=(0.0, 0.5, 1.0, 2.0))
    assert res["oracle"]["minutes_sla_met_fraction"] >= 0.99
    assert res["best"] is not None and res["best"]["vs_oracle"] > 1.3
    # a perfect seasonal term sees the next step coming (after its first period): close to the oracle again
    rates = rates * 3
    seas = bound(_spec(rates), SimConfig(seed=0), lookbacks_s=(10.0, 60.0), margins=(0.0, 0.1), seasonal_period_s=300.0)
    assert seas["best"] is not None and seas["best"]["vs_oracle"] < 1.1


def test_when_nothing_meets_the_sla_the_closest_run_is_kept():
    rates = [60.0 if i % 5 else 180.0 for i in range(40)]
    res = bound(_spec(rates), SimConfig(seed=0), lookbacks_s=(10.0,), margins=(0.0, 0.1))
    assert res["best"] is None
    (row,) = res["per_lookback"]
    assert row["met"] is False and 0.0 < row["minutes_sla_met_fraction"] < 0.99 and row["margin"] in (0.0, 0.1)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lookbacks-s", "abc"], "give positive seconds"),
        (["--lookbacks-s", "0,60"], "every look-back must be > 0 s"),
        (["--seasonal-period-s", "5"], "must exceed start-up"),
        (["--peak-replicas", "0"], "must be >= 1"),
        (["--startup-s", "-1"], "must be >= 0"),
        (["--column", "nope"], "no column 'nope'"),
        (["--device", "h999"], "no profile for gpt2-gen on h999"),
        (["--trace", "/nonexistent.csv"], "No such file"),
    ],
)
def test_bad_arguments_are_one_line_errors_before_any_run(tmp_path, capsys, args, message):
    from sloserve.sim.bound import main

    trace = tmp_path / "t.csv"
    trace.write_text("minute,a\n0,60\n1,120\n")
    with pytest.raises(SystemExit) as e:
        main(["--trace", str(trace), "--column", "a", *args])
    assert e.value.code == 2 and message in capsys.readouterr().err
