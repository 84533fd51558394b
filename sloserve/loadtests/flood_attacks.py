"""Attacker requests for :mod:`sloserve.loadtests.flood`: slow headers, idle connections, stalled gRPC
calls, and small malformed or misaddressed HTTP requests.

Every function here ends in an outcome string: an HTTP status, a gRPC code name, ``closed`` (the
server closed before answering), ``reset``, or ``hung`` (no answer within ``--answer-timeout-s``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from sloserve.loadtests.openloop import v2_body

MIB = 1 << 20
DEPTH = 50_000  # nesting of the ``deep`` bodies
TINY_INPUTS = 18_000  # one-element inputs in the ``tiny`` body
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"

# Writes a request to a connection while its answer (the task) is awaited
Sender = Callable[[asyncio.StreamWriter, asyncio.Task[str]], Awaitable[None]]


async def read_answer(reader: asyncio.StreamReader, timeout_s: float) -> str:
    """The status code of the answer, ``closed`` (EOF before any), ``reset``, or ``hung``."""
    try:
        async with asyncio.timeout(timeout_s):
            line = await reader.readuntil(b"\r\n")
            return line.split(b" ", 2)[1].decode()
    except TimeoutError:
        return "hung"
    except asyncio.IncompleteReadError:
        return "closed"
    except (ConnectionError, OSError):
        return "reset"


def auth_headers(args) -> dict[str, str]:
    token = getattr(args, "auth_token", None)
    return {"Authorization": f"Bearer {token}"} if token else {}


def head_lines(method: str, path: str, host: str, headers: dict[str, str]) -> bytes:
    """The request line and header lines, without the blank line that ends the headers."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n").encode()


# ------------------------------------------------------------------ bodies


def tiny_body(n: int = TINY_INPUTS) -> bytes:
    """``n`` inputs of one FP32 element each, named input0..input{n-1} (about 62 bytes each)."""
    one = '{"name":"input%d","shape":[1],"datatype":"FP32","data":[0]}'
    return ('{"inputs":[' + ",".join(one % i for i in range(n)) + "]}").encode()


def deep_infer_body(depth: int = DEPTH) -> bytes:
    return b'{"inputs":' + b"[" * depth + b"]" * depth + b"}"


def deep_load_body(depth: int = DEPTH) -> bytes:
    """A repository load override whose ``config`` string is JSON nested ``depth`` deep."""
    return b'{"parameters":{"config":"' + b"[" * depth + b"]" * depth + b'"}}'


# ------------------------------------------------------------------ one HTTP request each


async def exchange(host: str, port: int, timeout_s: float, send: Sender) -> str:
    """Open a connection, read its answer while ``send`` writes the request, and close it: the
    answer's outcome. The answer is awaited from the start, so an early refusal (before the whole
    request is sent, or the connection broken under the writes) is still read."""
    reader, writer = await asyncio.open_connection(host, port)
    answer = asyncio.create_task(read_answer(reader, timeout_s))
    try:
        with contextlib.suppress(ConnectionError, OSError):
            await send(writer, answer)
        return await answer
    finally:
        if not answer.done():
            answer.cancel()
        writer.close()


async def http_request(
    host: str, port: int, method: str, path: str, headers: dict[str, str], body: bytes, timeout_s: float
) -> str:
    """One request on a fresh connection; the body goes in 1 MiB writes until it is sent or answered."""
    hdrs = dict(headers)
    if body or method != "GET":
        hdrs["Content-Length"] = str(len(body))

    async def send(writer: asyncio.StreamWriter, answer: asyncio.Task[str]) -> None:
        writer.write(head_lines(method, path, hdrs.pop("Host", f"{host}:{port}"), hdrs) + b"\r\n")
        for i in range(0, len(body), MIB):
            if answer.done():
                break
            writer.write(body[i : i + MIB])
            await writer.drain()

    return await exchange(host, port, timeout_s, send)


async def slow_headers(host: str, port: int, path: str, args: argparse.Namespace) -> str:
    """The request line and a few header lines, then one more header line every 2 s, never the blank
    line that ends the headers (slowloris on headers)."""
    hdrs = {"Content-Type": "application/json", **auth_headers(args), "X-Slow-0": "a", "X-Slow-1": "b"}

    async def send(writer: asyncio.StreamWriter, answer: asyncio.Task[str]) -> None:
        writer.write(head_lines("POST", path, f"{host}:{port}", hdrs))
        await writer.drain()
        i = 2
        while not answer.done():
            await asyncio.wait([answer], timeout=2.0)
            if not answer.done():
                writer.write(f"X-Slow-{i}: {i}\r\n".encode())
                await writer.drain()
                i += 1

    return await exchange(host, port, args.answer_timeout_s, send)


