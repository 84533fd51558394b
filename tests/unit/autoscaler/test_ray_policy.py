"""The Ray adapter, called with an AutoscalingContext built the way Ray 2.60's controller builds it."""

import json

import pytest
from ray.serve._private.autoscaling_state import _resolve_policy_callable
from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy

from sloserve.autoscaler.typesplit import rank_types
from sloserve.gateway.backends.ray_policy import STATE_KEY, SwayamRayPolicy

KWARGS = {
    "slo_ms": 100,
    "max_batch_size": 16,
    "batch_sizes": [1, 16],
    "p99_ms": [10, 40],
    "swayam": {"startup_s": 5, "interval_s": 1, "keep_alive_s": 30},
}


def make_ctx(config, *, now, rate_by_gw, current=1, target=1, state=None, ongoing=0.0):
    dep = DeploymentID(name="heavy", app_name="default")
    replicas = [ReplicaID(unique_id=f"r{i}", deployment_id=dep) for i in range(current)]
    metrics = {}
    for gw, (rate, share) in rate_by_gw.items():
        metrics[f"sloserve_rate_rps/{gw}"] = {r: rate for r in replicas}
        metrics[f"sloserve_share/{gw}"] = {r: share for r in replicas}
    # keyword for keyword as ray/serve/_private/autoscaling_state.py get_autoscaling_context
    return AutoscalingContext(
        deployment_id=dep,
        deployment_name=dep.name,
        app_name=dep.app_name,
        current_num_replicas=len(replicas),
        target_num_replicas=target,
        running_replicas=replicas,
        total_num_requests=lambda: ongoing,
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas,
        policy_state=dict(state or {}),
        current_time=now,
        config=config,
        total_queued_requests=lambda: 0.0,
        aggregated_metrics=lambda: metrics,
        raw_metrics=dict,
        last_scale_up_time=None,
        last_scale_down_time=None,
    )


def ray_config(kwargs=None):
    return AutoscalingConfig(
        min_replicas=1,
        max_replicas=50,
        upscale_delay_s=0,
        downscale_delay_s=0,
        policy=AutoscalingPolicy(policy_function=SwayamRayPolicy, policy_kwargs=kwargs or KWARGS),
    )


def test_direct_call_scales_with_partial_views():
    cfg = ray_config()
    policy = SwayamRayPolicy(**KWARGS)
    low, state = policy(make_ctx(cfg, now=100.0, rate_by_gw={"gw0": (20.0, 0.5), "gw1": (20.0, 0.5)}))
    assert low == 1 and STATE_KEY in state
    # one gateway of two reports 400 rps: the aggregate is 800 rps
    high, state = policy(make_ctx(cfg, now=101.0, rate_by_gw={"gw0": (400.0, 0.5)}, state=state))
    assert high >= 3
    assert abs(state[STATE_KEY]["history"][-1][1] - 800.0) < 1e-6


def test_through_rays_own_wrapper_and_keep_alive():
    # the keep-alive alone (no quantile hold of the recent needs, no seasonal term)
    cfg = ray_config({**KWARGS, "swayam": {**KWARGS["swayam"], "hold_quantile": 0, "season_periods_s": []}})
    policy = _apply_autoscaling_config(_resolve_policy_callable(cfg.policy))
    n, state = policy(make_ctx(cfg, now=0.0, rate_by_gw={"gw0": (600.0, 1.0)}))
    assert n >= 2  # one replica serves ~400 rps within the SLO
    peak = n
    # load drops: the replicas stay for the keep-alive (30 s), then go
    for t in range(1, 30):
        n, state = policy(
            make_ctx(cfg, now=float(t), rate_by_gw={"gw0": (10.0, 1.0)}, current=peak, target=peak, state=state)
        )
        assert n == peak, t
    for t in range(30, 100):
        n, state = policy(
            make_ctx(cfg, now=float(t), rate_by_gw={"gw0": (10.0, 1.0)}, current=n, target=n, state=state)
        )
    assert n == 1


def test_fallback_without_gateway_metrics():
    cfg = ray_config()
    policy = SwayamRayPolicy(**KWARGS)
    n, _ = policy(make_ctx(cfg, now=5.0, rate_by_gw={}, ongoing=200.0))
    assert n > 1


