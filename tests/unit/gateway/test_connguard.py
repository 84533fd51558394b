"""The REST connection guard and the gRPC call guard, without sockets (the integration test with real
stalled clients: tests/integration/test_hostile_clients.py)."""

from __future__ import annotations

import asyncio

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from sloserve.gateway.transports.callguard import peer_host
from sloserve.gateway.transports.connguard import APP, BODY, HEAD, ConnectionGuard, guarded_protocol


class FakeTransport:
    def __init__(self, peer: str = "10.0.0.1"):
        self.peer = peer
        self.out = b""
        self.closed = False

    def get_extra_info(self, key, default=None):
        return {"peername": (self.peer, 5000), "sockname": ("127.0.0.1", 8000)}.get(key, default)

    def write(self, data: bytes) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _protocol(guard: ConnectionGuard):
    cls = guarded_protocol(guard)
    cfg = Config(app=_app, http=cls, loop="none", lifespan="off")
    cfg.load()
    return cls(config=cfg, server_state=ServerState(), app_state={})


def _guard(**kw) -> ConnectionGuard:
    args = dict(header_timeout_s=1.0, body_timeout_s=1.0, max_requests=2, max_per_client=2)
    args.update(kw)
    return ConnectionGuard(**args)


async def test_a_client_over_its_cap_gets_503_and_is_closed_and_others_are_not():
    guard = _guard()
    protos = [_protocol(guard) for _ in range(4)]
    transports = [
        FakeTransport("10.0.0.1"),
        FakeTransport("10.0.0.1"),
        FakeTransport("10.0.0.1"),
        FakeTransport("10.0.0.2"),
    ]
    for p, t in zip(protos, transports, strict=True):
        p.connection_made(t)
    assert [t.closed for t in transports] == [False, False, True, False]
    assert transports[2].out.startswith(b"HTTP/1.1 503") and b"max_connections_per_client" in transports[2].out
    protos[2].connection_lost(None)
    protos[0].connection_lost(None)
    assert guard.per_client == {"10.0.0.1": 1, "10.0.0.2": 1}
    p = _protocol(guard)
    p.connection_made(FakeTransport("10.0.0.1"))  # room again
    assert not p.transport.closed
    guard.stop()


async def test_headers_never_completed_are_408_naming_the_setting():
    guard = _guard()
    p = _protocol(guard)
    t = FakeTransport()
    p.connection_made(t)
    p.data_received(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")  # no blank line
    assert p.phase == HEAD
    p.expire()
    assert t.closed and t.out.startswith(b"HTTP/1.1 408") and b"header_timeout_s" in t.out
    guard.stop()


async def test_phases_follow_the_request_and_requests_not_connections_take_the_limit():
    guard = _guard(max_requests=1)
    p = _protocol(guard)
    t = FakeTransport()
    p.connection_made(t)
    p.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
    assert p.phase == BODY
    p.data_received(b"cd")
    assert p.phase == APP
    await asyncio.sleep(0.01)  # the app answers
    assert t.out.startswith(b"HTTP/1.1 200")
    # a second connection while no request is in flight: served, although one is open already
    q = _protocol(guard)
    u = FakeTransport()
    q.connection_made(u)
    q.data_received(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.sleep(0.01)
    assert u.out.startswith(b"HTTP/1.1 200"), u.out
    guard.stop()


@pytest.mark.parametrize(
    ("peer", "host"),
    [("ipv4:127.0.0.1:5123", "127.0.0.1"), ("ipv6:[::1]:5123", "::1"), ("ipv6:%5B::1%5D:80", "::1"), (None, "")],
)
def test_peer_host(peer, host):
    assert peer_host(peer) == host
