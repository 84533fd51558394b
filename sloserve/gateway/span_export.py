"""How the gateway's request spans leave the process: plain records, a bounded buffer, an exporter process.

Building SDK spans and encoding them as OTLP costs the gateway's event loop a few hundred
microseconds of CPU per sampled request, all of it under the GIL the loop needs. So the request
path (``sloserve/gateway/tracing.py``) writes each span as a tuple, a :data:`Record`, and hands a
finished request's records to :meth:`SpanShipper.add` in one piece:

- the shipper keeps them in a buffer of at most ``max_queue_size`` spans; a piece that finds it
  full is dropped and counted (``queue_full``), and nothing ever waits for room;
- a thread of the gateway sends what the buffer holds every :data:`SHIP_EVERY_S` (sooner when it
  fills), one pickled frame per send, to an exporter process started with the shipper;
- the exporter process (``python -m sloserve.gateway.span_export``) turns each record back into
  an OpenTelemetry SDK ``ReadableSpan`` with the gateway's resource and hands it to the same
  bounded export queue a replica uses (``BoundedSpanProcessor``, ``sloserve/replica/tracing.py``),
  which exports over the configured exporter (OTLP http/protobuf or gRPC, console) and counts what
  it drops; it reports those counts back over the same socket.

The exporter process runs at a lower CPU priority (:data:`NICE`): on a saturated host it falls behind
and its queue drops spans (counted) rather than taking CPU from the requests.

If the exporter process dies, the gateway keeps serving: what it could not hand over is counted
(``export_failed``) and a new exporter process is started :data:`RESTART_AFTER_S` later. The
process exits when the gateway's end of the socket closes (after exporting what it holds) or when
the gateway dies.

Frames (``multiprocessing.connection``'s: a length, then a pickle): gateway -> exporter, a list of
pieces (tuples of records), ``"flush"`` (export everything now, then report) or ``None`` (export
everything and exit); exporter -> gateway, ``(queue_full, export_failed, exported)`` counts so far.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from sloserve.replica.tracing import TraceConfig

log = logging.getLogger("sloserve.tracing")

Record = tuple
"""One span: ``(name, kind, trace_id, span_id, parent_id, parent_remote, start_ns, end_ns, attributes,
links, error, tracestate)``. ``kind``: a ``SpanKind`` value; ``parent_id`` 0 for a root span;
``parent_remote``: the parent is the client's; ``attributes``: a dict or None; ``links``: a tuple of
``(trace_id, span_id)``; ``error``: the ERROR status's description, None when unset; ``tracestate``:
the W3C trace state's ``(key, value)`` pairs, or None."""

SCOPE = "sloserve.gateway"  # the instrumentation scope of every record
SHIP_EVERY_S = 0.05
RESTART_AFTER_S = 30.0
SEND_TIMEOUT_S = 30  # a send blocked this long: the exporter process is stuck, and is replaced
NICE = 10  # the exporter process's CPU priority below the gateway's
FRAME_PIECES = 256  # pieces per frame: one pickle holds the GIL for a bounded while
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
_KINDS = {k.value: k for k in SpanKind}