async def small_attack(kind: str, host: str, port: int, args, turn: int) -> tuple[str, str]:
    """One request of the ``tiny``, ``deep``, ``textplain`` or ``host`` attack: (tag, outcome). The
    two-request attacks alternate between their requests by ``turn``."""
    infer = f"/v2/models/{args.model}/infer"
    load = f"/v2/repository/models/{args.model}/load"
    js = {"Content-Type": "application/json", **auth_headers(args)}
    t = args.answer_timeout_s
    if kind == "tiny":
        return kind, await http_request(host, port, "POST", infer, js, _bodies("tiny"), t)
    if kind == "deep":
        if turn % 2 == 0:
            return "deep-infer", await http_request(host, port, "POST", infer, js, _bodies("deep-infer"), t)
        return "deep-load", await http_request(host, port, "POST", load, js, _bodies("deep-load"), t)
    if kind == "textplain":
        hdrs = {"Content-Type": "text/plain", **auth_headers(args)}
        return kind, await http_request(host, port, "POST", load, hdrs, b"{}", t)
    if kind == "host":
        evil = {"Host": "evil.example.com", **auth_headers(args)}
        if turn % 2 == 0:
            return "host-ready", await http_request(host, port, "GET", "/v2/health/ready", evil, b"", t)
        ok = v2_body(args.input, [0.5] * args.features)
        return "host-infer", await http_request(host, port, "POST", infer, {**evil, **js}, ok, t)
    raise ValueError(kind)


_BODY_CACHE: dict[str, bytes] = {}


def _bodies(name: str) -> bytes:
    if name not in _BODY_CACHE:
        make = {"tiny": tiny_body, "deep-infer": deep_infer_body, "deep-load": deep_load_body}[name]
        _BODY_CACHE[name] = make()
    return _BODY_CACHE[name]


# ------------------------------------------------------------------ idle connections


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; return the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def idle_flood(host: str, port: int, args, outcomes: Counter, stop_at: float, reserve_fds: int) -> dict:
    """Open up to ``--idle-connections`` TCP connections (a bounded number connecting at once, each
    given 5 s), send nothing, and hold each until the phase ends (``--reconnect-s``: a connection the
    server ends is opened again that long after, all phase long). Outcomes per connection: ``open``
    (still open at the end), ``closed`` / ``reset`` / a status (the server ended it), ``refused``,
    ``connect-timeout``. Returns when the server ended connections, in seconds from the start."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    n = max(0, min(args.idle_connections, soft - reserve_fds))
    t0 = time.monotonic()
    ended_at: list[float] = []
    connecting = asyncio.Semaphore(256)
    accepted = 0

    async def hold() -> None:
        while True:
            await hold_once()
            again = getattr(args, "reconnect_s", None)
            if again is None or time.monotonic() + again >= stop_at:
                return
            await asyncio.sleep(again)  # the server ended it: open another (a sustained flood)

    async def hold_once() -> None:
        nonlocal accepted
        async with connecting:
            left = stop_at - time.monotonic()
            if left <= 0:
                outcomes["not-opened"] += 1
                return
            try:
                async with asyncio.timeout(min(5.0, left)):
                    reader, writer = await asyncio.open_connection(host, port)
            except TimeoutError:
                outcomes["connect-timeout"] += 1
                return
            except OSError:
                outcomes["refused"] += 1
                return
            accepted += 1
        try:
            out = await read_answer(reader, max(0.0, stop_at - time.monotonic()))
            if out == "hung":
                out = "open"
            else:
                ended_at.append(time.monotonic() - t0)
            outcomes[out] += 1
        finally:
            writer.close()

    await asyncio.gather(*(hold() for _ in range(n)))
    ended_at.sort()
    return {
        "requested": args.idle_connections,
        "attempted": n,
        "fd_soft_limit": soft,
        "accepted": accepted,
        "ended_by_server": len(ended_at),
        "ended_first_s": round(ended_at[0], 2) if ended_at else None,
        "ended_median_s": round(ended_at[len(ended_at) // 2], 2) if ended_at else None,
        "ended_last_s": round(ended_at[-1], 2) if ended_at else None,
        "ended_each_s": dict(Counter(str(int(x)) for x in ended_at)),
    }


# ------------------------------------------------------------------ gRPC calls whose message never comes


async def grpc_stall_connection(args, outcomes: Counter, stop_at: float) -> None:
    """One connection (its own subchannel) carrying ``--grpc-streams`` ModelInfer calls at once,
    each opened with no request message ever sent; each call ends and is replaced until the phase
    ends. The client deadline sent is ``--answer-timeout-s`` + 10 s, and the client stops waiting
    at ``--answer-timeout-s`` (``hung``), so any DEADLINE_EXCEEDED seen is the server's own."""
    import grpc
    from tritonclient.grpc import service_pb2

    channel = grpc.aio.insecure_channel(args.grpc, options=[("grpc.use_local_subchannel_pool", 1)])
    call_fn = channel.stream_unary(
        GRPC_INFER,
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )
    token = getattr(args, "auth_token", None)
    metadata = (("authorization", f"Bearer {token}"),) if token else None

    async def never():
        await asyncio.Event().wait()
        yield service_pb2.ModelInferRequest(model_name=args.model)  # never reached

    async def one_stream() -> None:
        while time.monotonic() < stop_at:
            call = call_fn(never(), timeout=args.answer_timeout_s + 10.0, metadata=metadata)
            try:
                async with asyncio.timeout(args.answer_timeout_s):
                    await call
                out = "OK"
            except TimeoutError:
                out = "hung"
            except grpc.aio.AioRpcError as e:
                out = e.code().name
            finally:
                call.cancel()
            outcomes[out] += 1
            if out == "UNAVAILABLE":
                await asyncio.sleep(0.05)

    try:
        await asyncio.gather(*(one_stream() for _ in range(args.grpc_streams)))
    finally:
        await channel.close()
