"""A lean open-loop HTTP/1.1 load generator: a precomputed arrival schedule over keep-alive sockets.

Open loop: request *k* is sent at its scheduled time whatever the server does (arrivals never wait
for answers), and its latency is measured from that SCHEDULED time, so a server (or a connection
pool) that falls behind shows up as latency, never as a silently lower rate (no coordinated
omission). Built for a 2-core box: asyncio Protocols on uvloop (no StreamReader/Writer, no HTTP
library), one pre-encoded request, a pool of keep-alive connections (one request in flight per
connection; a new connection is opened when none is idle, up to ``max_conns``; beyond that requests
wait in a FIFO, their wait counted in their latency).

Runs as its own process so that its CPU can be measured (``wait4``) and niced like the servers:

    python -m sloserve.loadtests.bench.gen SPEC.json OUT.bin

SPEC: ``{"host", "port", "path", "body_file", "headers": {..}, "schedule_file" (float64 offsets in
seconds, sorted), "timeout_s", "max_conns", "variants": [names], "content_type" (default JSON)}``. OUT: one record per request,
``struct <dddhh``: scheduled offset, sent offset (when the bytes were written; -1 if never),
done offset (-1 if no answer), HTTP status (0: no answer: timeout or connection error), variant
index (index into ``variants`` of the ``"variant"`` parameter in a 2xx body, -1 if none).
A trailer JSON line follows (connections opened, generator lag, CPU seconds).
"""

from __future__ import annotations

import asyncio
import json
import resource
import struct
import sys
from array import array
from collections import deque
from pathlib import Path
from time import (
    monotonic as _now,  # not loop.time(): uvloop's is libuv's cached millisecond clock
)
from typing import cast

REC = struct.Struct("<dddhh")


class _Conn(asyncio.Protocol):
    __slots__ = ("buf", "close_after", "closed", "gen", "need", "req", "status", "transport")

    def __init__(self, gen: Generator):
        self.gen = gen
        self.transport: asyncio.Transport | None = None  # until connection_made
        self.buf = bytearray()
        self.req = -1  # index of the request in flight on this connection, -1 when idle
        self.need = -1  # total bytes of the response once its head is parsed
        self.status = 0
        self.closed = False
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's transport

    def send(self, i: int) -> None:
        self.req = i
        self.need = -1
        self.gen.sent[i] = _now() - self.gen.t0
        assert self.transport is not None, "send on a connection not made yet"
        self.transport.write(self.gen.request)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None  # data comes only on a connection made
        buf = self.buf
        buf += data
        while self.req >= 0:
            if self.need < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buf[:end]).lower()
                self.status = int(head[9:12])
                k = head.find(b"content-length:")
                n = 0
                if k >= 0:
                    e = head.find(b"\r\n", k)
                    n = int(head[k + 15 : e if e >= 0 else len(head)])
                self.need = end + 4 + n
                self.close_after = b"connection: close" in head
            if len(buf) < self.need:
                return
            i = self.req
            g = self.gen
            g.done[i] = _now() - g.t0
            g.status[i] = self.status
            if 200 <= self.status < 300 and g.variant_keys:
                seg = bytes(buf[: self.need])
                p = seg.find(b'"variant"')
                if p >= 0:
                    q1 = seg.find(b'"', p + 9)
                    q2 = seg.find(b'"', q1 + 1)
                    g.variant[i] = g.variant_keys.get(seg[q1 + 1 : q2], -1)
            del buf[: self.need]
            self.req = -1
            self.need = -1
            g.outstanding -= 1
            if self.close_after:
                self.closed = True
                self.transport.close()
                g.open_conns -= 1
                g.kick()
            else:
                g.release(self)
            return

    def connection_lost(self, exc) -> None:
        g = self.gen
        if not self.closed:
            self.closed = True
            g.open_conns -= 1
        if self.req >= 0:
            i = self.req
            self.req = -1
            g.done[i] = _now() - g.t0
            g.status[i] = 0
            g.outstanding -= 1
        g.kick()


