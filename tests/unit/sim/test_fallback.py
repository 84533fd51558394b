"""A cheaper fallback variant on the same replicas: the batcher serves it only while the primary is
short, and swayam sizes its warm buffer with it (docs/simulator.md, "A fallback variant")."""

import numpy as np
import pytest

from sloserve.autoscaler.queueing import capacity_of, capacity_rps, replicas_needed
from sloserve.autoscaler.swayam import SwayamConfig, SwayamState, decide
from sloserve.autoscaler.types import RateWindow, ScalingSnapshot
from sloserve.sim.arrivals import Arrivals
from sloserve.sim.control import ModelSpec
from sloserve.sim.engine import SimConfig, simulate_requests
from sloserve.sim.fluid import simulate_fluid
from sloserve.sim.profiles import default_profiles, service_for

TABLE = default_profiles()
PRIMARY = service_for(TABLE, "gpt2-gen", "t4", slo_ms=1000)
WITH_FB = service_for(TABLE, "gpt2-gen", "t4", slo_ms=1000, fallback="distilgpt2-gen")


def _step(svc, mult: float, seg_s: float = 20.0) -> list[ModelSpec]:
    """Four fixed replicas: 0.8x their SLO capacity, then ``mult``x for ``seg_s``, then 0.8x again."""
    cap = capacity_rps(PRIMARY, 4)
    return [
        ModelSpec(
            "m",
            Arrivals(seg_s, np.array([0.8, mult, 0.8]) * cap),
            svc,
            "t4",
            min_replicas=4,
            max_replicas=4,
            initial_replicas=4,
        )
    ]


def _late(res) -> np.ndarray:
    r = res["records"][0]
    return 1.0 - r.minute_good / np.maximum(r.minute_total, 1)


def test_fallback_must_be_cheaper():
    with pytest.raises(KeyError, match="not faster"):
        service_for(TABLE, "distilgpt2-gen", "t4", slo_ms=1000, fallback="gpt2-gen")
    assert WITH_FB.fallback is not None and capacity_rps(WITH_FB.fallback, 4) > 1.45 * capacity_rps(PRIMARY, 4)


def test_request_level_the_real_batcher_serves_a_step_with_the_fallback_and_lets_go_after_it():
    cfg = SimConfig(seed=1, minute_s=20.0)
    without = simulate_requests(_step(PRIMARY, 1.3), "oracle", cfg)
    res = simulate_requests(_step(WITH_FB, 1.3), "oracle", cfg)
    assert _late(without)[1] > 0.5  # 30 % over capacity: most of the step is late on the primary alone
    late = _late(res)
    assert late[1] < 0.01 and late[2] < 0.01  # on time through the step, and recovered after it
    r = res["records"][0]
    step_requests = r.minute_total[1]
    # the least share that fits is (1/1 - 1/1.3) / (1 - cap_primary / cap_fallback), about 0.68
    assert 0.4 * step_requests < r.fallback < 0.8 * step_requests
    assert res["summary"]["fallback_share"] == pytest.approx(r.fallback / r.minute_total.sum())


def test_request_level_the_fallback_stays_idle_below_capacity():
    cap = capacity_rps(PRIMARY, 4)
    spec = ModelSpec(
        "m", Arrivals(60.0, np.array([0.7 * cap])), WITH_FB, "t4", min_replicas=4, max_replicas=4, initial_replicas=4
    )
    res = simulate_requests([spec], "oracle", SimConfig(seed=2))
    assert res["summary"]["slo_attainment"] == 1.0
    assert res["records"][0].fallback < 0.005 * res["records"][0].minute_total.sum()


def test_fluid_mixes_at_the_least_share_that_fits():
    res = simulate_fluid(_step(WITH_FB, 1.3), "oracle", SimConfig(seed=1, minute_s=20.0))
    without = simulate_fluid(_step(PRIMARY, 1.3), "oracle", SimConfig(seed=1, minute_s=20.0))
    assert _late(without)[1] > 0.5 and _late(res)[1] <= 0.0105
    r = res["records"][0]
    cl, cs = capacity_of(PRIMARY, 4), capacity_of(WITH_FB.fallback, 4)
    x = (1 / cl - 1 / (1.3 * cl)) / (1 / cl - 1 / cs)
    assert r.fallback == pytest.approx(x * r.minute_total[1], rel=0.05)
    far = simulate_fluid(_step(WITH_FB, 3.0), "oracle", SimConfig(seed=1, minute_s=20.0))
    assert _late(far)[1] > 0.5  # past the fallback's own capacity it is late too


