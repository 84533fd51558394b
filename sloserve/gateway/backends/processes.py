"""In-process backend replicas that compute in a worker process of their own (``replica_processes``).

Why: an in-process replica computes in a pool thread of the gateway's process. ONNX Runtime releases
the GIL while it computes, but takes it back to read its inputs and to hand back its outputs, and then
waits for the event loop's thread to let go of it (up to ``sys.getswitchinterval()``, 5 ms). Under
load that wait is paid on every batch (a batch next to a thread that holds the GIL takes several times
as long). A worker process has its own interpreter,
so ORT never waits for the gateway's GIL; the gateway only pickles a batch onto a socket.

The worker speaks the batch channel (``sloserve/replica/channel.py``) over one ``socketpair``: it reads the
socket in a thread of its own, so a second batch (``pipeline_depth`` 2) is taken off the socket while
the first computes, computes batches in order, one at a time, and exits when the gateway's end of the
socket closes (the gateway stopped or died). A worker that dies fails its batches in flight
explicitly (503 + Retry-After) and is started again.

Workers are started with ``subprocess`` (fork + exec with no Python in between), never a bare fork
of the multi-threaded gateway (docs/operations.md, "Start-up and stop").
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from sloserve.gateway import tracing
from sloserve.gateway.backends.channel import BatchChannel, ReplicaGone
from sloserve.replica.runtime import RuntimeOptions

log = logging.getLogger("sloserve.procreplica")


class WorkerGone(ReplicaGone):
    """The replica's worker process exited with batches in flight, or is being started again (503,
    Retry-After). A ``ReplicaFailed``: the batcher retries the batch once, on a live worker if there is
    one, when its deadline still allows."""


class ProcessReplica:
    """The gateway's side of one worker process serving one (model, variant).

    ``available`` only while its worker has loaded the model and is connected: the backend sends
    batches to available workers only. A worker that dies is started again, with a back-off from
    0.5 s to 30 s between failed attempts (a model file broken meanwhile keeps failing until it is
    fixed), until ``stop``."""

    def __init__(
        self, path: str | Path, opts: RuntimeOptions, output_names: list[str], label: str, delay_s: float | None = None
    ):
        self.path, self.opts, self.output_names, self.label = str(path), opts, list(output_names), label
        self.delay_s = delay_s or 0.0
        self._proc: subprocess.Popen | None = None
        self._channel: BatchChannel | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._restarting: asyncio.Task | None = None
        self.restarts = 0

    @property
    def available(self) -> bool:
        return self._channel is not None and self._channel.available

    @property
    def runtime(self) -> tuple[str, str] | None:
        """(device, execution provider) the worker's session really runs on, once it has said so."""
        info = self._channel.info if self._channel is not None else {}
        return (info["device"], info["provider"]) if "device" in info else None

    @property
    def in_flight(self) -> int:
        """Batches sent and not yet answered."""
        return self._channel.in_flight if self._channel is not None else 0

    # ---- life cycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Starts the worker and waits until its model is loaded (raises RuntimeError with ORT's
        message if it cannot be, or if the replica is stopped meanwhile)."""
        if self._stopping:
            raise RuntimeError(f"replica {self.label} is stopping")
        self._loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        cmd = [
            sys.executable,
            "-m",
            "sloserve.gateway.backends.processes",
            str(theirs.fileno()),
            self.path,
            repr(asdict(self.opts)),
            repr(self.output_names),
            repr(self.delay_s),
            repr(tracing.replica_config()),  # None: the worker traces nothing
            self.label,
        ]
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._channel = BatchChannel(ours, self.label, on_gone=self._worker_gone)
        try:
            await self._channel.ready()
        except BaseException:
            self._close(kill=True)
            raise

    async def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping = True
        if self._restarting is not None:
            self._restarting.cancel()
        self._close(kill=False)
        proc = self._proc
        if proc is not None:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            self._close(kill=True)  # still there after timeout_s (a stopped worker): SIGKILL

    def _close(self, kill: bool) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:  # the worker sees EOF and exits
            channel.close(
                why="is stopping (the server is shutting down)"
                if self._stopping
                else "its worker is being started again"
            )
        if kill and self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()  # SIGKILLed: reaped in microseconds

    # ---- batches ----------------------------------------------------------------------------
    async def run(self, inputs: dict[str, np.ndarray], budget_s: float | None) -> tuple[dict | None, float]:
        """``(outputs, compute_s)``; ``(None, 0.0)`` when the worker skipped it past ``budget_s``."""
        channel = self._channel
        if channel is None or not channel.available:
            raise WorkerGone(f"replica {self.label}'s worker is being started again; retry shortly", retry_after_s=1.0)
        try:
            return await channel.run(inputs, budget_s)
        except ReplicaGone as e:
            if isinstance(e, WorkerGone):
                raise
            why = (
                f"replica {self.label} is stopping (the server is shutting down)"
                if self._stopping
                else f"replica {self.label}'s worker process exited (code {self._returncode()}) with this "
                f"batch in flight"
            )
            raise WorkerGone(f"{why}; retry shortly", retry_after_s=1.0) from None

    def _returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def _worker_gone(self, channel: BatchChannel) -> None:
        if channel is not self._channel:
            return
        self._channel = None
        self._close(kill=True)
        if not self._stopping:
            log.error("replica %s's worker process exited (code %s); starting it again", self.label, self._returncode())
            assert self._loop is not None  # set by start(), which made the channel
            self._restarting = self._loop.create_task(self._restart())

    async def _restart(self) -> None:
        delay = 0.5
        while not self._stopping:
            self.restarts += 1
            try:
                await self.start()
                return
            except Exception as e:
                log.error("could not start the worker for %s again: %s; next try in %.1f s", self.label, e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)


# ---- the worker process ---------------------------------------------------------------------
def _worker(
    fd: int,
    path: str,
    opts: dict,
    output_names: list[str],
    delay_s: float,
    trace: dict | None = None,
    label: str = "",
) -> None:
    from sloserve.replica import tracing as process_tracing
    from sloserve.replica.channel import BatchServer
    from sloserve.replica.runtime import Replica

    if trace is not None:  # the gateway traces: this process exports its own compute spans
        process_tracing.setup(process_tracing.TraceConfig.from_dict(trace), "replica", {"sloserve.replica": label})

    conn = Connection(fd)
    try:
        rep = Replica(path, RuntimeOptions(**opts), output_names)
    except Exception as e:
        conn.send_bytes(pickle.dumps(("error", f"{type(e).__name__}: {e}"), protocol=5))
        return
    server = BatchServer(lambda inputs, variant: rep.run(inputs), delay_s=delay_s, model=label.split("/")[0])
    info = {"pid": os.getpid(), "input_names": rep.input_names, "device": rep.device, "provider": rep.provider}
    try:
        server.serve(conn, info)  # until the gateway closes it
    finally:
        process_tracing.shutdown()  # the spans still queued go out


if __name__ == "__main__":
    import ast
    import signal

    # The worker ends when the gateway's end of its socket closes, never on a signal sent to the
    # whole process group (Ctrl-C, systemd's control-group stop): the gateway drains its batches first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _fd, _path, _opts, _outs, _delay = sys.argv[1:6]
    _trace = ast.literal_eval(sys.argv[6]) if len(sys.argv) > 6 else None
    _label = sys.argv[7] if len(sys.argv) > 7 else ""
    _worker(int(_fd), _path, ast.literal_eval(_opts), ast.literal_eval(_outs), float(_delay), _trace, _label)
