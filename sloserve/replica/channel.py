"""The batch channel, replica side: how a replica process takes whole batches from gateways.

A gateway hands each batch to a replica as one frame and gets the outputs back as one frame. The
same protocol serves a worker process of the in-process backend (over a ``socketpair``) and a Ray
Serve replica (over TCP, after a mutual HMAC handshake); the gateway's side is
``sloserve/gateway/backends/channel.py``.

Frames are ``multiprocessing.connection``'s: a 4-byte big-endian length, then a pickle (protocol
5) of a tuple.

- replica -> gateway, once when the connection opens: ``("ready", info)`` (``info``: a dict with
  ``device_type``, ``variants``, ``pid``) or ``("error", message)`` when the model did not load;
- gateway -> replica: ``("batch", batch_id, inputs, budget_s, variant[, traceparent])``: ``budget_s`` is how long
  the gateway still waits for it (None: no limit), counted by the replica from when it reads the
  frame, so no clock is shared between hosts; a batch still queued past it is skipped, never run
  late; ``variant`` None means the replica's default; ``traceparent`` (W3C), only on a batch the
  gateway traces: the replica records its compute as a child span (``sloserve/replica/tracing.py``);
- gateway -> replica: ``("stamp", stamp)``: the gateway's demand for the autoscaler (see
  ``sloserve.replica.ray_replica``);
- replica -> gateway: ``(batch_id, outputs, compute_s, held)``, ``(batch_id, None, 0.0, held)`` for a
  skipped batch, or ``(batch_id, "error", message, held)`` when the replica refused the batch;
  ``held`` is how many batches (from every gateway, this one included) the replica held when this
  one arrived: the gateways' leases keep it at most the replica's depth.

The replica reads each connection in a thread of its own (the next batch is read and unpickled
while one computes) and computes every batch, from every connection, in arrival order on one thread.

    >>> import socket
    >>> from multiprocessing.connection import Connection
    >>> a, b = socket.socketpair()
    >>> server = BatchServer(lambda inputs, variant: {"y": inputs["x"] * 2})
    >>> t = threading.Thread(target=server.serve, args=(Connection(b.detach()), {"pid": 1}), daemon=True)
    >>> t.start()
    >>> gw = Connection(a.detach())
    >>> pickle.loads(gw.recv_bytes())[0]
    'ready'
    >>> gw.send_bytes(pickle.dumps(("batch", 7, {"x": 21}, None, None)))
    >>> pickle.loads(gw.recv_bytes())[:2]
    (7, {'y': 42})
    >>> gw.close(); server.close()
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import pickle
import queue
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from sloserve.replica import tracing

log = logging.getLogger("sloserve.channel")

Compute = Callable[[dict[str, Any], "str | None"], dict[str, Any]]
# accept() errors that pass: the process is short of descriptors, buffers or memory for a moment, or the
# peer gave up before its connection was accepted
_TRANSIENT_ACCEPT_ERRORS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO, errno.EINTR}
)
HANDSHAKE_TIMEOUT_S = 5.0
_NONCE = 32


class BatchServer:
    """Computes batches from any number of connections, one at a time, in arrival order.

    ``compute(inputs, variant)`` runs one batch (ONNX Runtime releases the GIL while it computes);
    ``on_stamp`` takes the autoscaling stamps; ``delay_s`` (chaos drills) holds every batch this long
    before computing, as a slow replica would."""

    def __init__(
        self,
        compute: Compute,
        on_stamp: Callable[[tuple], None] | None = None,
        delay_s: float = 0.0,
        model: str = "",
    ):
        self.compute = compute
        self.model = model  # (a traced batch's compute span names it)
        self.on_stamp = on_stamp or (lambda stamp: None)
        self.delay_s = delay_s
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outstanding = 0  # batches read and not yet answered
        self._held = 0  # batches read and not yet computed (a gateway may send the next once it has the answer)
        self._lock = threading.Lock()
        self._worker = threading.Thread(target=self._compute_loop, name="batch-compute", daemon=True)
        self._worker.start()

    def serve(self, conn: Connection, info: dict[str, Any]) -> None:
        """Say ready on ``conn``, then read its frames until it closes (blocking: run it in a thread)."""
        try:
            conn.send_bytes(pickle.dumps(("ready", info), protocol=5))
            while True:
                msg = pickle.loads(conn.recv_bytes())
                if msg[0] == "batch":
                    with self._lock:
                        self._outstanding += 1
                        self._held += 1
                        held = self._held
                    self._inbox.put((conn, msg, time.monotonic(), held))
                elif msg[0] == "stamp":
                    self.on_stamp(msg[1])
        except (EOFError, OSError):
            pass
        except Exception as e:  # a frame no gateway of ours sends: that connection alone is dropped
            log.warning("dropped a channel connection that sent an unreadable frame: %r", e)
        finally:
            conn.close()

    def close(self) -> None:
        self._inbox.put(None)

    def alive(self) -> bool:
        """Whether the thread that computes every batch still runs (a batch read with it gone would
        never be answered)."""
        return self._worker.is_alive()

    def drain(self, timeout_s: float) -> bool:
        """Wait until every batch read so far is answered (True), or ``timeout_s`` passes (False)."""
        end = time.monotonic() + timeout_s
        while self._outstanding > 0 and time.monotonic() < end:
            time.sleep(0.01)
        return self._outstanding == 0

    def _compute_loop(self) -> None:
        while (item := self._inbox.get()) is not None:
            conn, msg, read_at, held = item
            _, bid, inputs, budget_s, variant = msg[:5]
            if budget_s is not None and time.monotonic() > read_at + budget_s:
                reply: tuple = (bid, None, 0.0)  # its gateway no longer waits: not run late
            else:
                # a traced batch (its gateway's batch span as a 6th field): the compute's span, here
                span = (
                    tracing.start_compute(msg[5], self.model, variant, tracing.rows_of(inputs))
                    if len(msg) > 5
                    else None
                )
                t0 = time.perf_counter()
                try:
                    if self.delay_s:
                        time.sleep(self.delay_s)
                    reply = (bid, self.compute(inputs, variant), time.perf_counter() - t0)
                except Exception as e:
                    reply = (bid, "error", f"{type(e).__name__}: {e}")
                if span is not None:
                    tracing.end_compute(span, reply[2] if reply[1] == "error" else None)
            with self._lock:
                self._held -= 1
            try:
                # + the batches this replica held (from every gateway) when this one arrived, itself included
                conn.send_bytes(pickle.dumps((*reply, held), protocol=5))
            except OSError:  # that gateway went away; the others are served on
                pass
            finally:
                with self._lock:
                    self._outstanding -= 1


class ChannelListener:
    """A TCP listener in front of a :class:`BatchServer` (a Ray Serve replica's data path).

    Binds ``host`` on a free port. A gateway proves it holds ``key`` (and the replica proves it too)
    with an HMAC-SHA256 challenge before anything is unpickled; a connection that does not finish
    the handshake within ``HANDSHAKE_TIMEOUT_S`` is dropped without holding up the others."""

    def __init__(self, server: BatchServer, host: str, info: dict[str, Any], key: bytes | None = None):
        self.server = server
        self.info = info
        self.key = key or secrets.token_bytes(32)
        self._sock = socket.create_server((host, 0), backlog=64)
        self.host, self.port = self._sock.getsockname()[:2]
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept_loop, name="channel-accept", daemon=True)
        self._acceptor.start()

    def problem(self) -> str | None:
        """Why this channel can no longer take gateways or answer their batches (its accept thread or
        the batch server's compute thread is gone), or None while it can. A replica's health check
        fails on it, so Ray Serve replaces the replica instead of leaving it unreachable."""
        if self._closed:
            return "the batch channel is closed"
        if not self._acceptor.is_alive():
            return "the batch channel's accept thread has stopped: no gateway can connect"
        if not self.server.alive():
            return "the batch channel's compute thread has stopped: no batch would be answered"
        return None

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except OSError as e:
                if self._closed:
                    return
                if e.errno in _TRANSIENT_ACCEPT_ERRORS:  # out of descriptors or memory for a moment
                    log.warning("the batch channel could not accept a connection (%s); retrying", e)
                    time.sleep(0.1)
                    continue
                log.error("the batch channel stopped accepting gateways: %r", e)
                return
            try:
                threading.Thread(target=self._open, args=(sock,), name="channel-conn", daemon=True).start()
            except RuntimeError as e:  # no thread to read it: drop this one connection, keep accepting
                log.warning("dropped a channel connection: %s", e)
                sock.close()

    def _open(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            server_handshake(sock, self.key)
        except (OSError, ValueError) as e:
            log.warning("refused a channel connection: %s", e)
            sock.close()
            return
        self.server.serve(Connection(sock.detach()), self.info)

    def close(self) -> None:
        self._closed = True
        self._sock.close()


# ---- the handshake: mutual HMAC-SHA256 over random nonces, on a blocking socket ---------------------
def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack("!i", len(data)) + data)


def _recv(sock: socket.socket, limit: int = 256) -> bytes:
    head = _recv_exact(sock, 4)
    (n,) = struct.unpack("!i", head)
    if not 0 <= n <= limit:
        raise ValueError(f"handshake frame of {n} bytes (at most {limit})")
    return _recv_exact(sock, n)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed during the handshake")
        buf += chunk
    return bytes(buf)


def _mac(key: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, role + nonce, "sha256").digest()


def server_handshake(sock: socket.socket, key: bytes, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
    """The replica's side: challenge the gateway, then answer its challenge. Raises ValueError on a
    wrong key, OSError on a timeout or a closed connection."""
    sock.settimeout(timeout_s)
    mine = os.urandom(_NONCE)
    _send(sock, mine)
    reply = _recv(sock)
    if len(reply) != 32 + _NONCE or not hmac.compare_digest(reply[:32], _mac(key, b"gateway", mine)):
        raise ValueError("the gateway's handshake did not match this replica's key")
    _send(sock, _mac(key, b"replica", reply[32:]))
    sock.settimeout(None)


def client_handshake(sock: socket.socket, key: bytes, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
    """The gateway's side of :func:`server_handshake`."""
    sock.settimeout(timeout_s)
    theirs = _recv(sock)
    mine = os.urandom(_NONCE)
    _send(sock, _mac(key, b"gateway", theirs) + mine)
    if not hmac.compare_digest(_recv(sock), _mac(key, b"replica", mine)):
        raise ValueError("the replica's handshake did not match its published key")
    sock.settimeout(None)
