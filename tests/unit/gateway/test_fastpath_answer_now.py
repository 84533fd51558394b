"""The early shed answer of the raw-ASGI path (sloserve/gateway/transports/fastpath.py) against uvicorn's real
request cycle: written synchronously when the transport takes it, left to the handler otherwise."""

import asyncio

import orjson
import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from sloserve.gateway.errors import DeadlineUnreachable
from sloserve.gateway.limits import SizeLimits
from sloserve.gateway.transports.fastpath import _AnswerNow


class Transport:
    def __init__(self):
        self.out = []
        self.paused_reading = False

    def write(self, data):
        self.out.append(data)

    def is_closing(self):
        return False

    def pause_reading(self):
        self.paused_reading = True

    def resume_reading(self):
        self.paused_reading = False


class Metrics:
    def __init__(self):
        self.answered = []

    def shed_answered(self, model, e):
        self.answered.append((model, e))


class DP:
    def __init__(self):
        self.metrics = Metrics()


def cycle(transport):
    """A real uvicorn httptools request cycle (the one `make run` serves with)."""
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    scope = {"type": "http", "method": "POST", "path": "/v2/models/m/infer", "http_version": "1.1", "headers": []}
    return RequestResponseCycle(
        scope=scope,
        transport=transport,
        flow=FlowControl(transport),
        logger=None,
        access_logger=None,
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )


async def test_writes_the_503_synchronously_with_retry_after():
    t = Transport()
    c = cycle(t)
    dp = DP()
    early = _AnswerNow.for_send(c.send, dp, "m")
    assert early is not None
    e = DeadlineUnreachable("shed: late by 3.0 ms", retry_after_s=0.2)
    assert early(e) is True and early.wrote and c.response_complete  # no await in between
    head, body = t.out[0], t.out[-1]
    assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head
    assert orjson.loads(body) == {"error": "shed: late by 3.0 ms"}
    assert dp.metrics.answered == [("m", e)]
    assert early(e) is False  # once only


async def test_no_early_answer_while_the_transport_is_paused_or_for_other_servers():
    t = Transport()
    c = cycle(t)
    c.flow.pause_writing()
    early = _AnswerNow.for_send(c.send, DP(), "m")
    assert early(DeadlineUnreachable("x")) is False and not early.wrote and t.out == []

    async def plain_send(message):  # any other ASGI server: no early answer at all
        pass

    assert _AnswerNow.for_send(plain_send, DP(), "m") is None
    c2 = cycle(Transport())
    assert _AnswerNow.for_send(c2.send, DP(), "m")(ValueError("not a ServingError")) is False


class Pausing(Transport):
    """Its buffer crosses the high-water mark on the first write (the status line)."""

    def __init__(self):
        super().__init__()
        self.flow = None
        self.closed = False

    def write(self, data):
        super().write(data)
        self.flow.pause_writing()

    def close(self):
        self.closed = True


async def test_paused_after_the_status_line_the_handler_sends_the_body_under_uvicorn():
    """Run the real fast-path handler under uvicorn's own run_asgi: the status line goes out from
    inside the decision, the body when the handler resumes and the transport drains. A body left
    to a task instead made uvicorn close the connection with the response half written."""
    import sloserve.gateway.transports.fastpath as fp

    t = Pausing()
    c = cycle(t)
    t.flow = c.flow
    c.body, c.more_body = b"{}", False
    c.message_event.set()
    err = DeadlineUnreachable("shed: late by 2.0 ms", retry_after_s=0.1)
    loop = asyncio.get_running_loop()

    async def shed_at_once(dp, limits, model, version, arrival, body, headers, early):
        assert early(err) is True and early.pending is not None  # status line out, body pending
        assert len(t.out) == 1 and t.out[0].startswith(b"HTTP/1.1 503")
        loop.call_later(0.01, c.flow.resume_writing)  # the transport drains
        raise err

    class Ticket:  # the data plane's door lets it in (no byte bound, no lagging loop)
        arrival_s = 0.0
        held = 1 << 20

        def read(self, n):
            pass

        def grow(self, n):
            pass

        def release(self):
            pass

    class Settings:
        body_timeout_s = 30.0

    dp = DP()
    dp.settings, dp.admit = Settings(), lambda model, declared=0: Ticket()
    dp.size_limits = SizeLimits(body=1 << 20, json=1 << 20, grpc=1 << 20)
    app = fp.InferFastPath(None, dp, None)
    app.infer_body = shed_at_once
    c.scope["headers"] = [(b"content-length", b"2")]
    await c.run_asgi(app)
    assert c.response_complete and not t.closed
    assert orjson.loads(t.out[-1]) == {"error": "shed: late by 2.0 ms"}
    assert len(dp.metrics.answered) == 1  # timed once, at the status line


async def test_a_send_that_fails_marks_nothing_so_the_handler_answers(monkeypatch):
    from sloserve.gateway.transports import fastpath

    t = Transport()
    c = cycle(t)
    early = _AnswerNow.for_send(c.send, DP(), "m")
    bad = DeadlineUnreachable("x")
    monkeypatch.setattr(fastpath, "http_status", lambda e: 999)  # uvicorn has no status line for it: its send raises
    with pytest.raises(KeyError):
        early(bad)
    assert not early.wrote and early.pending is None


@pytest.mark.parametrize("impl", ["httptools_impl", "h11_impl"])
def test_uvicorn_send_still_awaits_only_on_flow_control(impl):
    """_AnswerNow steps uvicorn's send by hand: it must await nothing but the paused transport."""
    import importlib
    import inspect

    src = inspect.getsource(importlib.import_module(f"uvicorn.protocols.http.{impl}").RequestResponseCycle.send)
    awaits = [line.strip() for line in src.splitlines() if "await " in line]
    assert len(awaits) == 1 and awaits[0].startswith("await self.flow.drain()"), awaits
