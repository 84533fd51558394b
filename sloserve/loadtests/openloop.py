"""A lean open-loop load generator for KServe V2 REST: Poisson arrivals on raw HTTP/1.1 keep-alive.

Open loop means arrivals do not wait for answers: request *k* is due at its scheduled time whatever
the server does, and its latency is measured from that scheduled time (so a generator or a
connection pool that falls behind shows up as latency, never as a silently lower rate; no
coordinated omission). Every request has a client timeout; one that runs out is recorded as
``status=0, error="timeout"``, never dropped.

    python -m sloserve.loadtests.openloop --url http://127.0.0.1:8000 --model digits --rate 200 --duration 5 \\
        --param variant=small --param slo_ms=250

prints a JSON summary (status counts, p50/p99 latency of answers and of refusals, goodput). The
library entry point is :func:`run_open_loop`; tests use it with a ``body_fn`` that makes every
request distinct and check each answer against a local reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass(slots=True)
class Record:
    """One request: when it was due, when its answer came, what it was."""

    index: int
    due_s: float  # scheduled send time (monotonic)
    done_s: float = 0.0
    status: int = 0  # 0: no HTTP answer (timeout, connection error)
    retry_after: str | None = None
    error: str = ""
    body: bytes | None = None  # kept only with keep_bodies

    @property
    def latency_s(self) -> float:
        return self.done_s - self.due_s


@dataclass
class Result:
    records: list[Record] = field(default_factory=list)
    started_s: float = 0.0
    duration_s: float = 0.0
    max_lag_s: float = 0.0  # worst delay between a due time and the moment the send began

    def summary(self, slo_s: float | None = None) -> dict:
        by: dict[str, int] = {}
        for r in self.records:
            k = str(r.status) if r.status else (r.error or "error")
            by[k] = by.get(k, 0) + 1
        ok = [r.latency_s for r in self.records if r.status == 200]
        refused = [r.latency_s for r in self.records if r.status in (429, 503)]
        out = {
            "sent": len(self.records),
            "duration_s": round(self.duration_s, 3),
            "offered_rps": round(len(self.records) / self.duration_s, 1) if self.duration_s else 0.0,
            "status": by,
            "ok_rps": round(len(ok) / self.duration_s, 1) if self.duration_s else 0.0,
            "ok_p50_ms": _ms(pct(ok, 50)),
            "ok_p99_ms": _ms(pct(ok, 99)),
            "ok_max_ms": _ms(max(ok, default=None)),
            "refused_p99_ms": _ms(pct(refused, 99)),
            "refused_max_ms": _ms(max(refused, default=None)),
            "refused_without_retry_after": sum(1 for r in self.records if r.status in (429, 503) and not r.retry_after),
            "max_send_lag_ms": _ms(self.max_lag_s),
        }
        if slo_s is not None:
            good = sum(1 for x in ok if x <= slo_s)
            out["goodput_rps"] = round(good / self.duration_s, 1) if self.duration_s else 0.0
        return out


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 2)


IDLE_MAX_S = 2.0  # uvicorn closes keep-alive connections idle for 5 s: never reuse one near that


class _Conn:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.idle_since = 0.0

    def close(self) -> None:
        self.writer.close()


async def _exchange(conn: _Conn, head: bytes, body: bytes) -> tuple[int, dict[str, str], bytes]:
    conn.writer.write(head + body)
    await conn.writer.drain()
    status_line = await conn.reader.readuntil(b"\r\n")
    status = int(status_line.split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while True:
        line = await conn.reader.readuntil(b"\r\n")
        if line == b"\r\n":
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    data = await conn.reader.readexactly(n) if n else b""
    return status, headers, data


async def run_open_loop(
    url: str,
    path: str,
    rate_rps: float,
    duration_s: float,
    body_fn: Callable[[int], bytes],
    *,
    timeout_s: float = 10.0,
    max_conns: int = 512,
    seed: int = 0,
    keep_bodies: bool = False,
    first_index: int = 0,
    headers: dict[str, str] | None = None,
) -> Result:
    """Send Poisson arrivals at ``rate_rps`` for ``duration_s`` seconds, then wait for every answer
    (each bounded by ``timeout_s``). ``body_fn(i)`` gives the JSON body of request ``i``."""
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    prefix = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n{extra}").encode()
    idle: list[_Conn] = []
    opened = 0
    slots = asyncio.Semaphore(max_conns)
    rng = random.Random(seed)
    res = Result()
    tasks: list[asyncio.Task] = []

    async def one(rec: Record, body: bytes) -> None:
        nonlocal opened
        conn = None
        try:
            async with asyncio.timeout(max(rec.due_s + timeout_s - time.monotonic(), 0.001)):
                async with slots:
                    res.max_lag_s = max(res.max_lag_s, time.monotonic() - rec.due_s)
                    conn = None
                    while idle and conn is None:
                        conn = idle.pop()
                        if time.monotonic() - conn.idle_since > IDLE_MAX_S:
                            conn.close()
                            conn = None
                    if conn is None:
                        conn = _Conn(*await asyncio.open_connection(host, port))
                        opened += 1
                    head = prefix + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    status, hdrs, data = await _exchange(conn, head, body)
            rec.done_s = time.monotonic()
            rec.status, rec.retry_after = status, hdrs.get("retry-after")
            if keep_bodies or status != 200:
                rec.body = data
            if hdrs.get("connection", "").lower() == "close":
                conn.close()
            else:
                conn.idle_since = rec.done_s
                idle.append(conn)
            conn = None
        except TimeoutError:
            rec.done_s, rec.error = time.monotonic(), "timeout"
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            rec.done_s, rec.error = time.monotonic(), f"{type(e).__name__}"
        finally:
            if conn is not None:
                conn.close()

    start = time.monotonic() + 0.01
    res.started_s = start
    t, i = start, first_index
    end = start + duration_s
    while True:
        t += rng.expovariate(rate_rps)
        if t >= end:
            break
        delay = t - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        rec = Record(i, t)
        res.records.append(rec)
        tasks.append(asyncio.create_task(one(rec, body_fn(i))))
        i += 1
    res.duration_s = duration_s
    if tasks:
        await asyncio.gather(*tasks)
    for c in idle:
        c.close()
    return res


def v2_body(model_input: str, values: list[float], params: dict | None = None) -> bytes:
    """A one-row FP32 V2 JSON body."""
    doc: dict[str, Any] = {
        "inputs": [{"name": model_input, "shape": [1, len(values)], "datatype": "FP32", "data": values}]
    }
    if params:
        doc["parameters"] = params
    return json.dumps(doc).encode()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="digits")
    p.add_argument("--input", default="input", help="input tensor name")
    p.add_argument("--width", type=int, default=64, help="elements of the one-row FP32 input")
    p.add_argument("--rate", type=float, required=True, help="arrivals per second (Poisson)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals (<= 120)")
    p.add_argument("--timeout", type=float, default=10.0, help="client timeout per request (s)")
    p.add_argument("--param", action="append", default=[], help="V2 parameter k=v (repeatable)")
    p.add_argument("--slo-ms", type=float, default=None, help="report goodput against this budget")
    a = p.parse_args(argv)
    if not 0 < a.duration <= 120:
        raise SystemExit("--duration must be in (0, 120]")
    params = {}
    for kv in a.param:
        k, _, v = kv.partition("=")
        try:
            params[k] = json.loads(v)
        except ValueError:
            params[k] = v
    rng = random.Random(1)
    bodies = [v2_body(a.input, [float(rng.randint(0, 16)) for _ in range(a.width)], params) for _ in range(64)]
    res = asyncio.run(
        run_open_loop(
            a.url,
            f"/v2/models/{a.model}/infer",
            a.rate,
            a.duration,
            lambda i: bodies[i % len(bodies)],
            timeout_s=a.timeout,
        )
    )
    print(json.dumps(res.summary(a.slo_ms / 1e3 if a.slo_ms else None), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
