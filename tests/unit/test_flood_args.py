"""sloserve/loadtests/flood.py: its arguments, the attack bodies, and the new attackers against a tiny local server."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from types import SimpleNamespace

import pytest

from sloserve.loadtests import flood, flood_attacks


def test_the_default_attacks_are_unchanged_and_the_new_ones_are_accepted():
    args = flood.parse_args(["--pid", "1"])
    assert args.attacks == ["stall", "declared", "chunked", "json", "grpc"]
    assert args.idle_connections == 4100 and args.grpc_streams == 128 and args.auth_token is None
    new = "headers,idle,grpc-stall,tiny,deep,textplain,host"
    args = flood.parse_args(["--pid", "1", "--attacks", new, "--auth-token", "t"])
    assert args.attacks == new.split(",") and args.auth_token == "t"
    with pytest.raises(SystemExit):
        flood.parse_args(["--pid", "1", "--attacks", "headers,nope"])


def test_the_bodies_have_the_promised_shape():
    tiny = json.loads(flood_attacks.tiny_body())
    assert len(tiny["inputs"]) == 18_000 and tiny["inputs"][-1]["name"] == "input17999"
    assert all(len(i["data"]) == 1 for i in tiny["inputs"])
    deep = flood_attacks.deep_infer_body(7)
    assert deep == b'{"inputs":[[[[[[[]]]]]]]}'
    load = json.loads(flood_attacks.deep_load_body())
    assert load["parameters"]["config"] == "[" * 50_000 + "]" * 50_000


def _args(**kw) -> SimpleNamespace:
    base = dict(answer_timeout_s=3.0, auth_token="tok", model="m", input="input", features=2, idle_connections=5)
    return SimpleNamespace(**{**base, **kw})


async def _serve(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_slow_headers_read_the_servers_answer_and_never_end_the_headers():
    seen: list[bytes] = []

    async def handler(reader, writer):
        for _ in range(3):
            seen.append(await reader.readuntil(b"\r\n"))
        writer.write(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main():
        server, port = await _serve(handler)
        async with server:
            return await flood_attacks.slow_headers("127.0.0.1", port, "/v2/models/m/infer", _args())

    assert asyncio.run(main()) == "408"
    assert seen[0].startswith(b"POST /v2/models/m/infer HTTP/1.1") and b"\r\n" not in seen[1:]


@pytest.mark.parametrize("kind, tags", [("textplain", ["textplain"]), ("host", ["host-ready", "host-infer"])])
def test_small_attacks_send_what_they_say(kind, tags):
    heads: list[bytes] = []

    async def handler(reader, writer):
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 421 Misdirected Request\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main():
        server, port = await _serve(handler)
        async with server:
            return [await flood_attacks.small_attack(kind, "127.0.0.1", port, _args(), t) for t in range(len(tags))]

    assert asyncio.run(main()) == [(t, "421") for t in tags]
    assert all(b"Authorization: Bearer tok\r\n" in h for h in heads)
    if kind == "host":
        assert heads[0].startswith(b"GET /v2/health/ready") and b"Host: evil.example.com\r\n" in heads[0]
        assert b"Host: evil.example.com\r\n" in heads[1]
    else:
        assert b"Content-Type: text/plain\r\n" in heads[0] and b"/v2/repository/models/m/load" in heads[0]


def test_idle_connections_are_held_and_the_servers_closes_are_timed():
    async def handler(reader, writer):
        await asyncio.sleep(0.2)
        writer.close()

    async def main():
        server, port = await _serve(handler)
        async with server:
            outcomes: Counter = Counter()
            details = await flood_attacks.idle_flood(
                "127.0.0.1", port, _args(), outcomes, time.monotonic() + 1.0, reserve_fds=64
            )
            return outcomes, details

    outcomes, details = asyncio.run(main())
    assert outcomes == {"closed": 5} and details["accepted"] == 5 and details["ended_by_server"] == 5
    assert 0.1 < details["ended_first_s"] < 0.9
