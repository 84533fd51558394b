"""Invariants of every policy, through the offline driver, on generated workloads (hypothesis)."""

from collections import Counter

from batching_factories import ACC, two_variants
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sloserve.batching import make_policy
from sloserve.batching.replay import Request, replay

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(name, lat, B, variants=None):
    kw = {"max_batch_size": B, "default_variant": "big"}
    if name in ("slo", "nexus"):
        kw["latency_fn"] = lat
    if name == "slo":
        kw["variants"] = variants or ["big", "small"]
    if name == "fixed":
        kw["preferred_batch_sizes"] = (2, 4)
    return make_policy(name, **kw)


workloads = st.lists(
    st.tuples(
        st.floats(0.0, 0.004),
        st.floats(0.002, 0.04),
        st.integers(1, 4),
        st.integers(0, 2),
        st.sampled_from([("big", "small"), ("big",), ("small",)]),
    ),
    min_size=1,
    max_size=40,
)


def to_requests(spec):
    t, out = 0.0, []
    for i, (gap, slo, size, prio, vs) in enumerate(spec):
        t += gap
        out.append(Request(i, t, slo, size, prio, vs))
    return out


@FAST
@given(
    spec=workloads,
    name=st.sampled_from(["slo", "timeout", "fixed", "aimd", "nexus"]),
    B=st.integers(1, 16),
    reps=st.integers(1, 2),
    busy=st.booleans(),
    admission=st.booleans(),
)
def test_every_request_answered_exactly_once_and_no_batch_over_max(spec, name, B, reps, busy, admission):
    reqs = to_requests(spec)
    B = max(B, 4)  # a request may carry up to 4 rows
    r = replay(
        make(name, two_variants, B),
        reqs,
        two_variants,
        {"big": reps, "small": reps},
        max_batch_size=B,
        busy_until=busy,
        admission=admission,
    )
    assert r.stranded == ()
    served = Counter(i for b in r.batches for i in b.ids)
    assert all(c == 1 for c in served.values())
    for o in r.outcomes:
        assert o.shed != (o.id in served)
        assert o.finish_s is not None
    by_id = {q.id: q for q in reqs}
    for b in r.batches:
        assert b.rows == sum(by_id[i].size for i in b.ids) <= B
        assert all(not by_id[i].variants or b.variant in by_id[i].variants for i in b.ids)


def feasible_trace(a_ms, b_ms, slo_factor, gaps):
    """Latency a + b*n ms; request i arrives gaps[i] * l(1) after the one before, with SLO slo_factor * l(1)."""

    def lat(v, n):
        return (a_ms + b_ms * n) / 1e3

    l1 = lat("v", 1)
    t, reqs = 0.0, []
    for i, g in enumerate(gaps):
        t += g * l1
        reqs.append(Request(i, t, slo_factor * l1, variants=("v",)))
    return lat, reqs


@FAST
@given(
    a_ms=st.floats(0.2, 5.0),
    b_ms=st.floats(0.0, 2.0),
    B=st.integers(1, 32),
    slo_factor=st.floats(1.0, 8.0),
    gaps=st.lists(st.floats(1.0, 6.0), min_size=1, max_size=50),
    busy=st.booleans(),
)
def test_feasible_load_meets_every_deadline(a_ms, b_ms, B, slo_factor, gaps, busy):
    """One replica; each request could be served alone after the previous one (gap >= l(1),
    SLO >= l(1)); latency is exactly the profile's. The SLO policy then meets every deadline."""
    lat, reqs = feasible_trace(a_ms, b_ms, slo_factor, gaps)
    p = make_policy("slo", max_batch_size=B, latency_fn=lat)
    r = replay(p, reqs, lat, {"v": 1}, max_batch_size=B, busy_until=busy)
    late = [o for o in r.outcomes if not o.on_time]
    assert not late, late[:3]


@FAST
@given(spec=workloads, B=st.integers(4, 16), busy=st.booleans())
def test_only_infeasible_requests_are_shed(spec, B, busy):
    reqs = to_requests(spec)
    by_id = {q.id: q for q in reqs}
    r = replay(
        make("slo", two_variants, B), reqs, two_variants, {"big": 1, "small": 1}, max_batch_size=B, busy_until=busy
    )
    for o in r.outcomes:
        if not o.shed:
            continue
        q = by_id[o.id]
        t = o.finish_s  # the shed instant
        for v in q.variants or ("big", "small"):
            start = t
            if busy:  # the replica of v was running a batch that ends after t
                start = max([t] + [b.finish_s for b in r.batches if b.variant == v and b.start_s <= t < b.finish_s])
            assert start + two_variants(v, q.size) > o.deadline_s + 1e-12, (o, v)
        assert o.late_by_s > 0


