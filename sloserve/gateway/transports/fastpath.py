"""A raw-ASGI path for ``POST /v2/models/{m}[/versions/{v}]/infer``, in front of FastAPI.

Profiled under load on a small model, FastAPI/Starlette's middleware stack, routing, Request and
Response objects cost about half of the gateway's CPU per request.
The infer call needs none of it: this path reads the body, runs the very same
:func:`sloserve.gateway.transports.restinfer.infer_body` as the FastAPI route, and writes the response itself. Every other
request (metadata, health, metrics, training, /docs) falls through to FastAPI unchanged. The
front door (sloserve/gateway/transports/door.py: Host and Content-Type) and bearer auth run before this path.

A request the batcher sheds out of its queue is answered from inside the shed decision
(:class:`_AnswerNow`): the 503 is written before the event loop gets back to the request's own
coroutine. On a saturated loop that coroutine waits behind every other ready callback, milliseconds
after the decision (tests/integration/test_shed_answer.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson

from sloserve.gateway import tracing
from sloserve.gateway.dataplane import DataPlane
from sloserve.gateway.errors import InvalidArgument, ServingError
from sloserve.gateway.transports.codec import InputLimits, body_too_large  # noqa: F401 - InputLimits: the type the caller passes
from sloserve.gateway.transports.restinfer import body_timeout, infer_body
from sloserve.gateway.transports.status import http_status, retry_after_header

log = logging.getLogger("sloserve.rest")
PREFIX = "/v2/models/"


def route(path: str) -> tuple[str, str | None] | None:
    """(model, version) for an infer path, else None."""
    if not path.startswith(PREFIX) or not path.endswith("/infer"):
        return None
    parts = path[len(PREFIX) : -len("/infer")].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None


class _Disconnected(Exception):
    pass


class _BodyWatch:
    """Bodies being read, and one sweep a second that cancels a read past ``body_timeout_s``: the
    timeout costs a dict entry per request, not a timer (a timer per request cost the fast path
    about 3 us and left a cancelled timer in the loop's heap for the whole timeout)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.reading: dict[asyncio.Task, float] = {}
        self._expired: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None

    def start(self, task: asyncio.Task | None) -> None:
        if task is None:
            return
        self.reading[task] = time.monotonic() + self.timeout_s
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def done(self, task: asyncio.Task | None) -> None:
        if task is not None:
            self.reading.pop(task, None)

    def expired(self, task: asyncio.Task | None) -> bool:
        """Whether the sweep cancelled ``task`` (its cancellation is then taken back)."""
        if task not in self._expired:
            return False
        self._expired.discard(task)
        task.uncancel()
        return True

    async def _sweep(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while self.reading:  # ends when no body is being read; the next read starts it again
            await asyncio.sleep(period)
            now = time.monotonic()
            for task, deadline in list(self.reading.items()):
                if now >= deadline:
                    del self.reading[task]
                    self._expired.add(task)
                    task.cancel()


class InferFastPath:
    def __init__(self, app, dp: DataPlane, decoder):
        self.app = app
        self.dp = dp
        self.decoder = decoder
        self.max_bytes = dp.size_limits.body
        self.body_timeout_s = dp.settings.body_timeout_s
        self.bodies = _BodyWatch(self.body_timeout_s)
        self.infer_body = infer_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        target = route(scope["path"])
        if target is None:
            return await self.app(scope, receive, send)
        if tracing.TRACER is not None:  # the request in its trace, when sampled (sloserve/gateway/tracing.py)
            return await tracing.serve_rest(self._serve, scope, receive, send, *target)
        return await self._serve(scope, receive, send, *target)

    async def _serve(self, scope, receive, send, model: str, version: str | None) -> None:
        dp = self.dp
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        ticket = None
        body_in = False  # an answer before the whole body is read closes the connection
        early = _AnswerNow.for_send(send, dp, model)
        try:
            cl = headers.get("content-length")
            declared = 0
            if cl is not None:
                if not cl.isdigit():
                    raise InvalidArgument(f"Content-Length {cl!r:.40} is not an integer")
                declared = int(cl)
                if declared > self.max_bytes:
                    raise body_too_large(self.max_bytes, declared)
            ticket = dp.admit(model, declared)
            task = asyncio.current_task()
            self.bodies.start(task)
            try:
                body = await self._read(receive, ticket)
            except asyncio.CancelledError:
                if not self.bodies.expired(task):
                    raise
                raise body_timeout(self.body_timeout_s) from None
            finally:
                self.bodies.done(task)
            body_in = True
            ticket.read(len(body))  # (read first: a keep-alive connection must not be left with an unread body)
            payload, json_len = await self.infer_body(
                dp, self.decoder, model, version, ticket.arrival_s, body, headers, early
            )
        except _Disconnected:
            return
        except ServingError as e:
            if tracing.TRACER is not None:
                tracing.failed(e)
            if early is not None and early.wrote:  # answered from inside the shed decision
                if early.pending is not None:  # the transport paused after the status line
                    await send(early.pending)
                return
            start, end = _error_messages(e)
            if not body_in:  # the rest of the body is still on the wire: never read it as a request
                start["headers"].append((b"connection", b"close"))
            await _send(send, start, end)
            dp.metrics.shed_answered(model, e)
            return
        except Exception as e:  # a bug: answer 500, log it, keep serving
            log.exception("internal error on %s", scope["path"])
            if tracing.TRACER is not None:
                tracing.failed(e)
            await _send(
                send,
                *_messages(
                    500, orjson.dumps({"error": f"internal error: {type(e).__name__}"}), b"application/json", ()
                ),
            )
            return
        finally:
            if ticket is not None:
                ticket.release()
        if json_len is None:
            await _send(send, *_messages(200, payload, b"application/json", ()))
        else:
            await _send(
                send,
                *_messages(
                    200,
                    payload,
                    b"application/octet-stream",
                    ((b"inference-header-content-length", str(json_len).encode()),),
                ),
            )

    async def _read(self, receive, ticket) -> bytes:
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise _Disconnected()
            chunk = msg.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > self.max_bytes:
                    raise body_too_large(self.max_bytes)
                if size > ticket.held:  # counted as it streams, not once it is all in
                    ticket.grow(size)
                chunks.append(chunk)
            if not msg.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _AnswerNow:
    """Writes a shed request's error answer synchronously, from inside the batcher's decision.

    ASGI's ``send`` is a coroutine function, but uvicorn's (httptools and h11) only suspends while
    its transport's flow control is paused; otherwise it writes to the transport and returns. So
    when writing is not paused, this steps the ``send`` coroutine to completion by hand instead of
    waiting for the loop to resume the handler. If flow control pauses after the status line, the
    body is left in ``pending`` for the handler, which resumes right after (the batcher fails its
    future next) and sends it once the transport drains: uvicorn closes a connection whose app
    returns with its response half written. Other ASGI servers, and a paused transport, get no
    early answer: the handler answers as before. ``shed_answered`` times the status line.
    """

    __slots__ = ("dp", "flow", "model", "pending", "send", "wrote")

    def __init__(self, send, flow, dp: DataPlane, model: str):
        self.send, self.flow, self.dp, self.model = send, flow, dp, model
        self.wrote = False
        self.pending: dict | None = None

    @classmethod
    def for_send(cls, send, dp: DataPlane, model: str) -> _AnswerNow | None:
        cycle = getattr(send, "__self__", None)
        if cycle is None or not type(cycle).__module__.startswith(_UVICORN_HTTP):
            return None
        flow = getattr(cycle, "flow", None)
        if not isinstance(getattr(flow, "write_paused", None), bool):
            return None
        return cls(send, flow, dp, model)

    def __call__(self, e: Exception) -> bool:
        if self.wrote or self.flow.write_paused or not isinstance(e, ServingError):
            return False
        start, end = _error_messages(e)
        _step_to_end(self.send(start))  # if this raises, nothing is marked: the handler answers
        self.wrote = True
        if self.flow.write_paused:
            self.pending = end
        else:
            _step_to_end(self.send(end))
        self.dp.metrics.shed_answered(self.model, e)
        return True


_UVICORN_HTTP = "uvicorn.protocols.http."


def _step_to_end(coro) -> None:
    """Run a coroutine that must not suspend to its end, synchronously."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("ASGI send suspended although its transport was not paused")


def _messages(status: int, body: bytes, ctype: bytes, extra: tuple) -> tuple[dict, dict]:
    """The two ASGI messages of a complete response."""
    return (
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), *extra],
        },
        {"type": "http.response.body", "body": body},
    )


def _error_messages(e: ServingError) -> tuple[dict, dict]:
    return _messages(http_status(e), orjson.dumps({"error": e.message}), b"application/json", _retry_after(e))


def _retry_after(e: ServingError) -> tuple:
    retry = retry_after_header(e)
    return () if retry is None else ((b"retry-after", retry.encode()),)


async def _send(send, start: dict, end: dict) -> None:
    await send(start)
    await send(end)
