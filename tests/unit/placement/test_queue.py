"""The training queue (sloserve/autoscaler/placement/queue.py): 2D-LAS with its starvation guard, FIFO, SRTF,
tenant shares, and the placement policy carrying out its preemptions. Time is an argument: no sleeps."""

from __future__ import annotations

import math

import pytest

from sloserve.autoscaler.placement.policy import apply_decision, decide
from sloserve.autoscaler.placement.queue import las_level, order, plan
from sloserve.autoscaler.placement.types import Gpu, PlacementConfig, PlacementSnapshot, PlacementState, QueueState
from tests.unit.placement.factories import job

LAS = PlacementConfig()  # two queues, 3,250 GPU-s, starvation at 4x the run time
T4 = {f"t{i}": "T4" for i in range(8)}


def entries(p):
    return [(e.job_id, e.action, e.reason) for e in p.entries]


def test_las_levels_follow_the_thresholds():
    assert [las_level(x, (100.0, 1000.0)) for x in (0, 99.9, 100, 999, 1000, 1e9)] == [0, 0, 1, 1, 2, 2]


def test_las_new_job_preempts_a_job_past_the_threshold():
    old = job("old", ["t0", "t1"], attained_gpu_s=4000.0, submit_time_s=0.0)  # 2 GPUs, in queue 1
    new = job("new", (), num_gpus=2, submit_time_s=100.0)
    p = plan([old, new], {"T4": 2}, T4, LAS, QueueState(), now_s=100.0)
    assert entries(p) == [("new", "start", "start"), ("old", "preempt", "priority")]
    assert [e.level for e in p.entries] == [0, 1]


def test_las_no_preemption_inside_a_queue():
    running = job("running", ["t0"], attained_gpu_s=100.0, submit_time_s=50.0)
    waiting = job("waiting", (), attained_gpu_s=0.0, submit_time_s=0.0)  # earlier, less service, same queue
    p = plan([running, waiting], {"T4": 1}, T4, LAS, QueueState(), now_s=60.0)
    assert entries(p) == [("running", "run", "running"), ("waiting", "wait", "no-capacity")]


def test_las_demotion_time_is_announced():
    j = job("j", ["t0", "t1"], attained_gpu_s=3000.0)
    p = plan([j], {"T4": 2}, T4, LAS, QueueState(), now_s=10.0)
    assert p.next_change_s == pytest.approx(10.0 + 250.0 / 2)  # 250 GPU-s left on 2 GPUs
    assert (
        plan([j], {"T4": 2}, T4, LAS.model_copy(update={"training_queue": "fifo"}), QueueState(), 10.0).next_change_s
        == math.inf
    )


def test_las_starvation_guard_promotes_to_the_top_queue():
    cfg = LAS.model_copy(update={"las_starvation_multiple": 2.0})
    ran = job("ran", ["t0"], attained_gpu_s=4000.0, submit_time_s=0.0)  # 4000 s run on one GPU
    _, state, _ = order([ran], cfg, QueueState(), now_s=4000.0)  # last seen running at 4000
    stopped = job("ran", (), attained_gpu_s=4000.0, submit_time_s=0.0)
    young = job("young", ["t0"], attained_gpu_s=10.0, submit_time_s=5000.0)
    p = plan([stopped, young], {"T4": 1}, T4, cfg, state, now_s=8000.0)
    assert entries(p) == [("young", "run", "running"), ("ran", "wait", "no-capacity")]
    assert p.next_change_s == pytest.approx(8000.0 + 3240.0)  # young is demoted first; ran starves at 12,000
    assert plan([stopped], {"T4": 1}, T4, cfg, state, now_s=8000.0).next_change_s == pytest.approx(12_000.0)
    young = job("young", ["t0"], attained_gpu_s=4010.0, submit_time_s=5000.0)  # demoted at 11,240
    p = plan([stopped, young], {"T4": 1}, T4, cfg, p.state, now_s=12_000.0)
    assert entries(p) == [("ran", "start", "start"), ("young", "preempt", "priority")]
    assert p.entries[0].level == 0 and p.state.promoted_gpu_s["ran"] == 4000.0
    # its queue now counts from the promotion: 3,250 GPU-s more before it is demoted again
    again = job("ran", ["t0"], attained_gpu_s=7250.0, submit_time_s=0.0)
    assert order([again], cfg, p.state, 15_000.0)[0][0][1] == 1
    assert order([job("ran", ["t0"], attained_gpu_s=7249.0)], cfg, p.state, 15_000.0)[0][0][1] == 0


