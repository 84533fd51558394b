"""Slow and oversized clients get a clear 4xx and take nothing from the others.

A gateway in this process (in-process backend) with ``body_timeout_s`` 0.5 s and ``max_json_bytes``
4 KiB: 40 clients that send their headers and a few bytes of body and then stall (slowloris) each
get 408 naming the setting, and their connections are closed; while they stall, an ordinary client
is answered at once. A JSON body over ``max_json_bytes`` is 413 saying to send binary or gRPC.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import httpx
import pytest

from sloserve.gateway.config import Settings
from sloserve.gateway.server import Gateway
from sloserve.loadtests.openloop import v2_body

pytestmark = pytest.mark.integration


@pytest.fixture
async def gateway(model_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(model_repo / "digits", repo / "digits")
    # (the test's clients share the gateway's event loop, so its lag is theirs too: no lag shedding)
    settings = Settings(
        repo=repo,
        backend="inprocess",
        http_port=0,
        grpc_port=0,
        body_timeout_s=0.5,
        max_json_bytes=4096,
        loop_lag_shed_ms=0,
    )
    gw = Gateway(settings)
    await gw.start()
    yield gw
    await gw.stop()


async def _stall(port: int, declared: int = 2000) -> tuple[bytes, float]:
    """Headers, 10 bytes of a ``declared``-byte body, then nothing: what comes back, and when."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    writer.write(
        b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {declared}\r\n\r\n".encode()
        + b'{"inputs":'
    )
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), timeout=10)  # to EOF: the server must close
    writer.close()
    return data, time.monotonic() - t0


async def test_stalled_bodies_get_408_and_others_are_served_meanwhile(gateway):
    port = gateway.http_port
    body = v2_body("input", [1.0] * 64, {"slo_ms": 1000})
    # a first request before the stalls, on a connection of its own: what a cold first answer costs
    # (the replica's first run) is not counted against the stalled clients below
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        assert (await http.post("/v2/models/digits/infer", content=body)).status_code == 200
    stalls = [asyncio.create_task(_stall(port)) for _ in range(40)]
    await asyncio.sleep(0.1)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        t0 = time.monotonic()
        r = await http.post("/v2/models/digits/infer", content=body)
        took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert took < 0.3, f"an ordinary request waited {took:.3f} s behind stalled clients"
    for data, waited in await asyncio.gather(*stalls):
        head, _, payload = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), data[:200]
        assert b"connection: close" in head.lower()
        assert "body_timeout_s" in json.loads(payload)["error"]
        assert 0.4 < waited < 3.0, waited
    assert gateway.dataplane.inflight.held == 0 and gateway.dataplane.open_requests == 0


async def test_json_over_the_cap_is_413_naming_the_way_out(gateway):
    body = v2_body("input", [1.0] * 64, {"slo_ms": 1000})
    big = body[:-1] + b"," + b'"pad":"' + b"x" * 5000 + b'"}'
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.http_port}", timeout=5) as http:
        r = await http.post("/v2/models/digits/infer", content=big)
        assert r.status_code == 413, r.text
        assert "max_json_bytes" in r.json()["error"] and "binary" in r.json()["error"]
        assert (await http.post("/v2/models/digits/infer", content=body)).status_code == 200
