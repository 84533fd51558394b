"""`sloserve serve --workers 2`: two gateway processes on one host sharing the HTTP and gRPC ports,
supervised as one service (sloserve/gateway/workers.py), driven by tritonclient and plain HTTP.

- both workers answer, and one scrape of /metrics counts both (``worker`` label);
- a worker killed mid-load: its requests in flight fail with an error (none is lost silently), the
  other keeps serving, the supervisor starts it again, and it joins the port only once it can serve;
- on Ray, the workers share the replicas' slots by lease: no replica ever holds more batches than its
  pipeline depth, whichever worker sent them;
- SIGTERM stops the whole service and leaves no process behind.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import json
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from sloserve.loadtests.promtext import samples
from tests.conftest import ServerProcess

pytestmark = pytest.mark.integration
# what a client of a killed worker sees: explicit errors (its connection or its answer cut off)
CUT_OFF = {"ConnectionResetError", "RemoteDisconnected", "BadStatusLine", "IncompleteRead"}
BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}).encode()


def infer(server, timeout: float = 10.0) -> int | str:
    """One request on a new connection (the kernel picks the worker per connection): the HTTP status,
    or what went wrong with the connection (an explicit error), or 'timeout' (silent: a defect)."""
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/digits/infer",
        data=BODY,
        method="POST",
        headers={"x-variant": "small", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except TimeoutError:
        return "timeout"
    # http.client.HTTPException: IncompleteRead, the answer cut short by its worker's death
    except (urllib.error.URLError, ConnectionError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        return "timeout" if isinstance(reason, TimeoutError) else type(reason).__name__


def load(server, seconds: float, threads: int = 6) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    end = time.monotonic() + seconds
    lock = threading.Lock()

    def run() -> None:
        while time.monotonic() < end:
            got = infer(server)
            with lock:
                out[got] += 1

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def all_serving(server, n: int = 2, timeout_s: float = 180.0):
    """Until every worker has joined the ports (each says so once its models are loaded): the
    service is ready with its first worker, the others may still be loading."""
    end = time.monotonic() + timeout_s
    while server.output(None).count("sloserve serving HTTP") < n:
        assert time.monotonic() < end, server.output()
        time.sleep(0.2)
    return server


def workers(server) -> list[psutil.Process]:
    kids = psutil.Process(server.proc.pid).children()
    return [p for p in kids if "spawn_main" in " ".join(p.cmdline())]


def scrape(server) -> str:
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as r:
        return r.read().decode()


def by_worker(text: str, name: str, **labels: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for x in samples(text, name, **labels):
        out[x.labels["worker"]] = out.get(x.labels["worker"], 0.0) + x.value
    return out


def kill_one_mid_load(server) -> tuple[collections.Counter, int]:
    """SIGKILL worker 1 two seconds into six seconds of load; its successor's pid."""
    victim = next(p for p in workers(server) if p.pid != min(w.pid for w in workers(server)))
    threading.Timer(2.0, lambda: os.kill(victim.pid, signal.SIGKILL)).start()
    outcomes = load(server, 6.0)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        fresh = [p.pid for p in workers(server) if p.pid != victim.pid]
        if len(fresh) == 2:
            return outcomes, max(fresh)
        time.sleep(0.2)
    raise AssertionError(f"the killed worker was not started again:\n{server.output()}")


@contextlib.contextmanager
def serving(server):
    """The server for a test: its log printed if the test fails, stopped cleanly (nothing left) after."""
    try:
        yield server
    except BaseException:
        print(server.output())
        raise
    finally:
        if server.proc.poll() is None:
            stop_cleanly(server)


