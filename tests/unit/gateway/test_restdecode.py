"""RestDecoder: large JSON bodies decode in a worker process, with the same answers as inline."""

from __future__ import annotations

import os
import signal

import orjson
import psutil
import pytest

from sloserve.gateway.errors import InvalidArgument, Unavailable
from sloserve.gateway.transports.codec import InputLimits
from sloserve.gateway.transports.restdecode import RestDecoder

LIMITS = InputLimits(max_elements=1 << 20, max_rows=64, allow_nonfinite=False)


def _body(n: int = 64, dtype: str = "FP32") -> bytes:
    return orjson.dumps({"inputs": [{"name": "input", "shape": [1, n], "datatype": dtype, "data": [0.5] * n}]})


@pytest.fixture
def offloading():
    d = RestDecoder(LIMITS, offload_bytes=1)  # every body goes to the worker
    d.start()
    yield d
    d.close()


async def test_the_worker_decodes_as_inline_does_and_refuses_alike(offloading):
    inline = RestDecoder(LIMITS, offload_bytes=None)
    a = await offloading.decode(_body(), None, "digits", None, None)
    b = await inline.decode(_body(), None, "digits", None, None)
    assert a.inputs["input"][1].tolist() == b.inputs["input"][1].tolist() and a.model == "digits"
    for bad in (b"{nope", _body(dtype="FP99")):
        with pytest.raises(InvalidArgument) as worker_err:
            await offloading.decode(bad, None, "digits", None, None)
        with pytest.raises(InvalidArgument) as inline_err:
            await inline.decode(bad, None, "digits", None, None)
        assert worker_err.value.message == inline_err.value.message


async def test_a_dead_worker_is_a_503_and_the_next_body_gets_a_new_one(offloading):
    await offloading.decode(_body(), None, "digits", None, None)
    workers = [p for p in psutil.Process().children() if "spawn_main" in " ".join(p.cmdline())]
    assert workers
    for p in workers:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(5)
    with pytest.raises(Unavailable) as e:
        await offloading.decode(_body(), None, "digits", None, None)
    assert e.value.retry_after_s == 1.0
    again = await offloading.decode(_body(), None, "digits", None, None)
    assert again.inputs["input"][1].shape == (1, 64)
