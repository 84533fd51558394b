"""The REST server's connections: header, body and idle timeouts, a per-client cap, and a request
limit that idle connections do not count against.

uvicorn (httptools) is kept, with :func:`guarded_protocol`'s subclass of its ``HttpToolsProtocol``
passed as ``uvicorn.Config(http=...)``. uvicorn itself times out only a keep-alive connection that
sends nothing after an answer (``timeout_keep_alive``), and its ``limit_concurrency`` counts open
connections as well as requests. The subclass adds, before any byte reaches the app (and so before
any token is checked):

* **headers**: a connection must send a request's complete headers within ``header_timeout_s`` of
  connecting, or of the first byte of its next request on a kept-alive connection; past it the
  connection gets a 408 naming the setting and is closed.
* **body**: every route's body must be complete within ``body_timeout_s`` of its headers. The infer
  routes answer 408 themselves at that moment (sloserve/gateway/transports/fastpath.py, rest.py); this is the
  backstop for every route, one sweep period later: a 408 if no answer has started, and the
  connection is closed either way.
* **idle**: a kept-alive connection that sends nothing for ``idle_timeout_s`` after an answer is
  closed (uvicorn's ``timeout_keep_alive``). A client sending requests back to back is never cut.
* **per client**: at most ``max_connections_per_client`` connections from one address; the next is
  answered 503 and closed at once.
* **requests**: ``max_connections`` bounds requests in flight (503 past it), not open connections:
  idle connections take no request slot.

One sweep task checks every connection's deadline ``SWEEP_PERIOD_S`` apart (less when a timeout is
shorter): a timeout costs a time stamp per request, not a timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("sloserve.rest")
SWEEP_PERIOD_S = 1.0

# phases of a connection: waiting for (the rest of) a request's headers, for its body, for the app
HEAD, BODY, APP = 0, 1, 2


def _response(status: bytes, message: str) -> bytes:
    body = ('{"error":"' + message.replace('"', "'") + '"}').encode()
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\nconnection: close\r\n\r\n"
        + body
    )


class ConnectionGuard:
    """What every connection of one REST server shares: the settings, the connections per client
    address, and the sweep that enforces the header and body deadlines."""

    def __init__(
        self,
        *,
        header_timeout_s: float,
        body_timeout_s: float,
        max_requests: int,
        max_per_client: int,
    ):
        self.header_timeout_s = header_timeout_s
        self.max_requests = max_requests
        self.max_per_client = max_per_client
        self.period = min(SWEEP_PERIOD_S, header_timeout_s / 4, body_timeout_s / 4)
        # the infer routes answer 408 at body_timeout_s themselves; this backstop comes a sweep later
        self.body_timeout_s = body_timeout_s
        self.body_deadline_s = body_timeout_s + self.period
        self.conns: set[GuardedProtocol] = set()
        self.per_client: dict[str, int] = {}
        self._sweeper: asyncio.Task | None = None
        self.header_timeouts = self.body_timeouts = self.refused = 0

    @classmethod
    def from_settings(cls, s) -> ConnectionGuard:
        return cls(
            header_timeout_s=s.header_timeout_s,
            body_timeout_s=s.body_timeout_s,
            max_requests=s.max_connections,
            max_per_client=s.max_connections_per_client,
        )

    def join(self, conn: GuardedProtocol) -> bool:
        """Count a new connection; False when its client is over its cap."""
        self.conns.add(conn)
        n = self.per_client.get(conn.peer, 0) + 1
        self.per_client[conn.peer] = n
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return n <= self.max_per_client

    def leave(self, conn: GuardedProtocol) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            n = self.per_client.get(conn.peer, 1) - 1
            if n > 0:
                self.per_client[conn.peer] = n
            else:
                self.per_client.pop(conn.peer, None)

    async def _sweep(self) -> None:
        while self.conns:  # ends with the last connection; the next one starts it again
            await asyncio.sleep(self.period)
            now = time.monotonic()
            for conn in list(self.conns):
                if conn.phase != APP and now >= conn.deadline:
                    with contextlib.suppress(Exception):
                        conn.expire()

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the guard's deadlines and caps (see the module docstring).
    :func:`guarded_protocol` makes one subclass per server, bound to its :class:`ConnectionGuard`."""

    guard: ConnectionGuard
    phase = HEAD
    deadline = 0.0
    peer = ""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        guard = self.guard
        self.peer = self.client[0] if self.client else ""
        self.phase, self.deadline = HEAD, time.monotonic() + guard.header_timeout_s
        if not guard.join(self):
            guard.refused += 1
            self.phase = APP  # nothing more to time: it is closing
            self.transport.write(
                _response(
                    b"503 Service Unavailable",
                    f"too many connections from {self.peer} (max_connections_per_client "
                    f"{guard.max_per_client}); reuse connections, or open fewer at once",
                )
            )
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.leave(self)
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.phase == APP:  # the first byte of the next request on a kept-alive connection
            self.phase, self.deadline = HEAD, time.monotonic() + self.guard.header_timeout_s

    def on_headers_complete(self) -> None:
        # uvicorn answers 503 when len(connections) or len(tasks) reaches limit_concurrency: 0 here
        # makes it refuse, None lets the request through; open connections never count
        self.limit_concurrency = None if len(self.tasks) < self.guard.max_requests else 0
        self.phase, self.deadline = BODY, time.monotonic() + self.guard.body_deadline_s
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.phase = APP
        super().on_message_complete()

    def expire(self) -> None:
        """The deadline of the current phase has passed: answer 408 if nothing was answered, close."""
        guard = self.guard
        if self.transport.is_closing():
            self.phase = APP
            return
        if self.phase == HEAD:
            guard.header_timeouts += 1
            msg = (
                f"the request headers did not arrive within {guard.header_timeout_s:g} s (header_timeout_s); "
                "send them at once"
            )
        else:
            guard.body_timeouts += 1
            msg = (
                f"the request body did not arrive within {guard.body_timeout_s:g} s (body_timeout_s); "
                "send it faster, or smaller"
            )
        cycle = self.cycle
        if self.phase == HEAD or cycle is None or not cycle.response_started:
            self.transport.write(_response(b"408 Request Timeout", msg))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() says disconnect; its sends are dropped
            cycle.message_event.set()
        self.phase = APP
        self.transport.close()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, bound to ``guard``."""
    return type("GuardedHttpToolsProtocol", (GuardedProtocol,), {"guard": guard})