def test_fifo_runs_the_head_and_preempts_backfill_for_it():
    cfg = LAS.model_copy(update={"training_queue": "fifo"})
    head = job("head", (), num_gpus=4, submit_time_s=0.0)
    fill = [job(f"f{i}", [f"t{i}"], submit_time_s=10.0 + i) for i in range(3)]
    p = plan([*fill, head], {"T4": 4}, T4, cfg, QueueState(), now_s=100.0)
    assert entries(p) == [("head", "start", "start")] + [(f"f{i}", "preempt", "priority") for i in range(3)]


def test_srtf_shortest_declared_first_unknown_last():
    cfg = LAS.model_copy(update={"training_queue": "srtf"})
    long = job("long", (), total_iterations=10_000, submit_time_s=0.0)
    short = job("short", (), total_iterations=100, submit_time_s=20.0)
    unknown = job("unknown", (), submit_time_s=-5.0)
    wide = job("wide", (), num_gpus=4, total_iterations=500, submit_time_s=30.0)  # 4 x 500 > 1 x 1000 ...
    mid = job("mid", (), total_iterations=1000, submit_time_s=40.0)
    ranked = [j.job_id for j, _ in order([long, short, unknown, wide, mid], cfg, QueueState(), 0.0)[0]]
    assert ranked == ["short", "mid", "wide", "long", "unknown"]  # GPU-seconds left, then the unknown


def test_tenant_at_its_share_waits_with_the_reason():
    cfg = LAS.model_copy(update={"tenant_shares": {"a": 0.5}})
    jobs = [
        job("a1", ["t0"], tenant="a", submit_time_s=0.0),
        job("a2", ["t1"], tenant="a", submit_time_s=1.0),
        job("a3", (), tenant="a", submit_time_s=2.0),
        job("b1", (), tenant="b", submit_time_s=3.0),
    ]
    p = plan(jobs, {"T4": 4}, T4, cfg, QueueState(), now_s=10.0)
    assert entries(p) == [
        ("a1", "run", "running"),
        ("a2", "run", "running"),
        ("a3", "wait", "tenant-share"),  # a holds 2 of 4 harvested GPUs: its share
        ("b1", "start", "start"),  # b has no cap
    ]
    star = LAS.model_copy(update={"tenant_shares": {"*": 0.25}})
    assert entries(plan(jobs, {"T4": 4}, T4, star, QueueState(), 10.0))[2:] == [
        ("a3", "wait", "tenant-share"),
        ("b1", "start", "start"),
    ]


def test_bad_queue_config_is_refused():
    with pytest.raises(ValueError, match="increasing"):
        PlacementConfig(las_thresholds_gpu_s=(100.0, 50.0))
    with pytest.raises(ValueError, match="tenant_shares"):
        PlacementConfig(tenant_shares={"a": 1.5})
    with pytest.raises(ValueError):
        PlacementConfig(training_queue="sjf")


def test_placement_preempts_for_the_queue_then_starts_the_job_on_the_freed_gpus():
    gpus = (Gpu("t0", "T4", 16384), Gpu("t1", "T4", 16384))
    old = job("old", ["t0", "t1"], attained_gpu_s=9000.0, iteration_time_s=0.1, checkpoint_write_s=0.1)
    new = job("new", (), num_gpus=1, submit_time_s=50.0)
    snap = PlacementSnapshot(gpus, jobs=(old, new))
    d, s = decide("cost-aware", snap, LAS, PlacementState(), 50.0)
    assert [(p.job_id, p.reason) for p in d.preempt] == [("old", "priority")]
    assert d.start_training == ()  # its GPUs are still held by the job being preempted
    assert [(e.job_id, e.action, e.reason) for e in d.training_queue] == [
        ("new", "wait", "waiting-for-gpus"),
        ("old", "preempt", "priority"),
    ]
    after = apply_decision(snap, d, LAS, 50.0)  # old is back in the queue, its GPUs free
    d2, _ = decide("cost-aware", after, LAS, s, 51.0)
    got = {t.job_id: t.gpu_ids for t in d2.start_training}
    assert list(got) == ["new"] and d2.preempt == ()
    assert [(e.job_id, e.action) for e in d2.training_queue] == [("new", "start"), ("old", "wait")]


def test_static_never_preempts_for_the_queue():
    gpus = (Gpu("t0", "T4", 16384), Gpu("t1", "T4", 16384))
    snap = PlacementSnapshot(
        gpus, jobs=(job("old", ["t0", "t1"], attained_gpu_s=9000.0), job("new", (), submit_time_s=5.0))
    )
    cfg = LAS.model_copy(update={"static_inference_gpus": {"T4": 0}})
    d, _ = decide("static", snap, cfg, PlacementState(), 10.0)
    assert d.preempt == () and d.start_training == ()
    assert [(e.job_id, e.action) for e in d.training_queue] == [("new", "wait"), ("old", "run")]