def test_state_json_round_trip_and_one_source_of_defaults():
    from sloserve.autoscaler.swayam import SwayamConfig, SwayamState
    from sloserve.gateway.backends.ray_policy import state_from_json, state_to_json

    st = SwayamState(((1.0, 2.0),), ((1.0, 3),), 2, ((1.0, 2.0),), ((1.0, 4),))
    assert state_from_json(state_to_json(st)) == st
    assert state_from_json({"history": [[1, 2]], "needs": [[1, 3]]}).season == ()  # an older state still loads
    policy = SwayamRayPolicy(**KWARGS)
    assert policy.config.keep_alive_s == 30  # what the deployment asks wins
    # the rest: the simulator's defaults, the same object model
    assert policy.config.model_dump(exclude={"keep_alive_s", "startup_s", "interval_s"}) == SwayamConfig().model_dump(
        exclude={"keep_alive_s", "startup_s", "interval_s"}
    )


def test_a_fallback_profile_shrinks_the_keep_alive_buffer():
    """Replicas that also hold a cheaper variant (shared_replicas): after a peak, the keep-alive keeps only
    what the cheaper variant needs to serve the peak again; without one it keeps the peak's replicas."""
    fb = {**KWARGS, "fallback_batch_sizes": [1, 16], "fallback_p99_ms": [3, 12]}
    assert SwayamRayPolicy(**fb).service.fallback is not None and SwayamRayPolicy(**KWARGS).service.fallback is None
    kept = {}
    for name, kw in (("plain", KWARGS), ("fallback", fb)):
        cfg = AutoscalingConfig(
            min_replicas=1,
            max_replicas=50,
            upscale_delay_s=0,
            downscale_delay_s=0,
            policy=AutoscalingPolicy(policy_function=SwayamRayPolicy, policy_kwargs=kw),
        )
        policy = _apply_autoscaling_config(_resolve_policy_callable(cfg.policy))
        peak, state = policy(make_ctx(cfg, now=0.0, rate_by_gw={"gw0": (900.0, 1.0)}))
        n = peak
        for t in range(1, 10):  # the load falls; within the keep-alive
            n, state = policy(
                make_ctx(cfg, now=float(t), rate_by_gw={"gw0": (100.0, 1.0)}, current=n, target=n, state=state)
            )
        kept[name] = (peak, n)
    assert kept["plain"][1] == kept["plain"][0] >= 3
    assert kept["fallback"][0] == kept["plain"][0]  # the peak itself is sized on the best variant
    assert kept["fallback"][1] < kept["plain"][1]


def test_the_gateway_passes_the_next_variant_down_as_the_fallback_of_a_shared_model(model_repo):
    from sloserve.gateway.backends.ray import RayServeBackend
    from sloserve.gateway.config import load_settings
    from sloserve.models.repository import ModelRepository

    repo = ModelRepository(model_repo).load()
    # the shared deployment is the most accurate variant's, the least accurate has none below it: as
    # the build measured them here (digits' large or medium may come out on top)
    ranked = [v.name for v in repo.models["digits"].config.variants_by_accuracy]
    auto = {"min_replicas": 1, "max_replicas": 2}
    for shared in (True, False):
        s = load_settings(backend="ray", models={"digits": {"shared_replicas": shared, "autoscaling": auto}})
        b = RayServeBackend(repo, None, s)
        kw = b.autoscaling_config("digits", ranked[0])["policy"]["policy_kwargs"]
        assert ("fallback_p99_ms" in kw) is shared
        assert b.shared("digits") is shared
        assert "fallback_p99_ms" not in b.autoscaling_config("digits", ranked[-1])["policy"]["policy_kwargs"]


def test_calls_between_rounds_do_not_turn_a_step_into_a_trend():
    """Ray calls a policy several times a second: a step from 0 to 100 requests/s seen ten times a
    second plans as the same step seen once a round, not as a steep trend to extrapolate."""
    from sloserve.autoscaler.swayam import SwayamConfig, SwayamState, decide
    from sloserve.autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
    from sloserve.batching.profile import Curve

    svc = ServiceModel(Curve((1, 4), (0.021, 0.023), (0.024, 0.026)), slo_s=0.2, max_batch_size=4)
    cfg = SwayamConfig(burst_z=0)  # rounds of interval_s 10

    def snap(rate: float, target: int) -> ScalingSnapshot:
        w = (RateWindow("g", 0.0, 10.0, rate * 10, 1.0),)
        return ScalingSnapshot("m", target, target, svc, windows=w, max_replicas=50)

    def run(calls_per_s: float):
        state, target, d = SwayamState(), 1, None
        for t in range(0, 60, 10):  # a minute at 0
            d, state = decide(snap(0.0, target), cfg, state, now=float(t))
        t = 60.0
        while t < 65.0:  # then 100 requests/s
            d, state = decide(snap(100.0, target), cfg, state, now=t)
            t += 1 / calls_per_s
        return d

    often, once = run(10.0), run(0.2)
    assert often.planned_rps == pytest.approx(once.planned_rps, rel=0.05)
    assert often.target_replicas == once.target_replicas <= 3


