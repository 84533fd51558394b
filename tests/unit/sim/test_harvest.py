"""The harvest hook (sloserve/sim/harvest.py): capacity, inference first, bounded lost work, determinism, golden."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sloserve.autoscaler.placement.types import PlacementConfig
from sloserve.sim.harvest import HarvestConfig, HarvestPlacement
from sloserve.sim.training_trace import JobSpec, load_training_jobs

PCFG = PlacementConfig(pack_small_replicas=False, substitute_types=False, preempt_grace_s=1.0, restart_overhead_s=30.0)
TYPES = {"m0": "t4", "m1": "t4", "m2": "a100"}
GPUS = {"t4": 10, "a100": 6}


def _jobs(seed: int, n: int = 40) -> list[JobSpec]:
    rng = np.random.default_rng(seed)
    return [
        JobSpec(
            f"j{i}",
            float(rng.uniform(0, 2500)),
            float(rng.choice([60, 300, 900, 2000, 7200])),
            int(rng.choice([1, 1, 1, 2, 4])),
        )
        for i in range(n)
    ]


def _drive(policy: str, seed: int, rounds: int = 100, tick_s: float = 30.0, checks=None) -> HarvestPlacement:
    rng = np.random.default_rng(seed + 100)
    hcfg = HarvestConfig(
        gpus=GPUS, iteration_time_s=(0.5, 3.0), checkpoint_every_s=300.0, checkpoint_write_s=5.0, seed=seed
    )
    h = HarvestPlacement(policy, _jobs(seed), TYPES, hcfg, PCFG)
    holding = {m: 0 for m in TYPES}
    for k in range(rounds):
        wants = {"m0": int(rng.integers(0, 7)), "m1": int(rng.integers(0, 6)), "m2": int(rng.integers(0, 8))}
        grant = h.allocate(wants, holding, now_s=k * tick_s)
        if checks:
            checks(h, wants, grant)
        holding = grant
    h.advance(rounds * tick_s + 10_000)
    return h


@pytest.mark.parametrize("policy", ["cost-aware", "cost-blind", "static", "none"])
def test_never_over_allocates(policy):
    def check(h, wants, grant):
        assert h.check() == []
        assert all(0 <= grant[m] <= wants[m] for m in wants)
        inf, train = h._usage
        assert inf + train <= sum(GPUS.values())

    _drive(policy, seed=1, checks=check)


@pytest.mark.parametrize("policy", ["cost-aware", "cost-blind"])
def test_inference_wants_are_served_first(policy):
    served = []

    def check(h, wants, grant):
        per_type = {ty: sum(n for m, n in wants.items() if TYPES[m] == ty) for ty in GPUS}
        if all(per_type[ty] <= GPUS[ty] for ty in GPUS):  # capacity allows: every replica placed
            assert grant == wants
            served.append(1)

    h = _drive(policy, seed=2, checks=check)
    assert len(served) > 60
    assert h.preemptions > 0  # inference really did take GPUs back from training


@pytest.mark.parametrize("policy", ["cost-aware", "cost-blind"])
def test_lost_work_per_preemption_at_most_one_checkpoint_interval(policy):
    h = _drive(policy, seed=3)
    rep = h.report()
    assert rep["preemptions"] > 10
    assert rep["lost_per_preemption_intervals_max"] <= 1.0 + 1e-9
    assert rep["lost_work_gpu_hours"] > 0
    assert 0 <= rep["harvest_fraction"] <= 1.0 + 1e-9


def test_cost_aware_loses_less_than_cost_blind():
    a = _drive("cost-aware", seed=4).report()
    b = _drive("cost-blind", seed=4).report()
    assert a["lost_per_preemption_intervals_mean"] < b["lost_per_preemption_intervals_mean"]


def test_deterministic_under_a_seed():
    a = json.dumps(_drive("cost-blind", seed=5).report(), sort_keys=True)
    b = json.dumps(_drive("cost-blind", seed=5).report(), sort_keys=True)
    assert a == b


def test_golden_two_jobs_one_preemption():
    """4 T4s, one model; job j1 (2 GPUs, 3600 s) and j2 (1 GPU, 3600 s); iterations of 1 s,
    checkpoint every 600 s of work (10 s to write), grace 1 s, restart 30 s. Worked by hand:

    t=0     m wants 2: replicas on 2 GPUs; j1 (LAS tie -> id order) takes the other 2, j2 waits.
    t=700   m wants 3: j1 preempted; killed at 701 with 691 s done, checkpoint at 600: loses 91 s x 2 GPUs.
    t=760   j1's GPUs are back: j2 (least attained service) starts on the free one.
    t=1000  m wants 1: two replicas stop; j1 resumes from 600 s (+30 s restart): done at
            1030 + 4 x 610 + 600 = 4070; j2 started at 760 is done at 760 + 5 x 610 + 600 = 4410.
    """
    hcfg = HarvestConfig(gpus={"t4": 4}, iteration_time_s=(1.0, 1.0), checkpoint_every_s=600.0, checkpoint_write_s=10.0)
    h = HarvestPlacement(
        "cost-aware", [JobSpec("j1", 0.0, 3600.0, 2), JobSpec("j2", 0.0, 3600.0, 1)], {"m": "t4"}, hcfg, PCFG
    )
    assert h.allocate({"m": 2}, {"m": 0}, 0.0) == {"m": 2}
    assert [j.spec.job_id for j in h.jobs.values() if j.gpu_ids] == ["j1"]
    assert h.allocate({"m": 3}, {"m": 2}, 700.0) == {"m": 3}
    assert h.start_delay_s == {"m": 1.0}
    assert h.allocate({"m": 3}, {"m": 3}, 760.0) == {"m": 3}
    assert [j.spec.job_id for j in h.jobs.values() if j.gpu_ids] == ["j2"]
    assert h.allocate({"m": 1}, {"m": 3}, 1000.0) == {"m": 1}
    h.advance(10_000.0)
    rep = h.report()
    assert rep["preemptions"] == 1 and rep["preemptions_killed"] == 1
    assert rep["lost_work_gpu_hours"] == pytest.approx(182 / 3600)
    assert rep["lost_per_preemption_intervals_max"] == pytest.approx(91 / 600)
    assert {j.spec.job_id: j.finished_s for j in h.done} == {"j1": 4070.0, "j2": 4410.0}
    assert rep["jct_mean_s"] == pytest.approx(4240.0)
    # training held j1: 2 x (701 + 3070), j2: 3650 GPU-seconds
    assert rep["training_gpu_hours"] == pytest.approx((2 * (701 + 3070) + 3650) / 3600)
    # inference: 2 GPUs to 701 (its 3rd replica waits on j1's GPU), 3 to 1000, then 1
    assert rep["inference_gpu_hours"] == pytest.approx((2 * 701 + 3 * 299 + 9000) / 3600)
    assert rep["idle_gpu_hours"] == pytest.approx(4 * 10_000 / 3600 - rep["inference_gpu_hours"])


def test_training_trace_slice_and_backlog(tmp_path):
    p = tmp_path / "jobs.csv"
    p.write_text("s,d,g\n0,100,1\n50,500,2\n200,10,1\n400,5,8\n")
    jobs = load_training_jobs(
        str(p), start_s=100, window_s=400, submit_col="s", duration_col="d", gpus_col="g", time_scale=0.5, max_gpus=4
    )
    assert [(j.job_id, j.submit_s, j.work_s, j.num_gpus) for j in jobs] == [
        ("b1", 0.0, 450.0, 2),
        ("j2", 50.0, 10.0, 1),
        ("j3", 150.0, 5.0, 4),
    ]
    assert not load_training_jobs(
        str(p), start_s=100, window_s=400, submit_col="s", duration_col="d", gpus_col="g", backlog=False
    )[0].job_id.startswith("b")
    with pytest.raises(ValueError):
        load_training_jobs(str(p))


def test_cli_harvest_writes_the_goal_metrics(tmp_path):
    from sloserve.cli import main

    trace = tmp_path / "jobs.csv"
    trace.write_text("submit,dur,gpus\n" + "".join(f"{i * 20},{600 + 37 * i},{1 + i % 2}\n" for i in range(30)))
    out = tmp_path / "out"
    rc = main(
        [
            "sim",
            "--synthetic",
            "diurnal",
            "--rate",
            "40",
            "--duration-s",
            "900",
            "--model-class",
            "resnet50",
            "--device",
            "t4",
            "--slo-ms",
            "100",
            "--autoscaler",
            "swayam",
            "--mode",
            "fluid",
            "--tick-s",
            "30",
            "--training-trace",
            str(trace),
            "--training-submit-col",
            "submit",
            "--training-duration-col",
            "dur",
            "--training-gpus-col",
            "gpus",
            "--placement",
            "static,cost-aware",
            "--gpu-mix",
            "t4:8",
            "--checkpoint-every-s",
            "120",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    doc = json.loads((out / "result.json").read_text())
    assert set(doc["policies"]) == {"swayam/none", "swayam/static", "swayam/cost-aware"}
    for name, s in doc["policies"].items():
        for k in (
            "training_gpu_hours",
            "idle_gpu_hours",
            "preemptions",
            "lost_work_gpu_hours",
            "inference_slo_attainment",
            "jct_mean_s",
            "jobs_finished",
        ):
            assert k in s, (name, k)
        assert math.isclose(s["inference_gpu_hours"] + s["idle_gpu_hours"], 8 * 900 / 3600, rel_tol=1e-6)
    assert doc["policies"]["swayam/none"]["training_gpu_hours"] == 0
    assert doc["policies"]["swayam/cost-aware"]["training_gpu_hours"] > 0
    assert (out / "harvest.png").exists()


def _cli_args(trace, out, *extra):
    return [
        "sim",
        "--synthetic",
        "diurnal",
        "--rate",
        "40",
        "--duration-s",
        "900",
        "--model-class",
        "resnet50",
        "--device",
        "t4",
        "--slo-ms",
        "100",
        "--autoscaler",
        "swayam",
        "--mode",
        "fluid",
        "--tick-s",
        "30",
        "--training-trace",
        str(trace),
        "--training-submit-col",
        "submit",
        "--training-duration-col",
        "dur",
        "--training-gpus-col",
        "gpus",
        "--gpu-mix",
        "t4:8",
        "--checkpoint-every-s",
        "120",
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]


def test_cli_harvest_runs_each_training_queue_with_tenants(tmp_path):
    from sloserve.cli import main

    trace = tmp_path / "jobs.csv"
    trace.write_text(
        "submit,dur,gpus,team\n" + "".join(f"{i * 20},{600 + 37 * i},{1 + i % 2},{'ab'[i % 2]}\n" for i in range(30))
    )
    out = tmp_path / "out"
    extra = ["--placement", "none,cost-aware", "--training-queue", "las,fifo,srtf", "--training-tenant-col", "team"]
    assert main(_cli_args(trace, out, *extra, "--tenant-shares", "a:0.5")) == 0
    doc = json.loads((out / "result.json").read_text())
    assert set(doc["policies"]) == {
        "swayam/none",
        "swayam/cost-aware/las",
        "swayam/cost-aware/fifo",
        "swayam/cost-aware/srtf",
    }
    for q in ("las", "fifo", "srtf"):
        s = doc["policies"][f"swayam/cost-aware/{q}"]
        assert s["training_queue"] == q and s["training_gpu_hours"] > 0
        for k in ("jct_mean_s", "jct_p95_s", "jct_all_mean_s", "jct_all_p95_s", "harvest_fraction"):
            assert k in s, (q, k)
    assert doc["meta"]["harvest"]["tenant_shares"] == {"a": 0.5}


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--training-queue", "sjf"], "unknown training queue"),
        (["--tenant-shares", "a:2"], "tenant_shares"),
        (["--tenant-shares", "a"], "TENANT:SHARE"),
        (["--training-tenant-col", "vc"], "vc"),
    ],
)
def test_cli_harvest_bad_queue_input_is_a_clear_error(tmp_path, extra, says):
    from sloserve.cli import main

    trace = tmp_path / "jobs.csv"
    trace.write_text("submit,dur,gpus\n0,600,1\n")
    with pytest.raises(SystemExit, match=says):
        main(_cli_args(trace, tmp_path / "out", "--placement", "cost-aware", *extra))


def test_trace_tenant_column_and_backlog_service(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("s,d,g,vc\n0,1000,2,x\n150,10,1,\n")
    jobs = load_training_jobs(
        str(p), start_s=100, window_s=400, submit_col="s", duration_col="d", gpus_col="g", tenant_col="vc"
    )
    assert [(j.job_id, j.tenant, j.attained_gpu_s) for j in jobs] == [("b0", "x", 200.0), ("j1", "default", 0.0)]