# ---------------------------------------------------------------- elastic jobs (min_gpus)


def gangs(p):
    return [(e.job_id, e.action, e.reason, e.gpus) for e in p.entries]


def test_elastic_job_starts_on_what_is_left_instead_of_waiting_whole():
    rigid = job("rigid", (), num_gpus=4, submit_time_s=0.0)
    elastic = job("elastic", (), num_gpus=4, min_gpus=2, submit_time_s=0.0)
    assert gangs(plan([rigid], {"T4": 3}, T4, LAS, QueueState(), 1.0)) == [("rigid", "wait", "no-capacity", 0)]
    assert gangs(plan([elastic], {"T4": 3}, T4, LAS, QueueState(), 1.0)) == [("elastic", "start", "start", 3)]
    assert gangs(plan([elastic], {"T4": 1}, T4, LAS, QueueState(), 1.0)) == [("elastic", "wait", "no-capacity", 0)]


def test_elastic_job_shrinks_for_a_job_ahead_and_grows_back_into_idle_gpus():
    # 'old' ran long on 4 GPUs (queue 1); 'new' (queue 0) needs 2: old keeps 2 instead of stopping
    old = job("old", ["t0", "t1", "t2", "t3"], num_gpus=4, min_gpus=2, attained_gpu_s=9000.0)
    new = job("new", (), num_gpus=2, submit_time_s=10.0)
    assert gangs(plan([old, new], {"T4": 4}, T4, LAS, QueueState(), 10.0)) == [
        ("new", "start", "start", 2),
        ("old", "resize", "shrink", 2),
    ]
    rigid = job("old", ["t0", "t1", "t2", "t3"], num_gpus=4, attained_gpu_s=9000.0)
    assert gangs(plan([rigid, new], {"T4": 4}, T4, LAS, QueueState(), 10.0))[1] == ("old", "preempt", "priority", 0)
    # later, on 2 GPUs with 2 idle beside it: it grows back to its gang
    small = job("old", ["t0", "t1"], num_gpus=4, min_gpus=2, attained_gpu_s=9000.0)
    assert gangs(plan([small], {"T4": 4}, T4, LAS, QueueState(), 20.0)) == [("old", "resize", "grow", 4)]
    # (a queue that never preempts keeps it on its gang)
    assert gangs(plan([small], {"T4": 4}, T4, LAS, QueueState(), 20.0, preempt=False)) == [("old", "run", "running", 2)]
    # ...but not into GPUs a waiting job behind it takes
    waiting = job("waiting", (), num_gpus=2, attained_gpu_s=9500.0, submit_time_s=15.0)
    assert gangs(plan([small, waiting], {"T4": 4}, T4, LAS, QueueState(), 20.0)) == [
        ("old", "run", "running", 2),
        ("waiting", "start", "start", 2),
    ]


def test_elastic_job_stays_within_its_tenant_share():
    cfg = LAS.model_copy(update={"tenant_shares": {"a": 0.5}})
    j = job("j", (), num_gpus=8, min_gpus=2, tenant="a")
    assert gangs(plan([j], {"T4": 8}, T4, cfg, QueueState(), 1.0)) == [("j", "start", "start", 4)]
    running = job("j", ["t0", "t1", "t2", "t3"], num_gpus=8, min_gpus=2, tenant="a")
    assert gangs(plan([running], {"T4": 8}, T4, cfg, QueueState(), 1.0)) == [("j", "run", "running", 4)]


def test_placement_restarts_a_shrunk_elastic_job_on_fewer_gpus():
    gpus = tuple(Gpu(f"t{i}", "T4", 16384) for i in range(4))
    old = job("old", ["t0", "t1", "t2", "t3"], num_gpus=4, min_gpus=1, attained_gpu_s=9000.0)
    new = job("new", (), num_gpus=3, submit_time_s=50.0)
    snap = PlacementSnapshot(gpus, jobs=(old, new))
    d, s = decide("cost-aware", snap, LAS, PlacementState(), 50.0)
    assert [(p.job_id, p.reason) for p in d.preempt] == [("old", "resize")]
    after = apply_decision(snap, d, LAS, 50.0)
    d2, _ = decide("cost-aware", after, LAS, s, 51.0)
    assert sorted((t.job_id, len(t.gpu_ids)) for t in d2.start_training) == [("new", 3), ("old", 1)]
