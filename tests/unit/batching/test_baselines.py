from batching_factories import items, linear, view

from sloserve.batching import make_policy
from sloserve.batching.types import BatchResult, Dispatch, QueuedItem, Shed, Wait


def test_all_builtins_registered():
    from sloserve.batching import POLICIES

    assert {"timeout", "fixed", "aimd", "nexus", "slo"} <= set(POLICIES)


def test_fixed_preferred_sizes_then_max_queue_delay():
    p = make_policy("fixed", max_batch_size=8, preferred_batch_sizes=(4,), max_queue_delay_ms=1.0, default_variant="v")
    d = p.plan(view(items(5, slo_s=1.0)), 0.0)
    assert isinstance(d, Dispatch) and d.ids == (0, 1, 2, 3) and d.reason == "preferred"
    w = p.plan(view(items(2, slo_s=1.0)), 0.0)
    assert isinstance(w, Wait) and w.until_s == 0.001
    t = p.plan(view(items(2, slo_s=1.0)), 0.001)
    assert isinstance(t, Dispatch) and t.reason == "timeout"
    assert p.plan(view(items(9, slo_s=1.0), max_batch_size=8), 0.0).reason == "full"


def test_aimd_additive_increase_multiplicative_decrease():
    p = make_policy("aimd", max_batch_size=16, slo_ms=10.0, default_variant="v")
    for _ in range(5):
        p.observe(BatchResult("m", "v", p.cap("v"), 0.005, 0.0))
    assert p.cap("v") == 6
    p.observe(BatchResult("m", "v", 6, 0.020, 0.0))
    assert p.cap("v") == 5  # int(6 * 0.9)
    d = p.plan(view(items(10, slo_s=1.0)), 0.0)
    assert isinstance(d, Dispatch) and len(d.ids) == 5


def test_nexus_target_dispatch_and_early_drop():
    p = make_policy("nexus", max_batch_size=32, latency_fn=linear(0.0, 1.0), default_variant="v", slo_ms=10)
    assert p.target("v") == 5
    d = p.plan(view(items(7, slo_s=0.010)), 0.0)
    assert isinstance(d, Dispatch) and len(d.ids) == 5 and d.reason == "full"
    w = p.plan(view(items(2, slo_s=0.010)), 0.0)
    assert isinstance(w, Wait) and abs(w.until_s - 0.008) < 1e-9
    late = [QueuedItem(0, 0.0, 0.0005, variants=("v",))]
    assert isinstance(p.plan(view(late), 0.0), Shed)
