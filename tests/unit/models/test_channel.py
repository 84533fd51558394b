"""The replica side of the batch channel (sloserve/replica/channel.py): each gateway's connection is read as
its frames come, every batch computes on one thread in the order it was read, and a stalled or
broken gateway holds up nobody else. Real sockets, no sleeps: the compute function is held on events."""

import doctest
import errno
import os
import pickle
import socket
import struct
import threading
import time
from multiprocessing.connection import Connection

import numpy as np
import pytest

import sloserve.replica.channel as channel
from sloserve.replica.channel import BatchServer


def _recv(gw: Connection) -> tuple:
    assert gw.poll(10), "no answer from the replica"
    return pickle.loads(gw.recv_bytes())


def _send(gw: Connection, msg: tuple) -> None:
    gw.send_bytes(pickle.dumps(msg, protocol=5))


def _serve(server: BatchServer, rep: socket.socket) -> threading.Thread:
    t = threading.Thread(target=server.serve, args=(Connection(rep.detach()), {"pid": 1}), daemon=True)
    t.start()
    return t


def _gateway(server: BatchServer) -> Connection:
    gw, rep = socket.socketpair()
    _serve(server, rep)
    conn = Connection(gw.detach())
    assert _recv(conn) == ("ready", {"pid": 1})
    return conn


