"""The batching mechanism with a fake clock and a fake runner: no sleeps, no real time."""

import asyncio

import numpy as np
import pytest

from sloserve.batching.batcher import Batcher, RunResult
from sloserve.batching.clock import FakeClock
from sloserve.batching.policy import PolicyBase, make_policy
from sloserve.batching.types import Dispatch, Shed, Wait
from sloserve.gateway.errors import InternalError, ReplicaFailed, TooManyRequests, Unavailable
from sloserve.gateway.transports.status import http_status


class Runner:
    """Doubles its input; records every batch; can be told to fail."""

    round_trip_latency = True
    pipeline_depth = 1

    def __init__(self, slots=1, fail=False):
        self.batches = []
        self._slots = slots
        self.fail = fail
        self.gate = None
        self.timeouts = []
        self.order = []  # the first value of each batch, in the order batches ran

    def slots(self, model, variant):
        return self._slots

    def shared(self, model):
        return False

    async def run(self, model, variant, inputs, timeout_s=None):
        self.batches.append((variant, inputs["x"].shape[0]))
        self.order.append(float(inputs["x"][0, 0]))
        self.timeouts.append(timeout_s)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("replica crashed")
        return RunResult({"y": inputs["x"] * 2}, 0.001)


def x(v, rows=1):
    return {"x": np.full((rows, 2), v, np.float32)}


async def test_full_batches_dispatch_without_waiting_and_outputs_are_split():
    clock = FakeClock()
    runner = Runner()
    runner.gate = asyncio.Event()
    b = Batcher(
        "m",
        make_policy("timeout", max_batch_size=4, max_wait_ms=1e6, default_variant="v"),
        runner,
        ["v"],
        max_batch_size=4,
        clock=clock,
    )
    b.start()
    # The first request dispatches alone only after max_wait (never, on a fake clock), so it waits
    # for three more: a full batch of 4 goes at once.
    tasks = [asyncio.create_task(b.submit(x(i), 1, 1.0, ("v",))) for i in range(4)]
    await asyncio.sleep(0)
    runner.gate.set()
    outs = await asyncio.gather(*tasks)
    assert runner.batches == [("v", 4)]
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o.outputs["y"], np.full((1, 2), 2 * i))
        assert o.batch_rows == 4 and o.variant == "v"
    await b.close()


async def test_multi_row_requests_keep_their_rows():
    runner = Runner()
    b = Batcher(
        "m",
        make_policy("timeout", max_batch_size=5, max_wait_ms=1e6, default_variant="v"),
        runner,
        ["v"],
        max_batch_size=5,
        clock=FakeClock(),
    )
    b.start()
    outs = await asyncio.gather(b.submit(x(1, 2), 2, 1.0, ("v",)), b.submit(x(3, 3), 3, 1.0, ("v",)))
    assert outs[0].outputs["y"].shape == (2, 2) and outs[1].outputs["y"].shape == (3, 2)
    assert (outs[1].outputs["y"] == 6).all()
    await b.close()