def to_span(record: Record, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    """The SDK span a record stands for, as the SDK's tracer would have ended it."""
    name, kind, trace_id, span_id, parent_id, parent_remote, start, end, attributes, links, error, pairs = record
    state = TraceState(list(pairs)) if pairs else None
    return ReadableSpan(
        name,
        context=SpanContext(trace_id, span_id, False, _SAMPLED, state),
        parent=SpanContext(trace_id, parent_id, parent_remote, _SAMPLED, state) if parent_id else None,
        resource=resource,
        attributes=attributes,
        links=[Link(SpanContext(t, s, False, _SAMPLED)) for t, s in links],
        kind=_KINDS[kind],
        status=_UNSET if error is None else Status(StatusCode.ERROR, error),
        start_time=start,
        end_time=end,
        instrumentation_scope=scope,
    )


class SpanShipper:
    """The gateway's end: a bounded buffer of finished spans and the thread that ships them to the
    exporter process. ``start=False`` (tests): no process and no thread; :meth:`take` reads the buffer
    and :meth:`ship` counts what it holds as lost."""

    def __init__(self, config: TraceConfig, resource: Mapping[str, Any], start: bool = True):
        self.config = config
        self.resource = dict(resource)
        self.max_spans = max(1, config.max_queue_size)
        self._wake_at = max(1, min(config.max_export_batch_size, self.max_spans // 2))
        self._buf: collections.deque[tuple[Record, ...]] = collections.deque()
        self._n = 0  # spans in the buffer
        self._lock = threading.Lock()
        self._ship_lock = threading.Lock()  # one sender on the socket at a time
        self._wake = threading.Event()
        self._stop = False
        self.dropped_full = 0  # found the buffer full
        self.lost = 0  # no exporter process took them, or one died before it reported them
        self._handed = 0  # handed to the running exporter process
        self._counts = (0, 0, 0)  # the running exporter process's report: queue full, export failed, exported
        self._before = (0, 0, 0)  # the sum of the reports of exporter processes gone since
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._next_start = 0.0 if start else math.inf
        self._warned = False
        self._thread: threading.Thread | None = None
        if start:
            self._start_exporter()
            self._thread = threading.Thread(target=self._run, name="sloserve-span-ship", daemon=True)
            self._thread.start()

    # ---- the request path --------------------------------------------------------------------
    def add(self, spans: tuple[Record, ...]) -> None:
        """One finished piece (a request's spans, a batch's span); dropped and counted when the buffer
        has no room for all of it."""
        n = len(spans)
        with self._lock:
            if self._n + n > self.max_spans:
                self.dropped_full += n
                return
            self._n += n
            self._buf.append(spans)
        if self._n >= self._wake_at:
            self._wake.set()

    def take(self) -> list[tuple[Record, ...]]:
        """Empty the buffer: its pieces, oldest first."""
        with self._lock:
            buf, self._buf, self._n = self._buf, collections.deque(), 0
        return list(buf)

    @property
    def exporter_pid(self) -> int | None:
        """The exporter process's pid while one runs."""
        proc = self._proc
        return None if proc is None or self._conn is None else proc.pid

    # ---- counts ------------------------------------------------------------------------------------
    def dropped(self) -> tuple[int, int]:
        """Spans dropped: (a queue was full: this buffer's or the exporter's, their export failed or
        no exporter process took them)."""
        full, failed, _ = self._reported()
        return self.dropped_full + full, failed + self.lost

    def _reported(self) -> tuple[int, int, int]:
        a, b = self._before, self._counts
        return a[0] + b[0], a[1] + b[1], a[2] + b[2]

    # ---- the shipping thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(SHIP_EVERY_S)
            self._wake.clear()
            self.ship()

    def ship(self, message: Any = ()) -> None:
        """Send what the buffer holds (then ``message``, when given) and read the exporter's reports."""
        with self._ship_lock:
            self._ship(message)

    def _ship(self, message: Any) -> None:
        pieces = self.take()
        if self._conn is None and time.monotonic() >= self._next_start and not self._stop:
            self._start_exporter()
        conn = self._conn
        if conn is None:
            self.lost += sum(map(len, pieces))
            return
        sent = 0
        try:
            for i in range(0, len(pieces), FRAME_PIECES):
                chunk = pieces[i : i + FRAME_PIECES]
                conn.send_bytes(pickle.dumps(chunk, protocol=5))
                n = sum(map(len, chunk))
                self._handed += n
                sent += n
            if message != ():
                conn.send_bytes(pickle.dumps(message, protocol=5))
            while conn.poll(0):
                self._counts = pickle.loads(conn.recv_bytes())
        except (OSError, EOFError, pickle.UnpicklingError) as e:
            self.lost += sum(map(len, pieces)) - sent
            self._gone(e)

    def _gone(self, why: BaseException | None) -> None:
        """The exporter process is gone (or is ended here): its counts are kept, what it took and never
        reported is counted as lost, and the next one starts later."""
        conn, self._conn = self._conn, None
        self.lost += max(0, self._handed - sum(self._counts))
        self._before, self._counts, self._handed = self._reported(), (0, 0, 0), 0
        if conn is not None:
            conn.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        code = None if self._proc is None else self._proc.wait()
        self._next_start = time.monotonic() + RESTART_AFTER_S
        if not self._stop:
            log.warning(
                "the span exporter process exited (code %s: %r); its spans are counted as dropped and a new "
                "one starts in %.0f s",
                code,
                why,
                RESTART_AFTER_S,
            )

    def _start_exporter(self) -> None:
        ours, theirs = socket.socketpair()
        cmd = [
            sys.executable,
            "-m",
            "sloserve.gateway.span_export",
            str(theirs.fileno()),
            str(os.getpid()),
            repr(self.config.to_dict()),
            repr(self.resource),
        ]
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError as e:
            ours.close()
            self._next_start = time.monotonic() + RESTART_AFTER_S
            if not self._warned:
                self._warned = True
                log.warning("could not start the span exporter process (%r); spans are dropped and counted", e)
            return
        finally:
            theirs.close()
        with contextlib.suppress(OSError):  # an exporter process that stops reading is replaced, not waited for
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT_S, 0))
        self._conn = Connection(ours.detach())

    # ---- flush and stop --------------------------------------------------------------------------
    def flush(self, timeout_s: float = 5.0) -> bool:
        """Ship what is buffered and wait until the exporter process has exported (or dropped) it all."""
        if self._thread is None:
            return not self._buf
        self.ship("flush")
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self._conn is None or sum(self._counts) >= self._handed:
                return self._conn is not None
            time.sleep(0.01)
            self.ship()
        return False

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the thread, hand over what is buffered, and let the exporter process export it and exit
        (bounded by the export timeout; then it is killed)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if not self._ship_lock.acquire(timeout=2.0):  # a send is stuck: the exporter process is not reading
            self.lost += sum(map(len, self.take()))
            if self._proc is not None:
                self._proc.kill()
            return
        try:
            if self._conn is None:
                self.lost += sum(map(len, self.take()))
                return
            self._ship(None)
            conn, proc = self._conn, self._proc
            if conn is None or proc is None:
                return
            end = time.monotonic() + (self.config.export_timeout_s + 3.0 if timeout_s is None else timeout_s)
            try:
                while proc.poll() is None and time.monotonic() < end:
                    if conn.poll(0.05):
                        self._counts = pickle.loads(conn.recv_bytes())
                while conn.poll(0):  # its last report
                    self._counts = pickle.loads(conn.recv_bytes())
            except (OSError, EOFError):
                pass
            self._gone(None)
        finally:
            self._ship_lock.release()


# ---- the exporter process ------------------------------------------------------------------------
def serve(conn: Connection, config: TraceConfig, resource: Mapping[str, Any]) -> None:
    """Export the gateway's records until it closes its end (or says stop), reporting the counts."""
    from sloserve.replica.tracing import processor_of

    res = Resource(dict(resource))
    scope = InstrumentationScope(SCOPE)
    # the records are queued as they come and made spans by the export thread: reading stays cheap
    processor = processor_of(config, lambda record: to_span(record, res, scope))
    reported = None

    def counts() -> tuple[int, int, int]:
        return processor.dropped_full, processor.dropped_export, processor.exported

    try:
        while True:
            msg: Any = ()
            if conn.poll(0.25):
                msg = pickle.loads(conn.recv_bytes())
            if isinstance(msg, list):
                for piece in msg:
                    for record in piece:
                        processor.put(record)
            elif msg == "flush":
                processor.force_flush(int(config.export_timeout_s * 2e3))
            elif msg is None:
                break
            now = counts()
            if now != reported:
                conn.send_bytes(pickle.dumps(now, protocol=5))
                reported = now
    except (EOFError, OSError):
        pass  # the gateway is gone or closed its end
    finally:
        processor.shutdown()  # what is queued goes out (bounded by the exporter's timeout)
        try:
            conn.send_bytes(pickle.dumps(counts(), protocol=5))
        except OSError:
            pass
        conn.close()


def _main(argv: Sequence[str]) -> None:
    import ast
    import signal

    from sloserve.gateway.backends.proctree import die_with_parent

    fd, parent = int(argv[0]), int(argv[1])
    config, resource = TraceConfig.from_dict(ast.literal_eval(argv[2])), ast.literal_eval(argv[3])

    def on_term(signum: int, frame: Any) -> None:  # the gateway died: nothing more to export
        if os.getppid() != parent:
            os._exit(0)

    # A Ctrl-C or a stop sent to the whole process group is the gateway's to handle: it closes its end
    # once it has stopped, and the spans it still held are exported then. Only its death ends this.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, on_term)
    die_with_parent()
    if os.getppid() != parent:
        return
    with contextlib.suppress(OSError):  # a saturated host serves first: spans are dropped and counted instead
        os.nice(NICE)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s span export: %(message)s")
    serve(Connection(fd), config, resource)


if __name__ == "__main__":
    _main(sys.argv[1:])
