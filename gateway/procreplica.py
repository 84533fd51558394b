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
import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from gateway.errors import Unavailable
from models.runtime import RuntimeOptions

log = logging.getLogger("sloserve.procreplica")
_IDS = itertools.count(1)


class WorkerGone(Unavailable):
    """The replica's worker process exited with batches in flight."""


class ProcessReplica:
    """The gateway's side of one worker process serving one (model, variant)."""

    def __init__(self, path: str | Path, opts: RuntimeOptions, output_names: list[str], label: str,
                 delay_s: float | None = None):
        self.path, self.opts, self.output_names, self.label = str(path), opts, list(output_names), label
        self.delay_s = delay_s or 0.0
        self.in_flight = 0
        self._pending: dict[int, asyncio.Future] = {}
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready: asyncio.Future | None = None
        self._stopping = False
        self.restarts = 0

    # ---- life cycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Starts the worker and waits until its model is loaded (raises RuntimeError with ORT's
        message if it cannot be)."""
        self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        cmd = [sys.executable, "-m", "gateway.procreplica", str(theirs.fileno()), self.path,
               repr(asdict(self.opts)), repr(self.output_names), repr(self.delay_s)]
        self._proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._ready = self._loop.create_future()
        self._loop.add_reader(self._conn.fileno(), self._on_readable)
        try:
            await self._ready
        except BaseException:
            self._close(kill=True)
            raise

    async def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping = True
        self._close(kill=False)
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(WorkerGone(f"replica {self.label} is stopping (the server is shutting down)",
                                             retry_after_s=1.0))
        proc = self._proc
        if proc is not None:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def _close(self, kill: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._loop is not None:
                self._loop.remove_reader(conn.fileno())
            conn.close()  # the worker sees EOF and exits
        if kill and self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    # ---- batches ----------------------------------------------------------------------------
    async def run(self, inputs: dict[str, np.ndarray], deadline: float | None) -> tuple[dict | None, float]:
        """``(outputs, compute_s)``; ``(None, 0.0)`` when the worker skipped it past ``deadline``."""
        if self._conn is None:
            raise WorkerGone(f"replica {self.label} is restarting after its worker process exited; retry shortly",
                             retry_after_s=1.0)
        bid = next(_IDS)
        fut = self._loop.create_future()
        self._pending[bid] = fut
        self.in_flight += 1
        try:
            try:
                self._conn.send_bytes(pickle.dumps((bid, inputs, deadline), protocol=5))
            except OSError:  # the worker died and its EOF is not read yet
                self._worker_gone()
                raise WorkerGone(f"replica {self.label}'s worker process exited; retry shortly",
                                 retry_after_s=1.0) from None
            out = await fut
        finally:
            self.in_flight -= 1
            self._pending.pop(bid, None)
        return out

    def _on_readable(self) -> None:
        conn = self._conn
        try:
            while conn is not None and conn.poll(0):
                msg = pickle.loads(conn.recv_bytes())
                if msg[0] == "ready":
                    if not self._ready.done():
                        self._ready.set_result(None)
                    continue
                if msg[0] == "error":
                    if not self._ready.done():
                        self._ready.set_exception(RuntimeError(msg[1]))
                    continue
                bid, outputs, extra = msg
                fut = self._pending.get(bid)
                if fut is None or fut.done():
                    continue
                if isinstance(outputs, str):  # "error": ORT refused the batch
                    fut.set_exception(RuntimeError(extra))
                else:
                    fut.set_result((outputs, extra))
        except (EOFError, OSError):
            self._worker_gone()

    def _worker_gone(self) -> None:
        if self._conn is None:  # already handled (a failed send, then the reader's EOF)
            return
        proc = self._proc
        rc = proc.poll() if proc is not None else None
        if proc is not None and rc is None:
            try:
                rc = proc.wait(0.2)
            except subprocess.TimeoutExpired:
                rc = None
        self._close(kill=True)
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(RuntimeError(f"worker for {self.label} exited (code {rc}) while loading"))
            return
        err = f"replica {self.label}'s worker process exited (code {rc}) with this batch in flight; retry"
        for fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(WorkerGone(err, retry_after_s=1.0))
        if not self._stopping:
            log.error("%s; starting it again", err.replace("; retry", ""))
            self.restarts += 1
            self._loop.create_task(self._restart())

    async def _restart(self) -> None:
        try:
            await self.start()
        except Exception as e:  # noqa: BLE001 - logged; batches meanwhile get WorkerGone (503)
            log.error("could not restart the worker for %s: %s", self.label, e)


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

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _fd, _path, _opts, _outs, _delay = sys.argv[1:6]
    _worker(int(_fd), _path, ast.literal_eval(_opts), ast.literal_eval(_outs), float(_delay))