class Generator:
    def __init__(self, spec: dict, schedule: array):
        self.spec = spec
        self.host, self.port = spec.get("host", "127.0.0.1"), int(spec["port"])
        body = Path(spec["body_file"]).read_bytes()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (spec.get("headers") or {}).items())
        self.request = (
            f"POST {spec['path']} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: {spec.get('content_type', 'application/json')}\r\n{extra}Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self.schedule = schedule
        n = len(schedule)
        self.sent = array("d", [-1.0]) * n
        self.done = array("d", [-1.0]) * n
        self.status = array("h", [0]) * n
        self.variant = array("h", [-1]) * n
        self.variant_keys = {v.encode(): k for k, v in enumerate(spec.get("variants") or [])}
        self.max_conns = int(spec.get("max_conns", 1024))
        self.timeout_s = float(spec.get("timeout_s", 5.0))
        self.idle: list[_Conn] = []
        self.waiting: deque[int] = deque()
        self.open_conns = 0
        self.opening = 0
        self.opened = 0
        self.connect_errors = 0
        self.outstanding = 0
        self.max_lag = 0.0
        self.conns: list[_Conn] = []

    def release(self, c: _Conn) -> None:
        if self.waiting:
            c.send(self.waiting.popleft())
        else:
            self.idle.append(c)

    def kick(self) -> None:
        while self.waiting and self.open_conns + self.opening < self.max_conns:
            self.opening += 1
            self.loop.create_task(self._open())
            break

    async def _open(self) -> None:
        try:
            _, c = await self.loop.create_connection(lambda: _Conn(self), self.host, self.port)
        except OSError:
            self.opening -= 1
            self.connect_errors += 1
            if self.waiting:  # the request that asked for it fails; the others keep waiting
                i = self.waiting.popleft()
                self.done[i] = _now() - self.t0
                self.outstanding -= 1
            await asyncio.sleep(0.01)
            self.kick()
            return
        self.opening -= 1
        self.open_conns += 1
        self.opened += 1
        self.conns.append(c)
        self.release(c)
        self.kick()

    def submit(self, i: int) -> None:
        self.outstanding += 1
        while self.idle:
            c = self.idle.pop()
            if not c.closed:
                c.send(i)
                return
        self.waiting.append(i)
        if self.open_conns + self.opening < self.max_conns:
            self.opening += 1
            self.loop.create_task(self._open())

    async def run(self) -> dict:
        self.loop = asyncio.get_running_loop()
        sched = self.schedule
        n = len(sched)
        self.t0 = _now() + 0.05
        i = 0
        t0 = self.t0
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        lag_sum = 0.0
        while i < n:
            now = _now() - t0
            while i < n and sched[i] <= now:
                lag = now - sched[i]
                lag_sum += lag
                self.max_lag = max(self.max_lag, lag)
                self.submit(i)
                i += 1
            if i < n:  # no spinning: the event loop's timer granularity (~1 ms) shows up as lag, counted
                d = sched[i] - (_now() - t0)  # in the latency (it is measured from the schedule)
                if d > 0:
                    await asyncio.sleep(d)
        end = t0 + (sched[-1] if n else 0.0) + self.timeout_s
        while self.outstanding > 0 and _now() < end:
            await asyncio.sleep(0.01)
        for c in self.conns:
            if not c.closed and c.transport is not None:
                c.transport.abort()
        await asyncio.sleep(0)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "run_cpu_s": ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime,
            "mean_lag_ms": lag_sum * 1e3 / max(n, 1),
            "opened": self.opened,
            "connect_errors": self.connect_errors,
            "max_lag_ms": self.max_lag * 1e3,
            "unanswered": self.outstanding,
        }


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    schedule = array("d")
    with open(spec["schedule_file"], "rb") as f:
        schedule.frombytes(f.read())
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    import gc

    gc.disable()  # short-lived process; the schedule and records are flat arrays
    g = Generator(spec, schedule)
    trailer = asyncio.run(g.run())
    ru = resource.getrusage(resource.RUSAGE_SELF)
    trailer["cpu_s"] = ru.ru_utime + ru.ru_stime
    with open(argv[1], "wb") as out:
        out.writelines(
            REC.pack(schedule[k], g.sent[k], g.done[k], g.status[k], g.variant[k]) for k in range(len(schedule))
        )
        out.write(b"\n" + json.dumps(trailer).encode() + b"\n")
    return 0


def read_records(path: str, n: int) -> tuple[list[tuple], dict]:
    data = Path(path).read_bytes()
    size = REC.size * n
    recs = [REC.unpack_from(data, k * REC.size) for k in range(n)]
    trailer = json.loads(data[size:].strip() or b"{}")
    return recs, trailer


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
