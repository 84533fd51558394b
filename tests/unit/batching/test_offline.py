import pytest

from sloserve.batching import make_policy
from sloserve.batching.replay import PolicyError, Request, replay
from sloserve.batching.types import Dispatch, Wait


def test_timeout_policy_replay_matches_hand_computation():
    p = make_policy("timeout", max_batch_size=4, max_wait_ms=2.0, default_variant="v")
    reqs = [Request(i, 0.0005 * i, 0.05) for i in range(6)]
    r = replay(p, reqs, lambda v, n: 0.001 * n, {"v": 1}, max_batch_size=4)
    assert [b.ids for b in r.batches] == [(0, 1, 2, 3), (4, 5)]
    assert r.batches[0].start_s == pytest.approx(0.0015)  # full at the 4th arrival
    assert r.batches[1].start_s == pytest.approx(0.0055)  # replica free at 1.5 + 4 ms
    assert r.attainment == 1.0 and r.stranded == ()


def test_deterministic():
    reqs = [Request(i, 0.0003 * i, 0.02, variants=("big", "small")) for i in range(300)]

    def lat(v, n):
        return (0.004 + 0.0005 * n) if v == "big" else (0.001 + 0.0001 * n)

    runs = [
        replay(make_policy("slo", latency_fn=lat, variants=["big", "small"]), reqs, lat, {"big": 1, "small": 1})
        for _ in range(2)
    ]
    assert runs[0].outcomes == runs[1].outcomes and runs[0].batches == runs[1].batches


class _Bad:
    name = "bad"

    def __init__(self, decision):
        self.decision = decision

    def plan(self, view, now):
        return self.decision(view)

    def observe(self, result):
        pass


def test_strict_mode_catches_bad_decisions():
    reqs = [Request(i, 0.0, 1.0) for i in range(3)]
    with pytest.raises(PolicyError):
        replay(_Bad(lambda v: Dispatch((99,), "v")), reqs, lambda v, n: 0.001, 1, variants=["v"])
    with pytest.raises(PolicyError):
        replay(
            _Bad(lambda v: Dispatch(tuple(i.id for i in v.items), "v")),
            reqs,
            lambda v, n: 0.001,
            1,
            variants=["v"],
            max_batch_size=2,
        )


def test_a_policy_that_never_acts_strands_requests():
    r = replay(_Bad(lambda v: Wait(None)), [Request(0, 0.0, 1.0)], lambda v, n: 0.001, 1, variants=["v"])
    assert r.stranded == (0,) and r.outcomes[0].reason == "stranded"


def test_admission_refusals_are_outcomes():
    def lat(v, n):
        return 0.002 + 0.001 * n

    reqs = [Request(i, 0.0, 0.05, variants=("v",)) for i in range(200)]
    r = replay(
        make_policy("slo", latency_fn=lat, max_batch_size=8), reqs, lat, {"v": 1}, max_batch_size=8, admission=True
    )
    refused = [o for o in r.outcomes if o.reason == "admission"]
    assert refused and all(o.shed and o.late_by_s > 0 for o in refused)
    assert all(o.on_time for o in r.outcomes if not o.shed)
