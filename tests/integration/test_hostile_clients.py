"""A hostile local user holds connections and calls open without sending; nobody else notices.

A gateway in this process (in-process backend, digits only) with short timeouts. Connections that
never finish their headers get a 408 naming ``header_timeout_s`` and are closed; a body that never
finishes is a 408 on every route; a kept-alive connection that idles past ``idle_timeout_s`` is
closed; idle connections take no request slot; a client address gets at most
``max_connections_per_client`` connections. On gRPC a call whose request message never arrives
ends with DEADLINE_EXCEEDED after ``body_timeout_s`` and frees its slot, a client address holds at
most ``max_connections_per_client`` calls, and a connection that never sends its HTTP/2 preface is
closed after ``header_timeout_s``. Meanwhile an ordinary client keeps being answered.
docs/reliability.md, "Connections and calls that never finish".
"""

from __future__ import annotations

import asyncio
import collections
import json
import shutil
import time

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from sloserve.gateway.config import Settings
from sloserve.gateway.server import Gateway
from sloserve.loadtests.openloop import pct, v2_body

pytestmark = pytest.mark.integration
INFER = "/inference.GRPCInferenceService/ModelInfer"
HEAD = b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # no blank line: never complete


def settings(repo, **kw) -> Settings:
    base: dict = dict(
        repo=repo,
        backend="inprocess",
        http_port=0,
        grpc_port=0,
        header_timeout_s=0.5,
        body_timeout_s=0.5,
        idle_timeout_s=1.0,
        loop_lag_shed_ms=0,  # the test's clients share the gateway's loop
    )
    base.update(kw)
    return Settings(**base)


@pytest.fixture
def repo(model_repo, tmp_path):
    r = tmp_path / "repo"
    shutil.copytree(model_repo / "digits", r / "digits")
    return r


async def started(s: Settings) -> Gateway:
    gw = Gateway(s)
    await gw.start()
    return gw


