"""The batch channel, gateway side: one replica process, reached over a socket on the event loop.

The protocol is ``sloserve/replica/channel.py``'s. The socket is non-blocking and read by the event loop's
reader callback: a replica that stops reading never blocks the loop, and a frame whose caller gave
up still goes out whole (a cut frame would make every later one unreadable). A replica that goes
away fails its batches in flight with :class:`ReplicaGone` (a ``ReplicaFailed``: the batcher
retries the batch once, elsewhere, when its deadline still allows).

Used by the in-process backend's worker processes (``sloserve/gateway/backends/processes.py``, over a
``socketpair``) and by the Ray backend's direct transport (``sloserve/gateway/backends/ray_channels.py``, over TCP to a
Ray Serve replica).
"""

from __future__ import annotations

import asyncio
import itertools
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

from sloserve.gateway import tracing
from sloserve.gateway.errors import ReplicaFailed

_IDS = itertools.count(1)
_READ = 1 << 20


class ReplicaGone(ReplicaFailed):
    """The replica went away with batches in flight, or is not connected (503, Retry-After)."""


class BatchChannel:
    """Batches to one replica over ``sock`` (connected; made non-blocking here).

    ``await ready()`` returns the replica's hello (``info``: ``device_type``, ``variants``, ``pid``)
    or raises RuntimeError with its load error. ``on_gone(channel)`` is called once when the
    connection ends for any reason other than :meth:`close`."""

    def __init__(self, sock: socket.socket, label: str, on_gone: Callable[[BatchChannel], None] | None = None):
        self.label = label
        self.info: dict[str, Any] = {}
        self.on_gone = on_gone
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = sock
        sock.setblocking(False)
        self._rbuf = bytearray()
        self._pending: dict[int, asyncio.Future] = {}
        self._send_lock = asyncio.Lock()
        self._sending: set[asyncio.Task] = set()
        self._ready: asyncio.Future = self._loop.create_future()
        self._loop.add_reader(sock.fileno(), self._on_readable)
        self.available = False
        # most batches the replica held at once (from every gateway), as it said when answering ours
        self.peak_held = 0

    @property
    def in_flight(self) -> int:
        """Batches sent and not yet answered."""
        return len(self._pending)

    @property
    def open(self) -> bool:
        return self._sock is not None

    async def ready(self) -> dict[str, Any]:
        info = await self._ready
        self.available = self._sock is not None
        return info

    # ---- batches ----------------------------------------------------------------------------
    async def run(
        self, inputs: dict[str, np.ndarray], budget_s: float | None, variant: str | None = None
    ) -> tuple[dict[str, np.ndarray] | None, float]:
        """``(outputs, compute_s)``; ``(None, 0.0)`` when the replica skipped it past ``budget_s``."""
        if not self.available:
            raise ReplicaGone(f"replica {self.label} is not connected; retry shortly", retry_after_s=1.0)
        bid = next(_IDS)
        msg: tuple = ("batch", bid, inputs, budget_s, variant)
        if tracing.TRACER is not None and (parent := tracing.batch_traceparent()) is not None:
            msg += (parent,)  # a traced batch: the replica records its compute under it
        fut = self._loop.create_future()
        self._pending[bid] = fut
        try:
            try:
                await self._send(pickle.dumps(msg, protocol=5))
            except OSError:  # the replica went away (its EOF not read yet), or the channel is closing
                self._gone()
                if fut.done() and not fut.cancelled():
                    fut.exception()  # _fail_pending's answer: this one is raised instead
                raise ReplicaGone(
                    f"replica {self.label} went away as this batch was sent; retry shortly", retry_after_s=1.0
                ) from None
            return await fut
        finally:
            self._pending.pop(bid, None)

    def stamp(self, stamp: tuple) -> None:
        """Send an autoscaling stamp, best effort (dropped while frames are queued on the socket)."""
        if self.available and not self._sending:
            try:
                self._write_now(pickle.dumps(("stamp", stamp), protocol=5))
            except OSError:
                pass

    def _frame(self, payload: bytes) -> bytes:
        if len(payload) > 0x7FFFFFFF:
            raise ValueError(f"a batch of {len(payload)} bytes is over the channel's 2 GiB frame limit")
        return struct.pack("!i", len(payload)) + payload

    def _write_now(self, payload: bytes) -> None:
        """Write a whole small frame now or not at all (stamps: never half a frame)."""
        frame = self._frame(payload)
        sock = self._sock
        if sock is None:
            raise OSError("closed")
        sent = sock.send(frame)
        if sent != len(frame):  # rare: finish it like a batch frame
            task = self._loop.create_task(self._send_frame(sock, memoryview(frame)[sent:]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, payload: bytes) -> None:
        """One frame. What the socket takes is written at once; the rest waits on the loop, so a
        replica that stops reading never blocks it; the lock keeps two frames from interleaving."""
        sock = self._sock
        if sock is None:
            raise OSError("the replica's socket is closed")
        frame: bytes | memoryview = self._frame(payload)
        if not self._sending:  # nothing queued ahead: write what the socket takes now, no task
            try:
                sent = sock.send(frame)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent == len(frame):
                return
            frame = memoryview(frame)[sent:]
        # Shielded: a caller that gives up (its timeout) must not cut a frame in half, or every later
        # frame on this socket would be misread. The frame finishes, or the socket closes under it.
        task = self._loop.create_task(self._send_frame(sock, frame))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and self._sock is not sock:  # the socket closed under the frame
                raise OSError("the replica's socket closed while the batch was going out") from None
            raise

    async def _send_frame(self, sock: socket.socket, frame: bytes | memoryview) -> None:
        async with self._send_lock:
            await self._loop.sock_sendall(sock, frame)

    # ---- answers ----------------------------------------------------------------------------
    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            while True:
                chunk = sock.recv(_READ)
                if not chunk:
                    raise EOFError
                self._rbuf += chunk
                if len(chunk) < _READ:
                    break
        except (BlockingIOError, InterruptedError):
            pass
        except (EOFError, OSError):
            self._take_frames()  # what arrived before the end still counts
            self._gone()
            return
        self._take_frames()

    def _take_frames(self) -> None:
        buf = self._rbuf
        while len(buf) >= 4:
            (n,) = struct.unpack_from("!i", buf)
            if len(buf) < 4 + n:
                break
            msg = pickle.loads(buf[4 : 4 + n])  # a copy: buf is resized right after
            del buf[: 4 + n]
            self._deliver(msg)

    def _deliver(self, msg: tuple) -> None:
        if msg[0] == "ready":
            self.info = dict(msg[1])
            if not self._ready.done():
                self._ready.set_result(self.info)
            return
        if msg[0] == "error":  # the model did not load: ready() raises it
            if not self._ready.done():
                self._ready.set_exception(RuntimeError(msg[1]))
            return
        bid, outputs, extra = msg[0], msg[1], msg[2]
        if len(msg) > 3 and msg[3] > self.peak_held:
            self.peak_held = msg[3]
        fut = self._pending.get(bid)
        if fut is None or fut.done():
            return
        if isinstance(outputs, str):  # "error": the replica refused the batch
            fut.set_exception(RuntimeError(extra))
        else:
            fut.set_result((outputs, extra))

    # ---- the end ----------------------------------------------------------------------------
    def _gone(self) -> None:
        if self._sock is None:  # already handled (a failed send, then the reader's EOF)
            return
        self._shut()
        self._fail_pending(f"replica {self.label} went away with this batch in flight")
        if self.on_gone is not None:
            self.on_gone(self)

    def close(self, why: str = "the channel is closing") -> None:
        """Close the socket and fail what is in flight (``why`` says why); ``on_gone`` is not called."""
        self._shut()
        self._fail_pending(f"replica {self.label}: {why}")

    def _shut(self) -> None:
        self.available = False
        sock, self._sock = self._sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            self._loop.remove_writer(sock.fileno())
            for task in list(self._sending):  # frames still going out: the socket goes with them
                task.cancel()
            sock.close()
        if not self._ready.done():
            self._ready.set_exception(RuntimeError(f"replica {self.label} went away before it was ready"))
            self._ready.exception()  # retrieved: nobody may be awaiting it any more

    def _fail_pending(self, why: str) -> None:
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(ReplicaGone(why, retry_after_s=1.0))