def burst_trace(
    rate_light=400.0, rate_burst=2500.0, t_burst=(1.0, 2.0), end_s=4.0, slo_s=0.02, variants=("big", "small")
):
    # deterministic evenly spaced arrivals: a light phase, a burst, a light phase
    reqs, t, i = [], 0.0, 0
    while t < end_s:
        rate = rate_burst if t_burst[0] <= t < t_burst[1] else rate_light
        reqs.append(Request(i, t, slo_s, variants=variants))
        i += 1
        t += 1.0 / rate
    return reqs


def test_variants_degrade_under_overload_and_return_with_hysteresis():
    reqs = burst_trace()
    p = make("slo", two_variants, 32)
    r = replay(p, reqs, two_variants, {"big": 1, "small": 1}, max_batch_size=32)

    def phase(o):
        return 0 if o.arrival_s < 1.0 else (1 if o.arrival_s < 2.0 else 2)

    per = [Counter(o.variant for o in r.outcomes if phase(o) == k) for k in range(3)]
    assert per[0]["small"] == 0  # light: the best variant only
    assert per[1]["small"] > 0.2 * sum(per[1].values())  # burst: overflow goes to the cheap one
    assert per[1]["big"] > 0.3 * sum(per[1].values())  # ... while the best keeps working
    late_light = [o for o in r.outcomes if o.arrival_s > 2.8]
    assert all(o.variant == "big" for o in late_light)  # back to the best once load fell
    assert p.levels.switches <= 6  # no flapping
    assert r.attainment > 0.99
    # degrading beats holding on to the best variant: effective accuracy (Model-Switching)
    only_big = replay(
        make("slo", two_variants, 32, ["big"]),
        [Request(q.id, q.arrival_s, q.slo_s, variants=("big",)) for q in reqs],
        two_variants,
        {"big": 1, "small": 1},
        max_batch_size=32,
    )
    assert r.effective_accuracy(ACC) > only_big.effective_accuracy(ACC) + 0.02


def test_hysteresis_holds_the_level_through_a_short_lull():
    p = make("slo", two_variants, 32)
    p.levels.restore_hold_s = 0.5
    reqs = burst_trace(t_burst=(1.0, 1.5), end_s=1.7)  # 0.2 s of light load after the burst
    replay(p, reqs, two_variants, {"big": 1, "small": 1}, max_batch_size=32)
    assert p.level >= 1  # not yet restored: the lull is shorter than the hold


# ---- pipelined replicas (QueueView.depth 2: the in-process backend's inprocess_pipeline_depth) ----


@FAST
@given(
    spec=workloads,
    name=st.sampled_from(["slo", "timeout", "fixed", "aimd", "nexus"]),
    B=st.integers(1, 16),
    reps=st.integers(1, 2),
    admission=st.booleans(),
)
def test_pipelined_every_request_answered_exactly_once(spec, name, B, reps, admission):
    reqs = to_requests(spec)
    B = max(B, 4)
    r = replay(
        make(name, two_variants, B),
        reqs,
        two_variants,
        {"big": reps, "small": reps},
        max_batch_size=B,
        admission=admission,
        depth=2,
    )
    assert r.stranded == ()
    served = Counter(i for b in r.batches for i in b.ids)
    assert all(c == 1 for c in served.values())
    for o in r.outcomes:
        assert o.shed != (o.id in served)
    # a replica computes one batch at a time
    by_rep: dict = {}
    for b in r.batches:
        by_rep.setdefault((b.variant, b.replica), []).append((b.start_s, b.finish_s))
    for spans in by_rep.values():
        spans.sort()
        assert all(f0 <= s1 + 1e-12 for (_, f0), (s1, _) in zip(spans, spans[1:], strict=False))


@FAST
@given(
    a_ms=st.floats(0.2, 5.0),
    b_ms=st.floats(0.0, 2.0),
    B=st.integers(1, 32),
    slo_factor=st.floats(1.0, 8.0),
    gaps=st.lists(st.floats(1.0, 6.0), min_size=1, max_size=50),
    reps=st.integers(1, 2),
)
def test_pipelined_feasible_load_meets_every_deadline(a_ms, b_ms, B, slo_factor, gaps, reps):
    """As test_feasible_load_meets_every_deadline, with a second slot queued behind the running
    batch: the policy must count the wait for the replica, not treat the slot as a free replica."""
    lat, reqs = feasible_trace(a_ms, b_ms, slo_factor, gaps)
    p = make_policy("slo", max_batch_size=B, latency_fn=lat)
    r = replay(p, reqs, lat, {"v": reps}, max_batch_size=B, depth=2)
    late = [o for o in r.outcomes if not o.on_time]
    assert not late, late[:3]