async def test_queue_bound_is_a_429():
    b = Batcher(
        "m",
        make_policy("timeout", max_batch_size=64, max_wait_ms=1e6, default_variant="v"),
        Runner(),
        ["v"],
        max_batch_size=64,
        max_queue_rows=2,
        clock=FakeClock(),
    )
    b.start()
    t = [asyncio.create_task(b.submit(x(0), 1, 1.0, ("v",))) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(TooManyRequests) as e:
        await b.submit(x(0), 1, 1.0, ("v",))
    assert e.value.retry_after_s and "queue is full" in e.value.message
    await b.close()
    for task in t:
        with pytest.raises(Unavailable):
            await task


async def test_replica_failure_fails_every_request_explicitly():
    b = Batcher(
        "m",
        make_policy("timeout", max_batch_size=2, max_wait_ms=1e6, default_variant="v"),
        Runner(fail=True),
        ["v"],
        max_batch_size=2,
        clock=FakeClock(),
    )
    b.start()
    res = await asyncio.gather(*(b.submit(x(0), 1, 1.0, ("v",)) for _ in range(2)), return_exceptions=True)
    assert all(isinstance(r, InternalError) and "replica crashed" in r.message for r in res)
    await b.close()


class ShedOldest(PolicyBase):
    name = "shed-test"

    def plan(self, view, now):
        if not view.items:
            return Wait(None)
        first = view.items[0]
        if first.priority < 0:
            return Shed((first.id,), "deadline", (0.005,))
        return Dispatch((first.id,), "v", "one")


async def test_shed_answers_503_with_how_late():
    b = Batcher("m", ShedOldest(), Runner(), ["v"], max_batch_size=4, clock=FakeClock())
    b.start()
    bad, good = await asyncio.gather(
        b.submit(x(0), 1, 0.02, ("v",), priority=-1), b.submit(x(1), 1, 0.02, ("v",)), return_exceptions=True
    )
    assert isinstance(bad, Unavailable) and "late by 5.0 ms" in bad.message and bad.retry_after_s
    assert good.outputs["y"][0, 0] == 2
    await b.close()


async def test_shed_calls_on_shed_inside_the_decision_and_survives_a_broken_hook():
    b = Batcher("m", ShedOldest(), Runner(), ["v"], max_batch_size=4, clock=FakeClock())
    b.start()
    seen = []

    def answer_now(err):
        # Called from inside the shed decision, before the request's future gets the error.
        seen.append((err, futures[0].done()))
        return True

    bad_task = asyncio.create_task(b.submit(x(0), 1, 0.02, ("v",), priority=-1, on_shed=answer_now))
    await asyncio.sleep(0)  # the submit has queued its entry and awaits its future
    futures = [e.future for e in b._entries.values()]
    good = await b.submit(x(1), 1, 0.02, ("v",), on_shed=lambda e: pytest.fail("not shed"))
    with pytest.raises(Unavailable) as bad:
        await bad_task
    assert good.outputs["y"][0, 0] == 2
    assert len(seen) == 1 and seen[0][0] is bad.value and seen[0][1] is False  # the same error, early

    def broken(err):
        raise RuntimeError("transport bug")

    with pytest.raises(Unavailable, match="late by 5.0 ms"):  # still answered through the future
        await b.submit(x(0), 1, 0.02, ("v",), priority=-1, on_shed=broken)
    await b.close()


class ShedTiny(ShedOldest):
    def plan(self, view, now):
        if view.items and view.items[0].priority < 0:
            return Shed((view.items[0].id,), "deadline", (0.00001,))
        return super().plan(view, now)


async def test_error_texts_keep_sub_tenth_millisecond_figures():
    from sloserve.batching.batcher import _ms

    assert (_ms(0.005), _ms(0.00001), _ms(0.02)) == ("5.0", "0.010", "20.0")  # not "0.0 ms" for a 10 us miss
    b = Batcher("m", ShedTiny(), Runner(), ["v"], max_batch_size=4, clock=FakeClock())
    b.start()
    bad, _ = await asyncio.gather(
        b.submit(x(0), 1, 0.02, ("v",), priority=-1), b.submit(x(1), 1, 0.02, ("v",)), return_exceptions=True
    )
    assert isinstance(bad, Unavailable) and "late by 0.010 ms" in bad.message and "20.0 ms deadline" in bad.message
    await b.close()

    class RefuseTiny(ShedOldest):
        def admit(self, view, item, now):
            return Shed((item.id,), "admission", (0.00001,))

    b = Batcher("m", RefuseTiny(), Runner(), ["v"], max_batch_size=4, clock=FakeClock())
    b.start()
    with pytest.raises(Unavailable, match=r"refused at admission.*0\.020 ms deadline.*late by 0\.010 ms"):
        await b.submit(x(0), 1, 0.00002, ("v",))
    await b.close()


async def test_policy_crash_falls_back_to_fifo():
    class Broken(ShedOldest):
        def plan(self, view, now):
            raise ZeroDivisionError

    b = Batcher("m", Broken(), Runner(), ["v"], max_batch_size=4, clock=FakeClock())
    b.start()
    out = await b.submit(x(2), 1, 1.0, ("v",))
    assert out.outputs["y"][0, 0] == 4
    await b.close()


class DiesOnce(Runner):
    """The first batch's replica dies (after the fake clock moves ``dead_for_s``); later ones work."""

    def __init__(self, clock, dead_for_s):
        super().__init__()
        self.clock, self.dead_for_s, self.calls = clock, dead_for_s, 0

    async def run(self, model, variant, inputs, timeout_s=None):
        self.calls += 1
        if self.calls == 1:
            self.clock.advance(self.dead_for_s)
            raise ReplicaFailed("replica for 'm/v' died while running this batch (ActorDiedError)")
        return await super().run(model, variant, inputs, timeout_s)


def one_shot(clock, runner, **kw):
    events = []
    b = Batcher(
        "m",
        make_policy("timeout", max_batch_size=1, max_wait_ms=0, default_variant="v"),
        runner,
        ["v"],
        max_batch_size=1,
        clock=clock,
        on_event=lambda k, r: events.append(k),
        **kw,
    )
    return b, events


async def test_replica_death_is_retried_once_when_the_deadline_allows():
    clock = FakeClock()
    runner = DiesOnce(clock, dead_for_s=0.005)
    b, events = one_shot(clock, runner)
    b.start()
    out = await b.submit(x(5), 1, deadline_s=0.020, variants=("v",))
    assert out.outputs["y"][0, 0] == 10 and runner.calls == 2 and events.count("retry") == 1
    await b.close()


async def test_replica_death_past_the_deadline_fails_explicitly():
    clock = FakeClock()
    runner = DiesOnce(clock, dead_for_s=0.050)
    b, events = one_shot(clock, runner)
    b.start()
    with pytest.raises(ReplicaFailed) as e:
        await b.submit(x(5), 1, deadline_s=0.020, variants=("v",))
    assert "not retried" in e.value.message and http_status(e.value) == 503 and runner.calls == 1
    assert "batch_failed" in events
    await b.close()


async def test_a_batch_is_bounded_by_its_latest_deadline_plus_grace():
    clock = FakeClock(10.0)
    runner = Runner()
    b, _ = one_shot(clock, runner, late_grace_s=0.5)
    b.start()
    await b.submit(x(1), 1, deadline_s=10.2, variants=("v",))
    assert runner.timeouts == [pytest.approx(0.7)]
    await b.close()


class ComputeRunner(Runner):
    """Reports pure compute (like the in-process backend) and pipelines two batches per replica."""

    round_trip_latency = False
    pipeline_depth = 2


def test_the_view_carries_the_runners_pipelining_only_when_it_reports_compute():
    pol = make_policy("timeout", max_batch_size=4, default_variant="v")
    assert Batcher("m", pol, ComputeRunner(slots=2), ["v"], max_batch_size=4)._view().depth == 2
    rt = Runner(slots=2)
    rt.pipeline_depth = 2  # a round-trip runner (Ray) folds its pipelining into what it measures
    assert Batcher("m", pol, rt, ["v"], max_batch_size=4)._view().depth == 1


def test_shared_replicas_one_set_of_slots_under_every_variant():
    """A runner whose replicas hold every variant: a batch of either takes a slot from both."""

    class SharedRunner(Runner):
        def shared(self, model):
            return True

    pol = make_policy("slo", max_batch_size=4, latency_fn=lambda v, n: 0.001, variants=["big", "small"])
    b = Batcher("m", pol, SharedRunner(slots=2), ["big", "small"], max_batch_size=4, clock=FakeClock())
    v = b._view()
    assert v.shared and v.idle == {"big": 2, "small": 2}
    b._busy["big"] += 1
    assert b._view().idle == {"big": 1, "small": 1}
    b._busy["small"] += 1
    assert b._view().idle == {"big": 0, "small": 0} and not b._should_plan()
    one = Batcher("m", pol, SharedRunner(slots=2), ["big"], max_batch_size=4, clock=FakeClock())
    assert not one._view().shared  # one variant: nothing to share
    own = Batcher("m", pol, Runner(slots=2), ["big", "small"], max_batch_size=4, clock=FakeClock())
    own._busy["big"] += 1
    assert not own._view().shared and own._view().idle == {"big": 1, "small": 2}


def test_shared_replicas_setting_is_refused_with_worker_processes():
    from sloserve.gateway.config import ConfigError, load_settings

    for ok in ("inprocess", "ray"):
        assert load_settings(backend=ok, models={"m": {"shared_replicas": True}}).models["m"].shared_replicas
    with pytest.raises(ConfigError, match="models.m.shared_replicas does not work with replica_processes"):
        load_settings(models={"m": {"shared_replicas": True}}, backend="inprocess", replica_processes=True)


async def test_best_effort_requests_are_never_refused_for_a_deadline_and_wait_behind_deadline_traffic():
    """A request that names no deadline is not refused at admission where one with a tight deadline
    is, and a request with a deadline that arrives after it is served before it."""
    from sloserve.gateway.errors import DeadlineUnreachable

    clock = FakeClock()
    runner = Runner()
    runner.gate = asyncio.Event()
    lat = 0.010  # every batch takes 10 ms
    b = Batcher(
        "m",
        make_policy("slo", max_batch_size=1, latency_fn=lambda v, n: lat, calibrate=False, default_variant="v"),
        runner,
        ["v"],
        max_batch_size=1,
        clock=clock,
    )
    b.start()
    first = asyncio.create_task(b.submit(x(0), 1, clock.now() + 1.0, ("v",)))  # takes the only replica
    while not runner.batches:
        await asyncio.sleep(0)
    with pytest.raises(DeadlineUnreachable, match="refused at admission"):  # a tight deadline behind it
        await b.submit(x(1), 1, clock.now() + 0.005, ("v",))
    best_effort = asyncio.create_task(b.submit(x(2), 1, clock.now() + 30.0, ("v",), best_effort=True))
    await asyncio.sleep(0)
    deadline = asyncio.create_task(b.submit(x(3), 1, clock.now() + 0.5, ("v",)))
    await asyncio.sleep(0)
    runner.gate.set()
    outs = await asyncio.gather(first, best_effort, deadline)
    assert [float(o.outputs["y"][0, 0]) for o in outs] == [0.0, 4.0, 6.0]
    assert runner.order == [0.0, 3.0, 2.0]  # the first, then the deadline request, then the best-effort one
    await b.close()


async def test_requests_of_different_shapes_never_share_a_batch():
    """A model with a variable dimension: requests asked at two sizes land in one dispatch; they run
    as two batches on the slot, and every one is answered (one concatenated batch failed them all)."""
    runner = Runner()
    b = Batcher(
        "m",
        make_policy("timeout", max_batch_size=4, max_wait_ms=1e6, default_variant="v"),
        runner,
        ["v"],
        max_batch_size=4,
        clock=FakeClock(),
    )
    b.start()
    shapes = [2, 3, 2, 3]
    outs = await asyncio.gather(
        *(b.submit({"x": np.full((1, w), i, np.float32)}, 1, 1.0, ("v",)) for i, w in enumerate(shapes))
    )
    assert runner.batches == [("v", 2), ("v", 2)]
    for i, (o, w) in enumerate(zip(outs, shapes, strict=True)):
        np.testing.assert_array_equal(o.outputs["y"], np.full((1, w), 2 * i))
    await b.close()


async def test_a_variant_without_replicas_fails_its_requests_promptly_never_hangs():
    """Every replica gone (Ray lost, the last one died): the ``timeout`` policy would wait forever for a
    slot. After ``no_replica_wait_s`` the queued request fails with 503 + Retry-After, and a new one
    at once; when a replica is back, requests are served again."""
    clock = FakeClock()
    runner = Runner(slots=0)
    b = Batcher(
        "m",
        make_policy("timeout", max_batch_size=4, max_wait_ms=0.0, default_variant="v"),
        runner,
        ["v"],
        max_batch_size=4,
        clock=clock,
        no_replica_wait_s=2.0,
    )
    b.start()
    queued = asyncio.create_task(b.submit(x(1), 1, 100.0, ("v",)))
    await asyncio.sleep(0)
    assert not queued.done()  # within the wait a replica may come back
    clock.advance(2.5)
    with pytest.raises(Unavailable, match="no running replica") as new:
        await b.submit(x(2), 1, 100.0, ("v",))
    assert http_status(new.value) == 503 and new.value.retry_after_s == 2.0
    b._wake.set()  # the loop's own timer would, in real time
    with pytest.raises(Unavailable, match="no running replica"):
        await queued
    runner._slots = 1  # a replica is back
    out = await b.submit(x(3), 1, clock.now() + 100.0, ("v",))
    assert float(out.outputs["y"][0, 0]) == 6.0
    await b.close()


async def test_the_no_replica_wait_starts_when_the_slots_go_not_when_a_request_looks():
    """The slots go (a lease runs out, the last replica dies: the backend says its capacity changed)
    while nothing is queued: a request arriving ``no_replica_wait_s`` later fails at once instead of
    waiting the whole wait again."""
    clock = FakeClock()
    runner = Runner(slots=1)
    b = Batcher(
        "m",
        make_policy("timeout", max_batch_size=4, max_wait_ms=0.0, default_variant="v"),
        runner,
        ["v"],
        max_batch_size=4,
        clock=clock,
        no_replica_wait_s=2.0,
    )
    b.start()
    runner._slots = 0
    b.capacity_changed()
    clock.advance(2.5)
    with pytest.raises(Unavailable, match="no running replica"):
        await asyncio.wait_for(b.submit(x(1), 1, 100.0, ("v",)), 1.0)  # (without: it waits)
    runner._slots = 1
    b.capacity_changed()
    out = await b.submit(x(2), 1, clock.now() + 100.0, ("v",))
    assert float(out.outputs["y"][0, 0]) == 4.0
    await b.close()


async def test_a_variant_without_a_lease_slot_is_not_counted_as_lost():
    """Under slot leases a variant nobody asks for may hold no slot while the others do: a capacity
    change then starts no wait, and a request for it later waits for a slot instead of failing."""

    class Leased(Runner):
        def slots(self, model, variant):
            return self._slots if variant == "a" else 0

    clock = FakeClock()
    runner = Leased(slots=1)
    b = Batcher(
        "m",
        make_policy("timeout", max_batch_size=4, max_wait_ms=0.0, default_variant="a"),
        runner,
        ["a", "b"],
        max_batch_size=4,
        clock=clock,
        no_replica_wait_s=2.0,
    )
    b.start()
    b.capacity_changed()
    clock.advance(2.5)
    pending = asyncio.ensure_future(b.submit(x(1), 1, clock.now() + 100.0, ("b",)))
    await asyncio.sleep(0.01)
    assert not pending.done(), "refused at once: a lease's empty variant was taken for a lost one"
    runner.slots = lambda model, variant: 1  # the lease moves a slot to it
    b.capacity_changed()
    out = await asyncio.wait_for(pending, 1.0)
    assert float(out.outputs["y"][0, 0]) == 2.0
    await b.close()


async def test_drain_answers_what_was_admitted_and_refuses_new_requests():
    """An unload drains the model's batcher: the requests queued and in a batch are answered, a new
    one is refused at once (503) with the reason given."""
    runner = Runner()
    runner.gate = asyncio.Event()
    b = Batcher("m", make_policy("timeout", max_batch_size=2, max_wait_ms=0, default_variant="v"), runner, ["v"], 2)
    b.start()
    admitted = [asyncio.create_task(b.submit(x(i), 1, 1e9, ("v",))) for i in range(3)]
    await asyncio.sleep(0)
    draining = asyncio.create_task(b.drain(30.0, "model 'm' was unloaded"))
    await asyncio.sleep(0)
    with pytest.raises(Unavailable, match="model 'm' was unloaded") as ei:
        await b.submit(x(9), 1, 1e9, ("v",))
    assert http_status(ei.value) == 503
    assert not draining.done()
    runner.gate.set()
    outs = await asyncio.gather(*admitted)
    await draining
    assert [float(o.outputs["y"][0, 0]) for o in outs] == [0.0, 2.0, 4.0]