def stop_cleanly(server) -> None:
    below = psutil.Process(server.proc.pid).children(recursive=True)
    assert server.stop() == 0, getattr(server, "last_words", "")
    time.sleep(0.5)
    alive = [p for p in below if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, [" ".join(p.cmdline())[:120] for p in alive]


@pytest.fixture
def digits_repo(model_repo, tmp_path):
    shutil.copytree(model_repo / "digits", tmp_path / "digits")
    return tmp_path


def test_two_workers_share_the_ports_survive_a_kill_and_stop_as_one(digits_repo):
    s = all_serving(ServerProcess(digits_repo, "inprocess", ["--workers", "2"]).wait_ready())
    with serving(s):
        assert len(workers(s)) == 2
        assert all(infer(s) == 200 for _ in range(60))
        text = scrape(s)
        served = by_worker(text, "sloserve_requests_total", model="digits", outcome="ok")
        assert set(served) == {"0", "1"} and sum(served.values()) == 60, served
        assert [x.value for x in samples(text, "sloserve_metrics_workers_missing")] == [0.0]

        client = grpcclient.InferenceServerClient(s.grpc_url)
        x = grpcclient.InferInput("input", [1, 64], "FP32")
        x.set_data_from_numpy(np.full((1, 64), 0.5, np.float32))
        assert client.infer("digits", [x]).as_numpy("probs").shape == (1, 10)

        req = urllib.request.Request(
            f"http://{s.http_url}/v2/repository/models/digits/load",
            data=b"",
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and "workers" in json.loads(e.value.read())["error"]

        outcomes, _ = kill_one_mid_load(s)
        assert outcomes[200] > 100, outcomes
        assert "timeout" not in outcomes, f"requests lost silently: {outcomes}"
        assert set(outcomes) <= {200, *CUT_OFF}, outcomes
        assert "exited with -9; starting it again" in s.output()
        # the successor joins the port once it can serve: from here on every request is answered
        again = load(s, 3.0)
        all_serving(s, 3)
        assert set(again) == {200}, again
        served = by_worker(scrape(s), "sloserve_requests_total", model="digits", outcome="ok")
        assert set(served) == {"0", "1"}, served


def test_ray_workers_share_the_replicas_slots_by_lease(digits_repo):
    """One replica per variant at pipeline depth 2, two gateways sending to it: each holds a lease
    on part of its slots, so the replica never holds more than 2 batches, and a killed gateway's
    share goes back to the other."""
    cfg = digits_repo / "w.json"
    cfg.write_text(json.dumps({"pipeline_depth": 2, "instances": 1}))
    s = all_serving(ServerProcess(digits_repo, "ray", ["--workers", "2", "--config", str(cfg)]).wait_ready())
    with serving(s):
        outcomes = load(s, 4.0, threads=12)
        assert set(outcomes) == {200}, outcomes
        time.sleep(1.5)  # the peak is reported with the replica counts, once a second
        text = scrape(s)
        assert set(by_worker(text, "sloserve_requests_total", model="digits", outcome="ok")) == {"0", "1"}
        peaks = by_worker(text, "sloserve_replica_peak_batches", model="digits", variant="small")
        assert peaks and max(peaks.values()) <= 2, f"a replica held more than its depth: {peaks}"
        assert max(peaks.values()) >= 1
        held = by_worker(text, "sloserve_batch_slots", model="digits", variant="small")
        assert set(held) == {"0", "1"} and sum(held.values()) <= 2, f"the leases add up past the slots: {held}"

        outcomes, _ = kill_one_mid_load(s)
        assert "timeout" not in outcomes, f"requests lost silently: {outcomes}"
        assert outcomes[200] > 100, outcomes
        again = load(s, 3.0, threads=12)
        all_serving(s, 3)
        assert set(again) == {200}, again
        peaks = by_worker(scrape(s), "sloserve_replica_peak_batches", model="digits", variant="small")
        assert max(peaks.values()) <= 2, peaks


def test_a_broken_model_stops_the_service_before_any_worker_starts(digits_repo):
    """A broken model would fail every worker the same way: the supervisor checks the repository as a
    lone gateway does and exits 2 saying why, before it starts Ray or any worker (instead of
    restarting its workers forever)."""
    (digits_repo / "digits" / "config.json").write_text("{not json")
    s = ServerProcess(digits_repo, "inprocess", ["--workers", "2"])
    try:
        assert s.proc.wait(120) == 2
        said = s.output()
        assert "not valid JSON" in said and "digits" in said and "sloserve models check" in said, said
        assert "gateway workers on" not in said, said  # no worker was started
    finally:
        if s.proc.poll() is None:
            s.kill()