async def _until_closed(port: int, send: bytes, timeout: float = 10) -> tuple[bytes, float]:
    """Open a connection, send ``send``, read to EOF: what came back, and when the server closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    if send:
        writer.write(send)
        await writer.drain()
    try:
        data = await asyncio.wait_for(reader.read(), timeout=timeout)
    finally:
        writer.close()
    return data, time.monotonic() - t0


async def _latencies(port: int, n: int) -> list[float]:
    body = v2_body("input", [1.0] * 64, {"slo_ms": 1000})
    out = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        for _ in range(n):
            t0 = time.monotonic()
            r = await http.post("/v2/models/digits/infer", content=body)
            assert r.status_code == 200, r.text
            out.append(time.monotonic() - t0)
    return out


async def test_stalled_headers_are_closed_and_an_ordinary_client_is_served_meanwhile(repo):
    gw = await started(settings(repo, header_timeout_s=1.0))
    try:
        port = gw.http_port
        await _latencies(port, 10)  # warm-up: the replica's first runs
        idle = await _latencies(port, 40)
        # 100 connections: half send nothing at all, half stop in the middle of their headers
        stalls = [asyncio.create_task(_until_closed(port, HEAD if i % 2 else b"")) for i in range(100)]
        await asyncio.sleep(0.1)
        during = await _latencies(port, 40)
        idle_p99, during_p99 = pct(idle, 99), pct(during, 99)
        assert during_p99 <= max(2 * idle_p99, idle_p99 + 0.05), (idle_p99, during_p99)
        for data, waited in await asyncio.gather(*stalls):
            head, _, payload = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), data[:200]
            assert b"connection: close" in head.lower()
            assert "header_timeout_s" in json.loads(payload)["error"]
            assert 0.9 < waited < 3.5, waited
        assert not gw._conn_guard.conns  # every stalled connection is gone
    finally:
        await gw.stop()


async def test_a_stalled_body_is_408_on_every_route(repo):
    gw = await started(settings(repo))
    try:
        for path in ("/v2/repository/index", "/v2/repository/models/digits/load", "/v2/models/digits/infer"):
            req = (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                "Content-Length: 100\r\n\r\n{"
            ).encode()
            data, waited = await _until_closed(gw.http_port, req)
            head, _, payload = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), (path, data[:200])
            assert "body_timeout_s" in json.loads(payload)["error"], path
            assert 0.4 < waited < 3.0, (path, waited)
    finally:
        await gw.stop()


async def test_an_idle_kept_alive_connection_is_closed_and_a_busy_one_is_not(repo):
    gw = await started(settings(repo, idle_timeout_s=1.0))
    try:
        get = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.http_port)
        t_end = time.monotonic() + 2.5  # back to back (0.3 s apart) for longer than the idle timeout
        while time.monotonic() < t_end:
            writer.write(get)
            await writer.drain()
            line = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            assert line.startswith(b"HTTP/1.1 200"), line
            await asyncio.sleep(0.3)
        t0 = time.monotonic()
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""  # then idle: closed
        assert time.monotonic() - t0 < 2.5
        writer.close()
    finally:
        await gw.stop()


async def test_idle_connections_take_no_request_slot(repo):
    gw = await started(settings(repo, max_connections=16, header_timeout_s=30.0, idle_timeout_s=30.0))
    try:
        port = gw.http_port
        held = []
        for i in range(40):  # more open connections than max_connections: half kept alive, half never used
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if i % 2:
                writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
                assert head.startswith(b"HTTP/1.1 200"), head
            held.append(writer)
        await _latencies(port, 5)
        for w in held:
            w.close()
    finally:
        await gw.stop()


async def test_connections_per_client_are_capped(repo):
    gw = await started(settings(repo, max_connections_per_client=8, header_timeout_s=30.0))
    try:
        port = gw.http_port
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(8)]
        data, waited = await _until_closed(port, b"")
        head, _, payload = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), data[:200]
        assert "max_connections_per_client" in json.loads(payload)["error"]
        assert waited < 1.0
        for _, w in held:
            w.close()
        await asyncio.sleep(0.2)
        await _latencies(port, 3)  # the address may connect again
    finally:
        await gw.stop()


def _infer_request() -> bytes:
    req = pb.ModelInferRequest(model_name="digits")
    t = req.inputs.add()
    t.name, t.datatype = "input", "FP32"
    t.shape.extend([1, 64])
    req.raw_input_contents.append(np.ones(64, np.float32).tobytes())
    return req.SerializeToString()


async def _never():
    await asyncio.sleep(3600)
    yield b""


async def test_stalled_grpc_calls_end_free_their_slots_and_are_capped_per_client(repo):
    gw = await started(settings(repo, max_connections=16, max_connections_per_client=12))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as ch:
            infer = ch.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
            stall = ch.stream_unary(INFER)
            assert (await infer(_infer_request(), timeout=5)).model_name == "digits"
            idle = []
            for _ in range(20):
                t0 = time.monotonic()
                await infer(_infer_request(), timeout=5)
                idle.append(time.monotonic() - t0)
            calls = [stall(_never()) for _ in range(12)]  # the request message never comes
            await asyncio.sleep(0.1)
            with pytest.raises(grpc.aio.AioRpcError) as over:  # a 13th call from this address
                await infer(_infer_request(), timeout=5)
            assert over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_connections_per_client" in over.value.details()
            for c in calls:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await asyncio.wait_for(c, timeout=5)
                assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e.value
                assert "body_timeout_s" in e.value.details()
            # a flood of stalled calls beside an ordinary client: it is answered on time
            calls = [stall(_never()) for _ in range(8)]
            await asyncio.sleep(0.1)
            during = []
            for _ in range(20):
                t0 = time.monotonic()
                await infer(_infer_request(), timeout=5)
                during.append(time.monotonic() - t0)
            assert pct(during, 99) <= max(2 * pct(idle, 99), pct(idle, 99) + 0.05), (idle, during)
            for c in calls:
                with pytest.raises(grpc.aio.AioRpcError):
                    await asyncio.wait_for(c, timeout=5)
            assert gw._grpc is not None and not gw.dataplane.open_requests
    finally:
        await gw.stop()


async def test_a_grpc_connection_that_never_finishes_its_handshake_is_closed(repo):
    gw = await started(settings(repo, header_timeout_s=1.0, idle_timeout_s=30.0))
    try:
        for send in (b"", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"):  # nothing; the preface but no SETTINGS
            _, waited = await _until_closed(gw.grpc_port, send)
            assert 0.9 < waited < 4.0, (send, waited)
    finally:
        await gw.stop()


def _tiny_body(n: int) -> bytes:
    inputs = [{"name": f"i{k}", "shape": [1], "datatype": "FP32", "data": [0.0]} for k in range(n)]
    return json.dumps({"inputs": inputs}).encode()


_DEEP = 20_000  # under the 64 KiB a config override may take, so the depth check is what refuses it
ATTACKS = {  # name: (method, path, headers, body, the status it must get)
    "many tiny inputs": ("POST", "/v2/models/digits/infer", {"Content-Type": "application/json"}, _tiny_body(600), 400),
    "deep JSON infer": (
        "POST",
        "/v2/models/digits/infer",
        {"Content-Type": "application/json"},
        b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        400,
    ),
    "deep JSON load override": (
        "POST",
        "/v2/repository/models/digits/load",
        {"Content-Type": "application/json"},
        json.dumps({"parameters": {"config": "[" * _DEEP + "]" * _DEEP}}).encode(),
        400,
    ),
    "text/plain POST": ("POST", "/v2/repository/models/digits/load", {"Content-Type": "text/plain"}, b"{}", 415),
    "foreign Host": ("GET", "/v2/health/ready", {"Host": "evil.example.com"}, b"", 421),
}


@pytest.mark.parametrize("attack", [*ATTACKS, "connection flood"])
async def test_an_ordinary_client_keeps_its_p99_under_each_hostile_client(repo, attack):
    """While one hostile client sends the same bad request over and over on fresh connections (or
    holds 500 idle connections), every bad request gets its 4xx and an ordinary client's p99 stays
    within 2x of its idle p99 (or 50 ms of it: a 2-core box)."""
    gw = await started(settings(repo, header_timeout_s=5.0, body_timeout_s=5.0, idle_timeout_s=30.0))
    stop = asyncio.Event()
    got: list[int] = []
    held: list[asyncio.StreamWriter] = []

    async def hostile() -> None:
        method, path, headers, body, _ = ATTACKS[attack]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10) as http:
            while not stop.is_set():
                r = await http.request(method, path, content=body, headers={**headers, "Connection": "close"})
                got.append(r.status_code)

    async def flood() -> None:
        for _ in range(500):
            held.append((await asyncio.open_connection("127.0.0.1", gw.http_port))[1])
        await stop.wait()

    try:
        port = gw.http_port
        await _latencies(port, 10)
        idle = await _latencies(port, 40)
        task = asyncio.create_task(flood() if attack == "connection flood" else hostile())
        await asyncio.sleep(0.2)
        during = await _latencies(port, 40)
        stop.set()
        await asyncio.wait_for(task, 10)
        idle_p99, during_p99 = pct(idle, 99), pct(during, 99)
        assert during_p99 <= max(2 * idle_p99, idle_p99 + 0.05), (idle_p99, during_p99)
        if attack == "connection flood":
            assert len(held) == 500
        else:
            assert got and set(got) == {ATTACKS[attack][4]}, collections.Counter(got)
    finally:
        for w in held:
            w.close()
        await gw.stop()
