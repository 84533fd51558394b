"""Worked cases of the placement policies: type choice, substitution, packing, victims, queue order."""

from __future__ import annotations

import pytest

from sloserve.autoscaler.placement.cost import preemption_cost
from sloserve.autoscaler.placement.policy import apply_decision, decide, get_policy, static_partition
from sloserve.autoscaler.placement.types import (
    Gpu,
    PlacementConfig,
    PlacementSnapshot,
    PlacementState,
    Replica,
    ReplicaTarget,
)
from tests.unit.placement.factories import job

CFG = PlacementConfig(gpu_cost_per_hour={"T4": 1.0, "A100": 4.0})
THR = {("m", "v", "T4"): 100.0, ("m", "v", "A100"): 300.0}


def gpus(t4=2, a100=2):
    return tuple(Gpu(f"t{i}", "T4", 16384) for i in range(t4)) + tuple(Gpu(f"a{i}", "A100", 40960) for i in range(a100))


def test_any_type_goes_to_best_throughput_per_cost():
    snap = PlacementSnapshot(gpus(), targets=(ReplicaTarget("m", "v", None, 1, 4096),), replica_throughput_rps=THR)
    d, _ = decide("cost-aware", snap, CFG, PlacementState(), 0.0)
    assert [s.gpu_id for s in d.start_replicas] == ["t0"]  # 100/1 beats 300/4
    cheap_a100 = CFG.model_copy(update={"gpu_cost_per_hour": {"T4": 1.0, "A100": 2.0}})
    d, _ = decide("cost-aware", snap, cheap_a100, PlacementState(), 0.0)
    assert [s.gpu_id for s in d.start_replicas] == ["a0"]


def test_exhausted_type_is_substituted_throughput_equivalent():
    snap = PlacementSnapshot(
        gpus(t4=1, a100=2), targets=(ReplicaTarget("m", "v", "T4", 4, 4096),), replica_throughput_rps=THR
    )
    d, _ = decide("cost-aware", snap, CFG, PlacementState(), 0.0)
    # one T4, then 3 missing T4 replicas = 300 rps = one A100 replica
    assert sorted(s.gpu_id for s in d.start_replicas) == ["a0", "t0"]
    assert d.unplaced == ()
    off = CFG.model_copy(update={"substitute_types": False})
    d, _ = decide("cost-aware", snap, off, PlacementState(), 0.0)
    assert [(u.gpu_type, u.count) for u in d.unplaced] == [("T4", 3)]


def test_small_replica_packed_beside_training_instead_of_preempting():
    snap = PlacementSnapshot(
        gpus(t4=1, a100=0),
        targets=(ReplicaTarget("m", "v", "T4", 1, 1024),),
        jobs=(job("j", ["t0"], memory_mib=8192, done=55),),
    )
    d, _ = decide("cost-aware", snap, CFG, PlacementState(), 0.0)
    assert d.preempt == () and d.start_replicas[0].beside_job == "j"
    big = PlacementSnapshot(snap.gpus, targets=(ReplicaTarget("m", "v", "T4", 1, 8192),), jobs=snap.jobs)
    d, _ = decide("cost-aware", big, CFG, PlacementState(), 0.0)
    assert [p.job_id for p in d.preempt] == ["j"] and d.start_replicas[0].after_preempt == "j"


def test_victim_prefers_checkpointed_work_then_las():
    # iteration 3 s > 1 s grace: the job is killed, losing everything since its last checkpoint
    far = job("far", ["t0"], memory_mib=12288, iteration_time_s=3.0, done=99, interval=100)  # 99 its unsaved
    near = job("near", ["t1"], memory_mib=12288, iteration_time_s=3.0, done=101, interval=100)  # 1 it unsaved
    snap = PlacementSnapshot(gpus(a100=0), targets=(ReplicaTarget("m", "v", "T4", 1, 8192),), jobs=(far, near))
    d, _ = decide("cost-aware", snap, CFG, PlacementState(), 0.0)
    assert [p.job_id for p in d.preempt] == ["near"]
    # equal (graceful) cost: unknown durations -> the most attained service goes first (Tiresias)
    young = job("young", ["t0"], memory_mib=12288, attained_gpu_s=10.0)
    old = job("old", ["t1"], memory_mib=12288, attained_gpu_s=5000.0)
    snap = PlacementSnapshot(gpus(a100=0), targets=(ReplicaTarget("m", "v", "T4", 1, 8192),), jobs=(young, old))
    d, _ = decide("cost-aware", snap, CFG, PlacementState(), 0.0)
    assert [p.job_id for p in d.preempt] == ["old"]
    # predictable: the job with most remaining work goes first; the nearly finished one keeps running
    ending = job("ending", ["t0"], memory_mib=12288, done=990, total_iterations=1000)
    long = job("long", ["t1"], memory_mib=12288, done=10, total_iterations=100000)
    snap = PlacementSnapshot(gpus(a100=0), targets=(ReplicaTarget("m", "v", "T4", 1, 8192),), jobs=(ending, long))
    d, _ = decide("cost-aware", snap, CFG, PlacementState(), 0.0)
    assert [p.job_id for p in d.preempt] == ["long"]
    assert preemption_cost(ending, CFG).remaining_gpu_s == pytest.approx(1.0)


