"""Triton's queue policy: priority levels, a request's queue timeout (REJECT / DELAY), a level's queue size."""

import asyncio
import re

import numpy as np
import pytest

from sloserve.batching.batcher import Batcher, RunResult
from sloserve.batching.policy import make_policy
from sloserve.batching.queuelimit import QueueFull, QueueLimit, QueueTimeout
from sloserve.gateway.queuepolicy import QueueRules
from sloserve.gateway.transports.status import grpc_code, http_status
from sloserve.models.schema import DynamicBatching, QueuePolicy


class Runner:
    round_trip_latency = True
    pipeline_depth = 1

    def __init__(self):
        self.gate = asyncio.Event()
        self.order = []

    def slots(self, model, variant):
        return 1

    def shared(self, model):
        return False

    async def run(self, model, variant, inputs, timeout_s=None):
        self.order.append(float(inputs["x"][0, 0]))
        await self.gate.wait()
        return RunResult({"y": inputs["x"]}, 0.001)


def x(v):
    return {"x": np.full((1, 2), v, np.float32)}


def batcher(runner):
    policy = make_policy("timeout", max_batch_size=1, max_wait_ms=0, default_variant="v")
    b = Batcher("m", policy, runner, ["v"], max_batch_size=1)
    b.start()
    return b


def test_sloserve_models_allow_timeouts_and_have_no_levels():
    r = QueueRules.of(None)
    assert r.level(0) == r.level(3) == 0
    assert r.limit(0, None) is None
    assert r.limit(0, 2500) == QueueLimit(0.0025, False, 0)


def test_triton_levels_and_overrides():
    db = DynamicBatching(
        priority_levels=3,
        default_priority_level=2,
        default_queue_policy=QueuePolicy(default_timeout_us=10_000, allow_timeout_override=True),
        priority_queue_policy={1: QueuePolicy(timeout_action="DELAY", default_timeout_us=0, max_queue_size=4)},
    )
    r = QueueRules.of(db)
    assert [r.level(p) for p in (0, 1, 2, 3, 4)] == [2, 1, 2, 3, 2]
    assert r.limit(2, None) == QueueLimit(0.01, False, 0)
    assert r.limit(2, 5_000) == QueueLimit(0.005, False, 0)  # shorter than the default: taken
    assert r.limit(2, 50_000) == QueueLimit(0.01, False, 0)  # longer: the default stays
    assert r.limit(1, 5_000) == QueueLimit(None, True, 4)  # level 1 allows no override
    # a config.pbtxt's dynamic_batching without allow_timeout_override ignores a request's timeout
    plain = QueueRules.of(DynamicBatching())
    assert plain.limit(0, 5_000) is None


async def test_a_request_still_queued_past_its_timeout_fails_with_tritons_error():
    runner = Runner()
    b = batcher(runner)
    first = asyncio.create_task(b.submit(x(1), 1, 10.0, ("v",)))
    await asyncio.sleep(0.005)  # dispatched, held by the gate
    with pytest.raises(QueueTimeout, match="Request timeout expired") as ei:
        await b.submit(x(2), 1, 10.0, ("v",), limit=QueueLimit(timeout_s=0.02))
    assert http_status(ei.value) == 503 and grpc_code(ei.value).name == "UNAVAILABLE"
    assert b.queued_rows == 0
    runner.gate.set()
    await first
    # a dispatched request is not failed by its timeout
    out = await b.submit(x(3), 1, 10.0, ("v",), limit=QueueLimit(timeout_s=0.001))
    assert out.outputs["y"][0, 0] == 3
    await b.close()


async def test_delay_moves_the_request_behind_every_other():
    runner = Runner()
    b = batcher(runner)
    tasks = [asyncio.create_task(b.submit(x(1), 1, 10.0, ("v",)))]
    await asyncio.sleep(0.005)
    tasks.append(asyncio.create_task(b.submit(x(2), 1, 10.0, ("v",), limit=QueueLimit(0.01, delay=True))))
    await asyncio.sleep(0.001)
    tasks.append(asyncio.create_task(b.submit(x(3), 1, 10.0, ("v",))))
    await asyncio.sleep(0.03)
    runner.gate.set()
    await asyncio.gather(*tasks)
    assert runner.order == [1.0, 3.0, 2.0]
    await b.close()


async def test_a_full_level_refuses_with_tritons_error():
    runner = Runner()
    b = batcher(runner)
    lim = QueueLimit(max_queued=1)
    first = asyncio.create_task(b.submit(x(1), 1, 10.0, ("v",), priority=1, limit=lim))
    await asyncio.sleep(0.005)  # dispatched: no longer queued
    second = asyncio.create_task(b.submit(x(2), 1, 10.0, ("v",), priority=1, limit=lim))
    await asyncio.sleep(0.001)
    with pytest.raises(QueueFull, match="Exceeds maximum queue size"):
        await b.submit(x(3), 1, 10.0, ("v",), priority=1, limit=lim)
    other = asyncio.create_task(b.submit(x(4), 1, 10.0, ("v",), priority=2, limit=lim))  # another level
    runner.gate.set()
    await asyncio.gather(first, second, other)
    await b.close()


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"timeout": -1}, "parameter 'timeout' must be a non-negative integer (microseconds)"),
        ({"timeout": 1.5}, "parameter 'timeout' must be a non-negative integer (microseconds)"),
        ({"timeout": "100"}, "parameter 'timeout' must be a non-negative integer (microseconds)"),
        ({"timeout": True}, "parameter 'timeout' must be a non-negative integer (microseconds)"),
        ({"timeout": 2**63}, "parameter 'timeout' must be a non-negative integer (microseconds)"),
        ({"priority": "high"}, "parameter 'priority' must be an integer"),
        ({"priority": 1.0}, "parameter 'priority' must be an integer"),
        ({"priority": 2**64}, "parameter 'priority' must be an integer"),
    ],
)
def test_a_bad_timeout_or_priority_is_a_client_error_naming_the_parameter(raw, says):
    from sloserve.gateway.errors import InvalidArgument
    from sloserve.gateway.transports.codec import parse_params

    with pytest.raises(InvalidArgument, match=re.escape(says)):
        parse_params(raw)