def _until(cond, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


class Held:
    """A compute function whose batches wait for ``release`` (and say when they started)."""

    def __init__(self):
        self.release = threading.Event()
        self.started = threading.Event()
        self.order: list[int] = []

    def __call__(self, inputs, variant):
        self.order.append(int(inputs["x"][0]))
        self.started.set()
        assert self.release.wait(10)
        if variant == "bad":
            raise ValueError("no such variant here")
        return {"y": inputs["x"] * 2}


def test_the_module_doctest():
    assert doctest.testmod(channel).failed == 0


def test_batches_from_two_gateways_in_read_order_with_what_the_replica_held():
    f = Held()
    server = BatchServer(f)
    a, b = _gateway(server), _gateway(server)
    _send(a, ("batch", 1, {"x": np.array([1])}, None, None))
    assert f.started.wait(10)  # batch 1 computes; the next two queue in the sockets
    _send(b, ("batch", 2, {"x": np.array([2])}, None, None))
    _send(a, ("batch", 3, {"x": np.array([3])}, None, None))
    _until(lambda: server._outstanding == 3)  # both read while batch 1 computes
    f.release.set()
    r1 = _recv(a)
    assert r1[0] == 1 and r1[1]["y"].tolist() == [2] and r1[3] == 1
    r2, r3 = _recv(b), _recv(a)
    assert (r2[0], r3[0]) == (2, 3)
    assert sorted([r2[3], r3[3]]) == [2, 3]  # read while batch 1 computed: it was held too
    assert f.order == [1, 2, 3] or f.order == [1, 3, 2]
    assert server.drain(5)
    server.close()


def test_a_batch_past_its_budget_is_skipped_and_a_failing_one_answers_an_error():
    f = Held()
    server = BatchServer(f)
    gw = _gateway(server)
    _send(gw, ("batch", 1, {"x": np.array([1])}, None, None))
    assert f.started.wait(10)
    _send(gw, ("batch", 2, {"x": np.array([2])}, 0.0, None))  # no time left once it is read
    _until(lambda: server._outstanding == 2)
    f.release.set()
    assert _recv(gw)[0] == 1
    assert _recv(gw)[:3] == (2, None, 0.0)
    _send(gw, ("batch", 3, {"x": np.array([3])}, None, "bad"))
    bid, outputs, message, _held = _recv(gw)
    assert (bid, outputs) == (3, "error") and "no such variant here" in message
    server.close()


def test_stamps_reach_on_stamp():
    got: list[tuple] = []
    stamped = threading.Event()
    server = BatchServer(lambda inputs, variant: inputs, on_stamp=lambda s: (got.append(s), stamped.set()))
    gw = _gateway(server)
    _send(gw, ("stamp", ("gw-1", 12.5)))
    assert stamped.wait(10) and got == [("gw-1", 12.5)]
    server.close()


def test_a_gateway_stalled_mid_frame_or_sending_garbage_holds_up_nobody(caplog):
    f = Held()
    f.release.set()
    server = BatchServer(f)
    stalled, garbage, good = _gateway(server), _gateway(server), _gateway(server)
    body = pickle.dumps(("batch", 9, {"x": np.array([9])}, None, None))
    frame = struct.pack("!i", len(body)) + body
    os.write(stalled.fileno(), frame[:9])  # half a frame, then nothing
    garbage.send_bytes(b"\x80\x05X")  # not a pickle of ours
    _send(good, ("batch", 1, {"x": np.array([1])}, None, None))
    assert _recv(good)[0] == 1
    assert garbage.poll(10)
    with pytest.raises(EOFError):  # that connection was dropped
        garbage.recv_bytes()
    assert "unreadable frame" in caplog.text  # said so, rather than a reader thread's traceback
    os.write(stalled.fileno(), frame[9:])  # the rest arrives late: the batch is served then
    assert _recv(stalled)[0] == 9
    server.close()


def test_a_gateway_that_goes_away_is_dropped_and_its_batch_not_answered():
    f = Held()
    server = BatchServer(f)
    sock, rep = socket.socketpair()
    t = _serve(server, rep)
    gw = Connection(sock.detach())
    _recv(gw)
    _send(gw, ("batch", 1, {"x": np.array([1])}, None, None))
    assert f.started.wait(10)
    gw.close()
    f.release.set()
    t.join(10)
    assert not t.is_alive()  # the connection is gone
    assert server.drain(5)
    server.close()


def _listener() -> tuple[BatchServer, channel.ChannelListener]:
    server = BatchServer(lambda inputs, variant: {"y": inputs["x"] * 2})
    return server, channel.ChannelListener(server, "127.0.0.1", {"pid": 1})


def _connect(listener: channel.ChannelListener) -> Connection:
    sock = socket.create_connection((listener.host, listener.port), timeout=10)
    channel.client_handshake(sock, listener.key)
    gw = Connection(sock.detach())
    assert _recv(gw) == ("ready", {"pid": 1})
    return gw


def _replica(server: BatchServer, listener: channel.ChannelListener):
    """A Ray Serve replica object around this channel, without Ray (its constructor loads a model and
    publishes the channel through Serve)."""
    from sloserve.replica.ray_replica import OnnxReplica

    replica = OnnxReplica.__new__(OnnxReplica)
    replica._server, replica._listener, replica._kv_key = server, listener, None
    replica.model, replica.variant = "digits", "small"
    return replica


def test_the_replica_health_check_fails_once_its_channel_stops_accepting():
    """A replica whose channel no longer accepts gateways is unreachable for them, though Serve's
    own calls still reach it: its health check fails, so Serve replaces it (no Ray needed here)."""
    server, listener = _listener()
    replica = _replica(server, listener)
    replica.check_health()
    gw = _connect(listener)
    _send(gw, ("batch", 1, {"x": np.array([4])}, None, None))
    assert _recv(gw)[1]["y"].tolist() == [8]
    listener._sock.shutdown(socket.SHUT_RDWR)  # accept() fails for good: the accept thread ends
    listener._acceptor.join(10)
    with pytest.raises(RuntimeError, match="accept thread has stopped"):
        replica.check_health()
    gw.close()
    server.close()
    listener.close()


def test_the_replica_health_check_fails_once_the_compute_thread_is_gone():
    server, listener = _listener()
    replica = _replica(server, listener)
    server.close()  # the compute loop ends
    server._worker.join(10)
    with pytest.raises(RuntimeError, match="compute thread has stopped"):
        replica.check_health()
    listener.close()


class _Flaky:
    """A listening socket whose next accept() fails as a process short of descriptors sees it."""

    def __init__(self, sock: socket.socket):
        self.sock, self.failed = sock, threading.Event()

    def accept(self):
        if not self.failed.is_set():
            self.failed.set()
            raise OSError(errno.EMFILE, "Too many open files")
        return self.sock.accept()

    def close(self):
        self.sock.close()


def test_a_transient_accept_error_does_not_stop_the_channel(caplog):
    server, listener = _listener()
    flaky = _Flaky(listener._sock)
    listener._sock = flaky  # the accept thread is in the real socket's accept(); the next call fails once
    _connect(listener).close()  # (accepted by the real socket; then the loop meets the error)
    assert flaky.failed.wait(10)
    gw = _connect(listener)  # accepted after the error
    _send(gw, ("batch", 1, {"x": np.array([1])}, None, None))
    assert _recv(gw)[1]["y"].tolist() == [2]
    assert listener.problem() is None and "retrying" in caplog.text
    gw.close()
    server.close()
    listener.close()
