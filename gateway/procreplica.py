"""In-process backend replicas that compute in a worker process of their own (``replica_processes``).

Why: an in-process replica computes in a pool thread of the gateway's process. ONNX Runtime releases
the GIL while it computes, but takes it back to read its inputs and to hand back its outputs, and then
waits for the event loop's thread to let go of it (up to ``sys.getswitchinterval()``, 5 ms). Under
load that wait is paid on every batch (``python -m loadtests.bench.gil_probe``: 4.1x a batch's time
next to a thread that holds the GIL; docs/benchmarks.md). A worker process has its own interpreter,
so ORT never waits for the gateway's GIL; the gateway only pickles a batch onto a socket.

The protocol, over one ``socketpair`` per worker (``multiprocessing.connection`` framing, pickle 5):

- worker -> gateway, once: ``("ready", input_names)`` or ``("error", message)``;
- gateway -> worker: ``(batch_id, inputs, deadline)``; ``deadline`` is a ``time.monotonic()`` value
  (CLOCK_MONOTONIC, the same clock in every process) after which the gateway no longer waits, so a
  batch still queued then is skipped, never run late; ``None`` means no limit;
- worker -> gateway: ``(batch_id, outputs, compute_s)``, or ``(batch_id, None, 0.0)`` for a skipped
  one, or ``(batch_id, "error", message)`` when ORT refused the batch.

The worker reads the socket in a thread of its own, so a second batch (``pipeline_depth`` 2) is
taken off the socket while the first computes and the gateway's send never blocks on a busy worker.
It computes batches in order, one at a time, and exits when the gateway's end of the socket closes
(the gateway stopped or died). A worker that dies fails its batches in flight explicitly
(503 + Retry-After) and is started again.

Workers are started with ``subprocess`` (fork + exec with no Python in between), never a bare fork
of the multi-threaded gateway (docs/operations.md, "Start-up and stop").
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from gateway.errors import ReplicaFailed
from models.runtime import RuntimeOptions

log = logging.getLogger("sloserve.procreplica")
_IDS = itertools.count(1)


class WorkerGone(ReplicaFailed):
    """The replica's worker process exited with batches in flight, or is being started again (503,
    Retry-After). A ``ReplicaFailed``: the batcher retries the batch once, on a live worker if there is
    one, when its deadline still allows."""


class ProcessReplica:
    """The gateway's side of one worker process serving one (model, variant).

    ``available`` only while its worker has loaded the model and is connected: the backend sends
    batches to available workers only. A worker that dies is started again, with a back-off from
    0.5 s to 30 s between failed attempts (a model file broken meanwhile keeps failing until it is
    fixed), until ``stop``."""

    def __init__(self, path: str | Path, opts: RuntimeOptions, output_names: list[str], label: str,
                 delay_s: float | None = None):
        self.path, self.opts, self.output_names, self.label = str(path), opts, list(output_names), label
        self.delay_s = delay_s or 0.0
        self._pending: dict[int, asyncio.Future] = {}
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None  # non-blocking: the event loop never waits on a worker
        self._rbuf = bytearray()
        self._send_lock: asyncio.Lock | None = None
        self._sending: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._stopping = False
        self._restarting: asyncio.Task | None = None
        self.available = False
        self.restarts = 0

    @property
    def in_flight(self) -> int:
        """Batches sent and not yet answered."""
        return len(self._pending)

    # ---- life cycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Starts the worker and waits until its model is loaded (raises RuntimeError with ORT's
        message if it cannot be, or if the replica is stopped meanwhile)."""
        if self._stopping:
            raise RuntimeError(f"replica {self.label} is stopping")
        self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", "gateway.procreplica", str(theirs.fileno()), self.path,
               repr(asdict(self.opts)), repr(self.output_names), repr(self.delay_s)]
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock, self._rbuf, self._send_lock = ours, bytearray(), asyncio.Lock()
        self._ready = self._loop.create_future()
        self._loop.add_reader(ours.fileno(), self._on_readable)
        try:
            await self._ready
        except BaseException:
            self._close(kill=True)
            raise
        self.available = True

    async def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping = True
        if self._restarting is not None:
            self._restarting.cancel()
        self._close(kill=False)
        self._fail_pending(f"replica {self.label} is stopping (the server is shutting down)")
        proc = self._proc
        if proc is not None:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            self._close(kill=True)  # still there after timeout_s (a stopped worker): SIGKILL

    def _close(self, kill: bool) -> None:
        self.available = False
        sock, self._sock = self._sock, None
        if sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(sock.fileno())
                self._loop.remove_writer(sock.fileno())
            for task in list(self._sending):  # frames still going out: the socket goes with them
                task.cancel()
            sock.close()  # the worker sees EOF and exits
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(RuntimeError(f"replica {self.label}'s worker went away while loading"))
            self._ready.exception()  # retrieved: start() may not be the one awaiting it any more
        if kill and self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()  # SIGKILLed: reaped in microseconds

    def _fail_pending(self, why: str) -> None:
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(WorkerGone(why, retry_after_s=1.0))

    # ---- batches ----------------------------------------------------------------------------
    async def run(self, inputs: dict[str, np.ndarray], deadline: float | None) -> tuple[dict | None, float]:
        """``(outputs, compute_s)``; ``(None, 0.0)`` when the worker skipped it past ``deadline``."""
        if not self.available:
            raise WorkerGone(f"replica {self.label}'s worker is being started again; retry shortly",
                             retry_after_s=1.0)
        bid = next(_IDS)
        fut = self._loop.create_future()
        self._pending[bid] = fut
        try:
            try:
                await self._send(pickle.dumps((bid, inputs, deadline), protocol=5))
            except OSError:  # the worker died (its EOF not read yet), or the replica is stopping
                self._worker_gone()
                if fut.done() and not fut.cancelled():
                    fut.exception()  # _fail_pending's answer: this one is raised instead
                why = (f"replica {self.label} is stopping (the server is shutting down)" if self._stopping
                       else f"replica {self.label}'s worker process exited")
                raise WorkerGone(f"{why}; retry shortly", retry_after_s=1.0) from None
            out = await fut
        finally:
            self._pending.pop(bid, None)
        return out

    async def _send(self, payload: bytes) -> None:
        """One frame in ``multiprocessing.connection``'s format (what the worker reads): a 4-byte
        big-endian length, then the bytes. ``sock_sendall`` writes at once what the socket takes and
        waits on the loop for the rest, so a worker that stops reading never blocks the loop; the
        lock keeps two frames from interleaving then."""
        sock = self._sock
        if sock is None:
            raise OSError("the worker's socket is closed")
        if len(payload) > 0x7FFFFFFF:
            raise ValueError(f"a batch of {len(payload)} bytes is over the worker protocol's 2 GiB frame limit")
        frame = struct.pack("!i", len(payload)) + payload
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
            if task.cancelled() and self._sock is not sock:  # the socket closed under the frame (stop, death)
                raise OSError("the worker's socket closed while the batch was going out") from None
            raise

    async def _send_frame(self, sock: socket.socket, frame: bytes | memoryview) -> None:
        async with self._send_lock:
            await self._loop.sock_sendall(sock, frame)

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            while True:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    raise EOFError
                self._rbuf += chunk
                if len(chunk) < 1 << 20:
                    break
        except (BlockingIOError, InterruptedError):
            pass
        except (EOFError, OSError):
            self._take_frames()  # what arrived before the end still counts
            self._worker_gone()
            return
        self._take_frames()

    def _take_frames(self) -> None:
        buf = self._rbuf
        while len(buf) >= 4:
            (n,) = struct.unpack_from("!i", buf)
            if len(buf) < 4 + n:
                break
            msg = pickle.loads(buf[4:4 + n])  # a copy: buf is resized right after
            del buf[:4 + n]
            self._deliver(msg)

    def _deliver(self, msg) -> None:
        if msg[0] == "ready":
            if not self._ready.done():
                self._ready.set_result(None)
            return
        if msg[0] == "error":  # the model did not load: start() raises it
            if not self._ready.done():
                self._ready.set_exception(RuntimeError(msg[1]))
            return
        bid, outputs, extra = msg
        fut = self._pending.get(bid)
        if fut is None or fut.done():
            return
        if isinstance(outputs, str):  # "error": ORT refused the batch
            fut.set_exception(RuntimeError(extra))
        else:
            fut.set_result((outputs, extra))

    def _worker_gone(self) -> None:
        if self._sock is None:  # already handled (a failed send, then the reader's EOF)
            return
        was_serving = self.available
        proc = self._proc
        rc = proc.poll() if proc is not None else None
        self._close(kill=True)
        why = f"replica {self.label}'s worker process exited (code {rc}) with this batch in flight"
        self._fail_pending(why)
        if was_serving and not self._stopping:  # a worker that fails to load: start() raises, its caller decides
            log.error("%s; starting it again", why.replace(" with this batch in flight", ""))
            self._restarting = self._loop.create_task(self._restart())

    async def _restart(self) -> None:
        delay = 0.5
        while not self._stopping:
            self.restarts += 1
            try:
                await self.start()
                return
            except Exception as e:  # noqa: BLE001 - logged; batches meanwhile get WorkerGone (503)
                log.error("could not start the worker for %s again: %s; next try in %.1f s", self.label, e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)