def test_pipelined_slots_on_two_replicas_chain_behind_the_one_that_frees_first():
    """Two replicas, one frees early: a full batch queued now must be predicted (and run) behind
    that one; the policy and the driver agree, so nothing is late."""

    def lat(v, n):
        return 0.002 + 0.00025 * n  # 32 rows: 10 ms, 1 row: 2.25 ms

    reqs = [Request(i, 0.0, 0.050, variants=("v",)) for i in range(32)]  # a full batch: one replica to 10 ms
    reqs.append(Request(32, 0.0005, 0.0030, variants=("v",)))  # one tight row: the other replica to ~2.75 ms
    reqs += [Request(100 + i, 0.0010, 0.0130, variants=("v",)) for i in range(33)]  # fits only behind the 2nd
    p = make_policy("slo", max_batch_size=32, latency_fn=lat, calibrate=False, default_variant="v")
    r = replay(p, reqs, lat, {"v": 2}, max_batch_size=32, depth=2)
    assert [o for o in r.outcomes if not o.shed and not o.on_time] == []


def test_keep_up_rule_does_not_starve_requests_that_ask_for_a_tight_slo():
    """At half capacity a tenth of the requests ask for 3.2 ms: passing heads over is for a
    backlog, not for them (it once took their on-time share from 72% to 20%)."""
    import random

    def lat(v, n):
        return 0.002 + 0.00025 * n

    B = 32
    rng, t, reqs = random.Random(0), 0.0, []
    cap = 2 * B / lat("v", B)
    while t < 2.0:
        t += rng.expovariate(0.5 * cap)
        reqs.append(Request(len(reqs), t, 0.0032 if rng.random() < 0.1 else 0.030, variants=("v",)))
    p = make_policy("slo", max_batch_size=B, default_variant="v", latency_fn=lat)
    r = replay(p, reqs, lat, {"v": 2}, max_batch_size=B, admission=True)
    tight = [o for o in r.outcomes if o.deadline_s - o.arrival_s < 0.01]
    assert sum(o.on_time for o in tight) / len(tight) > 0.65
    assert all(o.on_time for o in r.outcomes if o.deadline_s - o.arrival_s >= 0.01)


def test_pipelined_slot_is_not_a_free_replica():
    """Two full batches at once on one replica with two slots, SLO 1.5x a batch: the second cannot
    make it (it starts when the first ends). Treating the queued slot as a free replica would
    dispatch it and answer it late; the policy sheds it instead, and answers nothing late."""

    def lat(v, n):
        return 0.010

    reqs = [Request(i, 0.0, 0.015, variants=("v",)) for i in range(8)]
    p = make_policy("slo", max_batch_size=4, latency_fn=lat, calibrate=False)
    r = replay(p, reqs, lat, {"v": 1}, max_batch_size=4, depth=2)
    assert [o for o in r.outcomes if not o.shed and not o.on_time] == []
    assert sum(o.on_time for o in r.outcomes) == 4 and sum(o.shed for o in r.outcomes) == 4


def test_pipelined_slot_takes_a_full_batch_at_once_chained_after_the_running_one():
    def lat(v, n):
        return 0.010

    reqs = [Request(i, 0.0, 0.050, variants=("v",)) for i in range(8)]
    p = make_policy("slo", max_batch_size=4, latency_fn=lat, calibrate=False)
    r = replay(p, reqs, lat, {"v": 1}, max_batch_size=4, depth=2)
    assert [(b.rows, b.start_s, b.finish_s) for b in r.batches] == [(4, 0.0, 0.010), (4, 0.010, 0.020)]
    assert all(o.on_time for o in r.outcomes)


def test_slo_recovers_after_an_overload_instead_of_settling_into_one_row_batches():
    """4 replicas at 0.75x capacity, 1.1x for an eighth of the run, 0.75x again. A deadline-ordered
    queue whose head is always nearly late used to serve one-row batches ever after (too few rows
    per second to drain it); the policy now passes over such a head while more work waits."""
    import random

    def lat(v, n):
        return 0.002 + 0.00025 * n

    B, slo = 32, 0.020
    cap = 4 * B / lat("v", B)
    rng, t, reqs = random.Random(0), 0.0, []
    while t < 1.0:
        t += rng.expovariate(cap * (1.1 if 0.25 <= t < 0.375 else 0.75))
        reqs.append(Request(len(reqs), t, slo, variants=("v",)))
    p = make_policy("slo", max_batch_size=B, default_variant="v", latency_fn=lat)
    r = replay(p, reqs, lat, {"v": 4}, max_batch_size=B, admission=True)
    last = [o for o in r.outcomes if o.arrival_s > 0.75]
    assert sum(o.on_time for o in last) / len(last) > 0.99
    assert sum(o.on_time for o in r.outcomes) / len(r.outcomes) > 0.98
    tail = [b.rows for b in r.batches if b.start_s > 0.75]
    assert sum(tail) / len(tail) > 10