def _snap(svc, target: int, rate: float, t0: float, t1: float) -> ScalingSnapshot:
    return ScalingSnapshot("m", target, target, svc, windows=(RateWindow("g0", t0, t1, rate * (t1 - t0), 1.0),))


def test_swayam_sizes_the_warm_buffer_with_the_fallback():
    cfg = SwayamConfig(season_periods_s=())
    high, low = capacity_rps(PRIMARY, 8) * 0.95, capacity_rps(PRIMARY, 5) * 0.9
    targets = {}
    for name, svc in (("primary", PRIMARY), ("fallback", WITH_FB)):
        st, target = SwayamState(), 8
        for k in range(12):  # two minutes at the high rate, then the rate falls
            rate = high if k < 6 else low
            d, st = decide(_snap(svc, target, rate, 10.0 * k, 10.0 * (k + 1)), cfg, st, now=10.0 * (k + 1))
            target = d.target_replicas
        targets[name] = target
    reasons = []
    st, target = SwayamState(), 8
    for k in range(12):  # the same, recording why the target moved
        rate = high if k < 6 else low
        d, st = decide(_snap(WITH_FB, target, rate, 10.0 * k, 10.0 * (k + 1)), cfg, st, now=10.0 * (k + 1))
        if d.target_replicas < target:
            reasons.append(d.reason)
        target = d.target_replicas
    assert reasons and set(reasons) == {"scale-in-to-fallback-buffer"}  # within the keep-alive: the cut
    need = replicas_needed(PRIMARY, low * 1.05)
    assert targets["primary"] >= 8  # the keep-alive and the hold keep the high level warm
    # with the fallback the buffer is what the fallback needs to cover the high level: fewer replicas
    assert need <= targets["fallback"] < targets["primary"]
    assert capacity_of(WITH_FB.fallback, targets["fallback"]) >= capacity_of(PRIMARY, 8) * 0.95
    off = SwayamConfig(season_periods_s=(), fallback_buffer=False)
    st, target = SwayamState(), 8
    for k in range(12):
        rate = high if k < 6 else low
        d, st = decide(_snap(WITH_FB, target, rate, 10.0 * k, 10.0 * (k + 1)), off, st, now=10.0 * (k + 1))
        target = d.target_replicas
    assert target == targets["primary"]  # fallback_buffer off: as without a fallback


def test_cli_pairs_fallback_classes_with_model_classes(tmp_path, capsys):
    from sloserve.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text("minute,a\n0,60\n1,60\n")
    base = [
        "sim",
        "--trace",
        str(trace),
        "--column",
        "a",
        "--mode",
        "fluid",
        "--autoscaler",
        "oracle",
        "--no-progress",
        "--out",
        str(tmp_path / "o"),
    ]
    with pytest.raises(SystemExit, match="one per model class"):
        main(base + ["--model-class", "gpt2-gen,bert-base", "--fallback-class", "distilgpt2-gen"])
    with pytest.raises(SystemExit, match="not faster"):
        main(base + ["--model-class", "distilgpt2-gen", "--fallback-class", "gpt2-gen"])
    assert main(base + ["--fallback-class", "distilgpt2-gen"]) == 0
    assert "fallback_share=" in capsys.readouterr().out


def test_the_sweeps_ratio_0_66_is_the_profiles_fallback():
    from sloserve.sim.fallback_sweep import with_fallback

    base, svc = with_fallback(0.66)
    assert base.fallback is None and base.curve == PRIMARY.curve
    for n in (1, 8, 64):
        assert svc.fallback.curve.at(n, "p50") == pytest.approx(WITH_FB.fallback.curve.at(n, "p50"))
        assert svc.fallback.curve.at(n, "p99") == pytest.approx(WITH_FB.fallback.curve.at(n, "p99"))
    assert with_fallback(0.5)[1].fallback.curve.at(8, "p50") < svc.fallback.curve.at(8, "p50")