# ---- the worker process ---------------------------------------------------------------------
def _worker(fd: int, path: str, opts: dict, output_names: list[str], delay_s: float) -> None:
    from models.runtime import Replica

    conn = Connection(fd)
    try:
        rep = Replica(path, RuntimeOptions(**opts), output_names)
    except Exception as e:  # noqa: BLE001 - the gateway reports ORT's own message
        conn.send_bytes(pickle.dumps(("error", f"{type(e).__name__}: {e}"), protocol=5))
        return
    conn.send_bytes(pickle.dumps(("ready", rep.input_names), protocol=5))
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:  # takes batches off the socket (and unpickles them) while one computes
        try:
            while True:
                inbox.put(pickle.loads(conn.recv_bytes()))
        except (EOFError, OSError):
            inbox.put(None)

    threading.Thread(target=read, name="inbox", daemon=True).start()
    while (msg := inbox.get()) is not None:
        bid, inputs, deadline = msg
        if deadline is not None and time.monotonic() > deadline:
            reply = (bid, None, 0.0)
        else:
            t0 = time.perf_counter()
            try:
                if delay_s:
                    time.sleep(delay_s)  # chaos drill: busy this long, as the in-thread replicas are
                reply = (bid, rep.run(inputs), time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - a batch ORT refuses fails alone
                reply = (bid, "error", f"{type(e).__name__}: {e}")
        try:
            conn.send_bytes(pickle.dumps(reply, protocol=5))
        except OSError:
            return


if __name__ == "__main__":
    import ast
    import signal

    # The worker ends when the gateway's end of its socket closes, never on a signal sent to the
    # whole process group (Ctrl-C, systemd's control-group stop): the gateway drains its batches first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _fd, _path, _opts, _outs, _delay = sys.argv[1:6]
    _worker(int(_fd), _path, ast.literal_eval(_opts), ast.literal_eval(_outs), float(_delay))