def test_cost_blind_preempts_most_recent_regardless_of_cost():
    cheap = job("cheap", ["t0"], memory_mib=12288, iteration_time_s=3.0, done=100, started_s=10.0)
    dear = job("dear", ["t1"], memory_mib=12288, iteration_time_s=3.0, done=199, started_s=20.0)
    snap = PlacementSnapshot(gpus(a100=0), targets=(ReplicaTarget("m", "v", "T4", 1, 8192),), jobs=(cheap, dear))
    d, _ = decide("cost-blind", snap, CFG, PlacementState(), 0.0)
    assert [p.job_id for p in d.preempt] == ["dear"]
    d, _ = decide("cost-aware", snap, CFG, PlacementState(), 0.0)
    assert [p.job_id for p in d.preempt] == ["cheap"]
    rnd = CFG.model_copy(update={"blind_choice": "random"})
    assert decide("cost-blind", snap, rnd, PlacementState(round=1), 0.0) == decide(
        "cost-blind", snap, rnd, PlacementState(round=1), 0.0
    )


def test_preemption_in_flight_is_not_repeated_and_its_gpu_is_reused():
    snap = PlacementSnapshot(
        gpus(t4=2, a100=0),
        targets=(ReplicaTarget("m", "v", "T4", 1, 8192),),
        jobs=(job("a", ["t0"], memory_mib=12288), job("b", ["t1"], memory_mib=12288)),
    )
    d1, s1 = decide("cost-aware", snap, CFG, PlacementState(), 5.0)
    assert len(d1.preempt) == 1 and dict(s1.preempt_requested_s) == {d1.preempt[0].job_id: 5.0}
    # next round: the job still holds its GPU (grace period), the replica is not yet reported running
    d2, s2 = decide("cost-aware", snap, CFG, s1, 5.5)
    assert d2.preempt == () and d2.start_replicas[0].after_preempt == d1.preempt[0].job_id
    # once it is gone, the state forgets it
    gone = apply_decision(snap, d1, CFG, 6.0)
    _, s3 = decide("cost-aware", gone, CFG, s2, 6.0)
    assert dict(s3.preempt_requested_s) == {}


def test_training_queue_order_best_fit_and_resume():
    queued = (  # all in LAS's top queue (under 3,250 GPU-s): submit order
        job("big", (), num_gpus=2, attained_gpu_s=100.0, submit_time_s=20.0),
        job("small", (), num_gpus=1, attained_gpu_s=0.0, submit_time_s=0.0),
        job("back", (), num_gpus=1, attained_gpu_s=50.0, checkpoint_iteration=40, submit_time_s=10.0),
    )
    snap = PlacementSnapshot(gpus(t4=2, a100=1), jobs=queued)
    d, _ = decide("cost-aware", snap, CFG, PlacementState(), 0.0)
    got = {s.job_id: s for s in d.start_training}
    assert got["small"].gpu_ids == ("a0",)  # best fit: the type with fewest spare GPUs
    assert got["back"].reason == "resume" and got["back"].gpu_ids == ("t0",)
    assert "big" not in got  # needs 2 GPUs of one type, only one T4 left
    assert [(e.job_id, e.action, e.reason) for e in d.training_queue] == [
        ("small", "start", "start"),
        ("back", "start", "start"),
        ("big", "wait", "no-capacity"),
    ]


def test_static_partition_keeps_training_off_inference_gpus():
    snap = PlacementSnapshot(
        gpus(t4=4, a100=0), targets=(ReplicaTarget("m", "v", "T4", 3, 4096),), jobs=(job("q", (), num_gpus=1),)
    )
    inf, train = static_partition(snap, CFG)
    assert inf == {"t0", "t1"} and train == {"t2", "t3"}
    d, _ = decide("static", snap, CFG, PlacementState(), 0.0)
    assert sorted(s.gpu_id for s in d.start_replicas) == ["t0", "t1"]
    assert [(u.count, u.reason) for u in d.unplaced] == [(1, "capacity")]
    assert d.start_training[0].gpu_ids[0] in train


def test_scale_in_stops_replicas_and_frees_gpus_for_training():
    snap = PlacementSnapshot(
        gpus(t4=2, a100=0),
        targets=(ReplicaTarget("m", "v", "T4", 1, 4096),),
        replicas=(
            Replica("r0", "m", "v", "t0", 4096),
            Replica("r1", "m", "v", "t1", 4096),
            Replica("x", "gone", "v", "t1", 4096),
        ),
        jobs=(job("q", (), num_gpus=1, memory_mib=8192),),
    )
    cfg = CFG.model_copy(update={"max_replicas_per_gpu": 2})
    d, _ = decide("cost-aware", snap, cfg, PlacementState(), 0.0)
    assert {(s.replica_id, s.reason) for s in d.stop_replicas} == {("r1", "scale-in"), ("x", "no-target")}
    assert d.start_replicas == () and d.start_training[0].gpu_ids == ("t1",)


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(ValueError, match="cost-aware"):
        get_policy("nope")
