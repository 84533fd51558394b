"""Invariants of every placement policy, over generated clusters (hypothesis)."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sloserve.autoscaler.placement.cost import lost_work_gpu_s, preemption_cost
from sloserve.autoscaler.placement.policy import POLICIES, apply_decision, check_capacity, get_policy
from sloserve.autoscaler.placement.types import (
    Gpu,
    PlacementConfig,
    PlacementSnapshot,
    PlacementState,
    ReplicaTarget,
)
from tests.unit.placement.factories import job, worlds

CFG = PlacementConfig()
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(worlds(explicit_only=False), st.sampled_from(sorted(POLICIES)))
def test_never_over_gpu_or_memory_capacity(snap, name):
    assert check_capacity(snap, CFG) == []  # the generator makes valid worlds
    d, _ = get_policy(name)(snap, CFG, PlacementState(), 0.0)
    after = apply_decision(snap, d, CFG, 0.0)
    assert check_capacity(after, CFG) == []
    # a GPU is given at most once, and only GPUs of the inventory are used
    ids = {g.gpu_id for g in snap.gpus}
    assert all(s.gpu_id in ids for s in d.start_replicas)
    used = [g for s in d.start_training for g in s.gpu_ids]
    assert len(used) == len(set(used)) and set(used) <= ids


@FAST
@given(worlds(explicit_only=True, feasible=True), st.sampled_from(["cost-aware", "cost-blind"]))
def test_inference_targets_met_when_capacity_allows(snap, name):
    d, _ = get_policy(name)(snap, CFG, PlacementState(), 0.0)
    assert d.unplaced == ()
    after = apply_decision(snap, d, CFG, 0.0)
    types = {g.gpu_id: g.gpu_type for g in snap.gpus}
    have = Counter((r.model, r.variant, types[r.gpu_id]) for r in after.replicas)
    for t in snap.targets:
        assert have[(t.model, t.variant, t.gpu_type)] == t.count, (t, have)


@FAST
@given(worlds(explicit_only=False))
def test_static_never_shares_nor_preempts(snap):
    d, _ = get_policy("static")(snap, CFG, PlacementState(), 0.0)
    assert d.preempt == ()
    assert all(s.beside_job is None for s in d.start_replicas)


@FAST
@given(
    st.lists(
        st.tuples(
            st.integers(0, 400),
            st.integers(1, 40),
            st.sampled_from([0.05, 0.5, 2.0]),
            st.one_of(st.none(), st.integers(1, 5000)),
            st.floats(0, 1e5),
            st.integers(1, 2),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_preempted_job_is_least_cost(specs):
    gpus, jobs, k = [], [], 0
    for i, (done, interval, it, extra, attained, n) in enumerate(specs):
        ids = [f"g{k + x}" for x in range(n)]
        k += n
        gpus += [Gpu(g, "T4", 16384) for g in ids]
        jobs.append(
            job(
                f"j{i}",
                ids,
                memory_mib=12288,
                iteration_time_s=it,
                done=done,
                interval=interval,
                total_iterations=None if extra is None else done + extra,
                attained_gpu_s=attained,
            )
        )
    snap = PlacementSnapshot(gpus=tuple(gpus), targets=(ReplicaTarget("m", "v", "T4", 1, 8192),), jobs=tuple(jobs))
    d, _ = get_policy("cost-aware")(snap, CFG, PlacementState(), 0.0)
    assert len(d.preempt) == 1 and len(d.start_replicas) == 1
    chosen = d.preempt[0].cost.key
    assert chosen == min(preemption_cost(j, CFG).key for j in jobs)
    assert d.start_replicas[0].after_preempt == d.preempt[0].job_id


@FAST
@given(worlds(explicit_only=True, feasible=True), st.sampled_from(sorted(POLICIES)))
def test_preemption_loses_at_most_one_checkpoint_interval(snap, name):
    d, _ = get_policy(name)(snap, CFG, PlacementState(), 0.0)
    after = {j.job_id: j for j in apply_decision(snap, d, CFG, 0.0).jobs}
    for p in d.preempt:
        before = next(j for j in snap.jobs if j.job_id == p.job_id)
        lost = before.iterations_done - after[p.job_id].iterations_done
        assert 0 <= lost <= before.checkpoint_interval_iterations
        bound = before.num_gpus * (
            before.checkpoint_interval_iterations * before.iteration_time_s + CFG.preempt_grace_s
        )
        assert lost_work_gpu_s(before, CFG) <= bound + 1e-9


@FAST
@given(worlds(explicit_only=False), st.sampled_from(sorted(POLICIES)))
def test_pure_and_deterministic(snap, name):
    before = repr(snap)
    a = get_policy(name)(snap, CFG, PlacementState(round=3), 7.0)
    b = get_policy(name)(snap, CFG, PlacementState(round=3), 7.0)
    assert a == b and repr(snap) == before
