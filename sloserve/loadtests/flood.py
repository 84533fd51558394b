"""A flood of slow and oversized clients beside ordinary ones: does anyone else notice?

Three phases against a running gateway: ``before`` (ordinary clients only), ``flood`` (the same
ordinary clients while attackers run in a separate process), ``after``. The ordinary clients send
Poisson arrivals of one-row requests (open loop, latency from each request's scheduled send time,
:mod:`sloserve.loadtests.openloop`). The gateway's resident memory is sampled throughout (the process given by
``--pid``, and it with every descendant). Every attacker request ends in an answer (its status or
gRPC code), a connection the server closed or reset, or ``hung``: nothing is dropped from the count.

Attacks (each a loop of ``--concurrency`` connections for the flood's length, unless said):

``stall``      headers and 10 bytes of a declared 2,000-byte body, then nothing (slowloris);
``declared``   a Content-Length of 10 GiB, then body bytes as fast as the socket takes them;
``chunked``    a chunked body streamed in 1 MiB chunks until the server answers;
``json``       a JSON body of ``--json-mib`` MiB (a tensor of small integers) that the server must
               parse or refuse; it expands many times over while parsed;
``grpc``       gRPC ModelInfer messages of ``--grpc-mib`` MiB of raw input;
``headers``    the request line and a few header lines, then one more header line every 2 s and
               never the blank line that ends them (slowloris on headers);
``idle``       up to ``--idle-connections`` TCP connections opened at once and held, sending nothing,
               for the whole phase (one attack, not a loop; counts how many were accepted, and how
               many the server ended and when, under ``idle_connections`` in the result);
``grpc-stall`` ModelInfer calls whose request message never comes: ``--grpc-streams`` such calls at
               once on each of the ``--concurrency`` connections;
``tiny``       a JSON infer body of 18,000 one-element inputs (about 1.1 MB);
``deep``       JSON nested 50,000 deep: as the infer ``inputs`` (``deep-infer``) and as the
               ``config`` of a repository load (``deep-load``), in turn;
``textplain``  a repository load with ``Content-Type: text/plain`` and the body ``{}`` (the kind of
               request a browser sends cross-site without asking first);
``host``       a readiness GET (``host-ready``) and an infer POST (``host-infer``), in turn, with
               ``Host: evil.example.com``.

The default runs the first five. ``--auth-token`` sends ``Authorization: Bearer TOKEN`` from the
attackers and the ordinary clients alike.

    python -m sloserve.loadtests.flood --url http://127.0.0.1:8000 --grpc 127.0.0.1:8001 --pid PID \\
        --model digits --input input --features 64 --rate 100 --seconds 10 --out flood.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

import psutil

from sloserve.loadtests.flood_attacks import (
    MIB,
    auth_headers,
    grpc_stall_connection,
    idle_flood,
    raise_fd_limit,
    read_answer,
    slow_headers,
    small_attack,
)
from sloserve.loadtests.openloop import run_open_loop, v2_body
from sloserve.loadtests.results import write_result

DEFAULT_ATTACKS = ("stall", "declared", "chunked", "json", "grpc")
ATTACKS = (*DEFAULT_ATTACKS, "headers", "idle", "grpc-stall", "tiny", "deep", "textplain", "host")
SMALL_ATTACKS = ("tiny", "deep", "textplain", "host")


# ------------------------------------------------------------------ attackers (a child process)


async def _http_attack(kind: str, host: str, port: int, path: str, args) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in auth_headers(args).items())
    answer: asyncio.Task[str] | None = None
    try:
        if kind == "stall":
            writer.write((head + "Content-Length: 2000\r\n\r\n").encode() + b'{"inputs":')
            await writer.drain()
            return await read_answer(reader, args.answer_timeout_s)
        if kind == "json":
            n = args.json_mib * MIB // 2
            body = b'{"inputs":[{"name":"%s","shape":[1,%d],"datatype":"FP32","data":[' % (args.input.encode(), n)
            body += b"0," * (n - 1) + b"0]}]}"
            writer.write((head + f"Content-Length: {len(body)}\r\n\r\n").encode())
            answer = asyncio.create_task(read_answer(reader, args.answer_timeout_s))
            for i in range(0, len(body), MIB):
                if answer.done():
                    break
                writer.write(body[i : i + MIB])
                await writer.drain()
            return await answer
        chunk = b"0" * MIB
        if kind == "declared":
            writer.write((head + f"Content-Length: {10 << 30}\r\n\r\n").encode())
        else:  # chunked
            writer.write((head + "Transfer-Encoding: chunked\r\n\r\n").encode())
            chunk = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        answer = asyncio.create_task(read_answer(reader, args.answer_timeout_s))
        deadline = time.monotonic() + args.answer_timeout_s
        while not answer.done() and time.monotonic() < deadline:
            writer.write(chunk)
            await asyncio.wait([answer, asyncio.ensure_future(writer.drain())], return_when=asyncio.FIRST_COMPLETED)
        return await answer
    except (ConnectionError, OSError):
        if answer is not None:
            return await answer
        return "reset"
    finally:
        writer.close()


async def _grpc_attack(channel, args) -> str:
    import grpc
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=args.model)
    n = args.grpc_mib * MIB // 4
    req.inputs.add(name=args.input, datatype="FP32", shape=[n // args.features, args.features])
    req.raw_input_contents.append(b"\0" * (n // args.features * args.features * 4))
    call = channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelInferResponse.FromString,
    )
    metadata = tuple((k.lower(), v) for k, v in auth_headers(args).items()) or None
    try:
        await call(req, timeout=args.answer_timeout_s, metadata=metadata)
        return "OK"
    except grpc.aio.AioRpcError as e:
        return "hung" if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else e.code().name


def _host_port(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or 80


async def _attack_loop(kind: str, args, per: dict[str, Counter], stop_at: float) -> None:
    """Attack requests one after another on fresh connections until ``stop_at``; each outcome is
    counted under its attack (or, for the two-request attacks, under its request's tag)."""
    host, port = _host_port(args.url)
    path = f"/v2/models/{args.model}/infer"
    turn = 0
    channel = None
    if kind == "grpc":
        import grpc

        big = args.grpc_mib * MIB + MIB
        opts = [("grpc.max_send_message_length", big), ("grpc.max_receive_message_length", big)]
        channel = grpc.aio.insecure_channel(args.grpc, options=opts)
    try:
        while time.monotonic() < stop_at:
            tag = kind
            try:
                if channel is not None:
                    out = await _grpc_attack(channel, args)
                elif kind == "headers":
                    out = await slow_headers(host, port, path, args)
                elif kind in SMALL_ATTACKS:
                    tag, out = await small_attack(kind, host, port, args, turn)
                else:
                    out = await _http_attack(kind, host, port, path, args)
            except (ConnectionError, OSError):
                out = "refused"
            per.setdefault(tag, Counter())[out] += 1
            turn += 1
    finally:
        if channel is not None:
            await channel.close()


def _attackers(args, seconds: float, result_q) -> None:
    raise_fd_limit()  # the idle attack holds thousands of sockets
    details: dict = {}
    if args.attacker_source:  # the HTTP attackers connect from another address than the ordinary clients
        plain = asyncio.open_connection

        async def from_source(host, port, **kw):
            return await plain(host, port, local_addr=(args.attacker_source, 0), **kw)

        asyncio.open_connection = from_source  # type: ignore[assignment]

    async def main() -> dict:
        stop_at = time.monotonic() + seconds
        per: dict[str, Counter] = {k: Counter() for k in args.attacks if k not in ("deep", "host")}
        loops = []
        for kind in args.attacks:
            if kind == "idle":
                host, port = _host_port(args.url)
                reserve = 64 + 4 * args.concurrency * len(args.attacks)
                loops.append(
                    _keep(details, "idle_connections", idle_flood(host, port, args, per[kind], stop_at, reserve))
                )
            elif kind == "grpc-stall":
                loops += [grpc_stall_connection(args, per[kind], stop_at) for _ in range(args.concurrency)]
            else:
                loops += [_attack_loop(kind, args, per, stop_at) for _ in range(args.concurrency)]
        await asyncio.gather(*loops)
        return {k: dict(v) for k, v in per.items()}

    t0 = time.process_time()
    out = asyncio.run(main())
    result_q.put({"outcomes": out, "cpu_s": round(time.process_time() - t0, 2), "details": details})


async def _keep(into: dict, key: str, coro) -> None:
    into[key] = await coro


# ------------------------------------------------------------------ memory and ordinary clients


class _Rss(threading.Thread):
    def __init__(self, pid: int, every_s: float = 0.1):
        super().__init__(daemon=True)
        self.proc, self.every_s = psutil.Process(pid), every_s
        self.phase = "before"
        self.samples: dict[str, list[tuple[float, float]]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                own = self.proc.memory_info().rss
                tree = own + sum(c.memory_info().rss for c in self.proc.children(recursive=True))
            except psutil.Error:
                continue
            self.samples.setdefault(self.phase, []).append((own / MIB, tree / MIB))

    def summary(self) -> dict:
        out = {}
        for phase, xs in self.samples.items():
            out[phase] = {
                "gateway_max_mib": round(max(x[0] for x in xs), 1),
                "gateway_last_mib": round(xs[-1][0], 1),
                "tree_max_mib": round(max(x[1] for x in xs), 1),
                "gateway_each_s_mib": [round(x[0]) for x in xs[:: max(1, round(1 / self.every_s))]],
            }
        return out


async def _ordinary(args, seconds: float, seed: int) -> dict:
    body = v2_body(args.input, [0.5] * args.features, {"slo_ms": args.slo_ms})
    res = await run_open_loop(
        args.url,
        f"/v2/models/{args.model}/infer",
        args.rate,
        seconds,
        lambda i: body,
        timeout_s=10.0,
        seed=seed,
        headers=auth_headers(args) or None,
    )
    return res.summary(slo_s=args.slo_ms / 1e3)


def run(args) -> dict:
    rss = _Rss(args.pid)
    rss.start()
    me = psutil.Process()
    out: dict = {"config": {k: v for k, v in vars(args).items() if k != "func"}}
    if args.auth_token:
        out["config"]["auth_token"] = "(given)"
    cpu0 = me.cpu_times()
    out["before"] = asyncio.run(_ordinary(args, args.seconds, 1))
    rss.phase = "flood"
    q: mp.Queue = mp.get_context("spawn").Queue()
    flood_s = args.flood_seconds or args.seconds
    child = mp.get_context("spawn").Process(target=_attackers, args=(args, flood_s, q))
    child.start()
    time.sleep(0.5)  # let the attackers open their connections first
    out["flood"] = asyncio.run(_ordinary(args, flood_s - 0.5, 2))
    attack = q.get(timeout=flood_s + args.answer_timeout_s + 60)
    child.join(timeout=10)
    rss.phase = "after"
    out["after"] = asyncio.run(_ordinary(args, args.seconds, 3))
    rss.stop.set()
    rss.join()
    cpu1 = me.cpu_times()
    out["attacks"] = attack["outcomes"]
    out["attackers_cpu_s"] = attack["cpu_s"]
    out.update(attack.get("details", {}))
    out["ordinary_clients_cpu_s"] = round(cpu1.user + cpu1.system - cpu0.user - cpu0.system, 2)
    out["memory"] = rss.summary()
    out["hung"] = sum(v.get("hung", 0) for v in attack["outcomes"].values())
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--grpc", default="127.0.0.1:8001", help="host:port of the gateway's gRPC")
    p.add_argument("--pid", type=int, required=True, help="the gateway's process id (memory is sampled)")
    p.add_argument("--model", default="digits")
    p.add_argument("--input", default="input")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--slo-ms", type=float, default=100.0)
    p.add_argument("--rate", type=float, default=100.0, help="ordinary requests per second")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    p.add_argument("--flood-seconds", type=float, default=None, help="length of the attack's phase (default --seconds)")
    p.add_argument("--attacks", default=",".join(DEFAULT_ATTACKS), help=f"comma-separated, of {','.join(ATTACKS)}")
    p.add_argument("--concurrency", type=int, default=8, help="connections per attack")
    p.add_argument("--idle-connections", type=int, default=4100, help="connections the idle attack opens")
    p.add_argument(
        "--reconnect-s", type=float, default=None, help="the idle attack opens a connection the server ended again"
    )
    p.add_argument("--grpc-streams", type=int, default=128, help="stalled calls per grpc-stall connection")
    p.add_argument("--auth-token", default=None, help="bearer token sent by attackers and ordinary clients")
    p.add_argument(
        "--attacker-source",
        default=None,
        help="source address of the HTTP attackers' connections (e.g. 127.0.0.2: another client than the ordinary "
        "ones, which connect from 127.0.0.1); default: the same address",
    )
    p.add_argument("--json-mib", type=int, default=30)
    p.add_argument("--grpc-mib", type=int, default=60)
    p.add_argument("--answer-timeout-s", type=float, default=45.0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.attacks = [a for a in args.attacks.split(",") if a]
    bad = sorted(set(args.attacks) - set(ATTACKS))
    if bad:
        p.error(f"unknown attack(s) {bad}; choose from {list(ATTACKS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = run(args)
    write_result(out, args.out)
    print(json.dumps(out, indent=1))
    return 1 if out["hung"] else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
