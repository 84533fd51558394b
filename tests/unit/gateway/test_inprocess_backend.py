"""The in-process backend's replica hand-off: one batch at a time per replica, a queued batch
goes to the replica that frees first, and a batch abandoned before it reached a replica never runs.
Replicas are fakes that block on events (no model files, no sleeps)."""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from sloserve.gateway.backends.threads import InProcessBackend
from sloserve.gateway.errors import DeadlineExceeded
from sloserve.replica.runtime import RuntimeOptions


class Gated:
    """A replica whose run blocks until its gate for that batch opens; records what ran, in order."""

    def __init__(self, name: str, log: list):
        self.name, self.log = name, log
        self.gates: dict[float, threading.Event] = {}

    def gate(self, tag: float) -> threading.Event:
        return self.gates.setdefault(tag, threading.Event())

    def run(self, inputs):
        tag = float(inputs["x"][0, 0])
        self.log.append(("start", self.name, tag))
        assert self.gate(tag).wait(5), "test gate never opened"
        self.log.append(("end", self.name, tag))
        return {"y": inputs["x"] * 2}


def backend(replicas, depth: int = 1) -> InProcessBackend:
    b = InProcessBackend.__new__(InProcessBackend)
    InProcessBackend.__init__(b, repo=None, opts=RuntimeOptions(device="cpu"), pipeline_depth=depth)
    b._install("m", "v", replicas)
    b._fast[("m", "v")] = False
    b._pool = ThreadPoolExecutor(max_workers=8)
    b._ready = True
    return b


def x(tag: float):
    return {"x": np.full((1, 2), tag, np.float32)}


async def until(cond, what: str):
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"timed out waiting for {what}")


async def test_depth_2_queues_the_second_batch_behind_the_running_one():
    log: list = []
    rep = Gated("r0", log)
    b = backend([rep], depth=2)
    assert b.slots("m", "v") == 2
    first = asyncio.create_task(b.run("m", "v", x(1)))
    await until(lambda: ("start", "r0", 1.0) in log, "the first batch to start")
    second = asyncio.create_task(b.run("m", "v", x(2)))
    await asyncio.sleep(0.02)
    assert ("start", "r0", 2.0) not in log  # one batch at a time per replica
    rep.gate(1.0).set()
    rep.gate(2.0).set()
    await first
    r2 = await second
    assert log == [("start", "r0", 1.0), ("end", "r0", 1.0), ("start", "r0", 2.0), ("end", "r0", 2.0)]
    np.testing.assert_array_equal(r2.outputs["y"], x(2)["x"] * 2)


async def test_a_queued_batch_goes_to_the_replica_that_frees_first():
    log: list = []
    r0, r1 = Gated("r0", log), Gated("r1", log)
    b = backend([r0, r1], depth=2)
    a = asyncio.create_task(b.run("m", "v", x(1)))
    c = asyncio.create_task(b.run("m", "v", x(2)))
    await until(lambda: sum(e[0] == "start" for e in log) == 2, "both replicas busy")
    third = asyncio.create_task(b.run("m", "v", x(3)))
    await asyncio.sleep(0.02)
    busy_with_2 = next(e[1] for e in log if e == ("start", e[1], 2.0))
    (r0 if busy_with_2 == "r0" else r1).gate(2.0).set()  # the replica running batch 2 frees first
    await until(lambda: any(e[0] == "start" and e[2] == 3.0 for e in log), "batch 3 to start")
    assert ("start", busy_with_2, 3.0) in log
    for r in (r0, r1):
        for t in (1.0, 3.0):
            r.gate(t).set()
    await asyncio.gather(a, c, third)


async def test_a_batch_abandoned_before_it_reached_a_replica_is_never_run():
    log: list = []
    rep = Gated("r0", log)
    b = backend([rep], depth=2)
    first = asyncio.create_task(b.run("m", "v", x(1)))
    await until(lambda: ("start", "r0", 1.0) in log, "the first batch to start")
    with pytest.raises(DeadlineExceeded, match="was not back"):
        await b.run("m", "v", x(2), timeout_s=0.02)
    rep.gate(1.0).set()
    await first
    follow = asyncio.create_task(b.run("m", "v", x(3)))
    await until(lambda: ("start", "r0", 3.0) in log, "the next batch to start")
    rep.gate(3.0).set()
    await follow
    assert ("start", "r0", 2.0) not in log  # skipped, not run late behind the first


async def test_shared_replicas_run_one_batch_at_a_time_whatever_its_variant():
    """A shared model's replica holds both variants: a batch of 'w' waits for the batch of 'v' on it."""

    class Watched(queue.Queue):  # the free queue, telling when a batch is blocked waiting on it
        waiting = 0

        def get(self, *a, **k):
            self.waiting += 1
            return super().get(*a, **k)

    log: list = []
    big, small = Gated("big#0", log), Gated("small#0", log)
    b = InProcessBackend.__new__(InProcessBackend)
    InProcessBackend.__init__(b, repo=None, opts=RuntimeOptions(device="cpu"), shared={"m"})
    free = Watched()
    b._install("m", "v", [big], free_q=free)
    b._install("m", "w", [small])  # joins the model's queue, as start() does for every variant
    b._fast = {("m", "v"): False, ("m", "w"): False}
    b._pool = ThreadPoolExecutor(max_workers=4)
    b._ready = True
    assert b._free_q[("m", "w")] is free and b.shared("m") and not b.shared("other")
    assert b.slots("m", "w") == b.slots("m", "v") == 1
    first = asyncio.ensure_future(b.run("m", "v", x(1.0)))
    await until(lambda: ("start", "big#0", 1.0) in log, "the first batch to start")
    second = asyncio.ensure_future(b.run("m", "w", x(2.0)))
    await until(lambda: free.waiting == 2, "the second batch to wait for the replica")
    assert ("start", "small#0", 2.0) not in log  # blocked: the one replica runs the other variant
    big.gate(1.0).set()
    small.gate(2.0).set()
    r1, r2 = await first, await second
    assert r1.outputs["y"][0, 0] == 2.0 and r2.outputs["y"][0, 0] == 4.0
    assert log.index(("end", "big#0", 1.0)) < log.index(("start", "small#0", 2.0))
    with pytest.raises(ValueError, match="same number of replicas"):
        b._install("m", "u", [small, small])
    b._pool.shutdown(wait=True)


async def test_start_shares_one_queue_per_shared_model_and_runs_nothing_inline(model_repo):
    """start() on the real repository: digits shared (one queue of replica indices for its three variants,
    never inline even where a batch is tiny), heavy not (a queue per variant, tiny batches inline)."""
    from sloserve.models.repository import ModelRepository

    repo = ModelRepository(model_repo).load()
    b = InProcessBackend(repo, RuntimeOptions(device="cpu"), instances=2, inline_below_s=1.0, shared={"digits"})
    await b.start()
    try:
        qs = {v: b._free_q[("digits", v)] for v in ("small", "medium", "large")}
        assert qs["small"] is qs["medium"] is qs["large"] and qs["small"].qsize() == 2
        assert not any(b._fast[("digits", v)] for v in qs)
        assert b._free_q[("heavy", "small")] is not b._free_q[("heavy", "large")]
        assert b._fast[("heavy", "small")]  # not shared: a tiny batch still runs on the loop
        out = await b.run("digits", "medium", {"input": np.zeros((2, 64), np.float32)})
        assert out.outputs["probs"].shape == (2, 10) and qs["small"].qsize() == 2
    finally:
        await b.stop()