# heavy/large on one CPU core: batch sizes, p50 and p99 (ms)
QUIET_LARGE = (
    [1, 2, 4, 8, 16, 32, 64],
    [1.2677, 1.6888, 1.9562, 2.595, 4.1601, 7.4224, 14.264],
    [1.4227, 1.8291, 2.1425, 3.4848, 4.5625, 7.6851, 17.0054],
)


def pin_profile(path, curve) -> None:
    """Replace a measured latency profile's curve with ``curve`` (batch sizes, p50s, p99s)."""
    doc = json.loads(path.read_text())
    sizes, p50, p99 = curve
    doc.update(
        batch_sizes=sizes,
        p50_ms=p50,
        p99_ms=p99,
        throughput_rps=[b / (x / 1e3) for b, x in zip(sizes, p50, strict=True)],
    )
    path.write_text(json.dumps(doc))


def test_each_type_of_the_best_variant_sizes_for_its_part_of_the_models_demand(model_repo, tmp_path):
    """heavy on the CPU and a type emulated 3x slower: both large deployments get the model's demand
    and the split (the CPU ranks first at equal prices); medium sizes on what it served, unsplit. The
    slower type stays at its minimum until the CPU is at its maximum."""
    from sloserve.gateway.backends.ray import RayServeBackend
    from sloserve.gateway.config import load_settings
    from sloserve.loadtests.emulated import add_emulated_profiles, emulated_type_repo
    from sloserve.models.repository import ModelRepository
    from sloserve.replica.runtime import device_type

    root = tmp_path / "repo"
    emulated_type_repo(model_repo, root, "heavy", "emul-slow", 3.0)
    # large's CPU profile fixed (a quiet 2-core build's), the emulated type's derived from it: the sizes
    # below follow from the profile, and a build measured on a busy machine profiles it 2x slower
    pin_profile(root / "heavy" / "large" / "profiles" / f"{device_type('cpu')}.json", QUIET_LARGE)
    add_emulated_profiles(root, "heavy", "emul-slow", 3.0)
    repo = ModelRepository(root).load()
    auto = {"min_replicas": 1, "max_replicas": 2}
    s = load_settings(
        backend="ray",
        repo=str(root),
        device_cost={"emul-slow": 0.5},
        models={"heavy": {"device_types": ["cpu", "emul-slow"], "autoscaling": auto}},
    )
    b = RayServeBackend(repo, None, s)
    cpu = device_type("cpu")
    kw = b.autoscaling_config("heavy", f"large@{cpu}")["policy"]["policy_kwargs"]
    assert kw["split"]["own"] == cpu and set(kw["split"]["types"]) == {cpu, "emul-slow"}
    assert kw["split"]["types"]["emul-slow"]["cost"] == 0.5 and kw["split"]["types"][cpu]["cost"] == 1.0
    slow_kw = b.autoscaling_config("heavy", "large@emul-slow")["policy"]["policy_kwargs"]
    assert slow_kw["split"]["own"] == "emul-slow"
    assert "split" not in b.autoscaling_config("heavy", f"medium@{cpu}")["policy"]["policy_kwargs"]
    assert b._stamp("heavy", "large@emul-slow")[1] == b._stamp("heavy", f"large@{cpu}")[1]  # both: the model's
    swayam = {"startup_s": 5, "interval_s": 1, "hold_quantile": 0, "season_periods_s": [], "noise_z": 0, "burst_z": 0}
    policies = {}
    for key, k in ((cpu, kw), ("emul-slow", slow_kw)):
        cfg = ray_config({**k, "swayam": swayam})
        policies[key] = (cfg, _apply_autoscaling_config(_resolve_policy_callable(cfg.policy)))
    ranked = SwayamRayPolicy(**{**kw, "swayam": swayam}).split
    first = rank_types(ranked.options)[0]
    low = 0.5 * first.bound_rps
    high = first.bound_rps + 0.5 * min(o.bound_rps for o in ranked.options if o is not first)
    for rate, want_other in ((low, 1), (high, 2)):
        got = {
            t: policy(make_ctx(cfg, now=1.0, rate_by_gw={"gw0": (rate, 1.0)}))[0]
            for t, (cfg, policy) in policies.items()
        }
        other = next(t for t in got if t != first.device_type)
        assert got[first.device_type] >= 1 and got[other] == want_other, (rate, got)
    assert got[first.device_type] == 2  # the best-ranked type at its maximum
