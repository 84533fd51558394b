"""The repository API on `sloserve serve --workers 2` (Ray backend): one model set for every worker.

The kernel hands each new connection to either worker, so each check below is made on fresh
connections (several, reaching both workers) or on keep-alive connections spread over them:

- an unload through one worker: every worker answers 404 at once, and the index says unloaded;
- a load through one worker: every worker serves it when the load answers;
- two concurrent loads of one model with different overrides through two connections: both
  answer, one after the other; every worker then serves the same config, from one replica;
- an unload under load: every request is answered (200 before, 404/503 after), none is cut off or
  left without an answer, and no 5xx but 503;
- a worker killed in the middle of a reload: the call gets an explicit answer or a cut connection,
  never a hang; afterwards every worker (the restarted one too) reports the same model set, and a
  load through any worker serves on all of them.
"""

from __future__ import annotations

import collections
import http.client
import json
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from sloserve.loadtests.promtext import samples
from tests.conftest import ServerProcess
from tests.integration.test_workers import all_serving, serving, workers

pytestmark = pytest.mark.integration
BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}).encode()
JSON = {"Content-Type": "application/json"}


def call(server, method: str, path: str, body: bytes = b"", timeout: float = 120.0) -> tuple[int | str, bytes]:
    """One request on a fresh connection: (status, body), or the kind of connection error."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=JSON)
        r = conn.getresponse()
        return r.status, r.read()
    except TimeoutError:
        return "timeout", b""
    except (ConnectionError, http.client.HTTPException, OSError) as e:
        return type(e).__name__, b""
    finally:
        conn.close()


def load(server, model: str, override: dict | None = None) -> tuple[int | str, bytes]:
    body = json.dumps({"parameters": {"config": json.dumps(override)}}).encode() if override else b"{}"
    return call(server, "POST", f"/v2/repository/models/{model}/load", body)


def infer(server, model: str) -> int | str:
    return call(server, "POST", f"/v2/models/{model}/infer", BODY, timeout=30)[0]


def index(server) -> list[dict]:
    status, body = call(server, "POST", "/v2/repository/index", b"{}")
    assert status == 200, (status, body)
    return json.loads(body)


def slo_of(server, model: str) -> str:
    status, body = call(server, "GET", f"/v2/models/{model}/config")
    assert status == 200, (status, body)
    return json.loads(body)["parameters"]["slo_ms"]["string_value"]


def running_replicas(server, model: str) -> dict[str, float]:
    """Each worker's count of the model's running replicas (one scrape answers for both)."""
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for x in samples(text, "sloserve_replicas", model=model, state="running"):
        out[x.labels["worker"]] = out.get(x.labels["worker"], 0.0) + x.value
    return out


@pytest.fixture(scope="module")
def service(model_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo2")
    for m in ("digits", "cnn"):
        shutil.copytree(model_repo / m, repo / m)
    cfg = repo / "w.json"  # one replica per model (every variant on it): light enough for two cores
    cfg.write_text(json.dumps({"instances": 1, "models": {m: {"shared_replicas": True} for m in ("digits", "cnn")}}))
    s = all_serving(ServerProcess(repo, "ray", ["--workers", "2", "--config", str(cfg)]).wait_ready())
    with serving(s):
        yield s


def test_unload_and_load_through_one_worker_change_every_worker(service):
    assert load(service, "cnn")[0] == 200  # (unchanged: it serves)
    t0 = time.monotonic()
    assert call(service, "POST", "/v2/repository/models/cnn/unload", b"{}")[0] == 200
    assert time.monotonic() - t0 < 30
    assert [infer(service, "cnn") for _ in range(12)] == [404] * 12
    for _ in range(6):
        states = {m["name"]: (m["state"], m["reason"]) for m in index(service)}
        assert states["cnn"] == ("UNAVAILABLE", "unloaded") and states["digits"][0] == "READY", states
    status, body = load(service, "cnn")
    assert status == 200, body
    assert [infer(service, "cnn") for _ in range(12)] == [200] * 12  # every worker serves it as the load answers
    assert all(m["state"] == "READY" for _ in range(6) for m in index(service))


def test_concurrent_loads_of_one_model_end_in_one_state(service):
    answers: dict[int, tuple] = {}

    def go(i: int) -> None:
        answers[i] = load(service, "cnn", {"slo_ms": 40 + i})

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [answers[i][0] for i in range(2)] == [200, 200], answers
    slos = {slo_of(service, "cnn") for _ in range(10)}
    assert len(slos) == 1 and slos <= {"40.0", "41.0"}, slos  # every worker: the load that ended last
    assert [infer(service, "cnn") for _ in range(8)] == [200] * 8
    deadline = time.monotonic() + 5
    while (counts := running_replicas(service, "cnn")) != {"0": 1.0, "1": 1.0} and time.monotonic() < deadline:
        time.sleep(0.5)
    assert counts == {"0": 1.0, "1": 1.0}, counts  # one replica, not one per load


def test_an_unload_under_load_answers_every_request(service):
    assert load(service, "cnn")[0] == 200
    outcomes: collections.Counter = collections.Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            got = infer(service, "cnn")
            with lock:
                outcomes[got] += 1

    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    assert call(service, "POST", "/v2/repository/models/cnn/unload", b"{}")[0] == 200
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join()
    assert outcomes[200] > 10 and outcomes[404] > 0, outcomes
    assert set(outcomes) <= {200, 404, 503}, f"cut off, lost or failed: {outcomes}"
    assert load(service, "cnn")[0] == 200


def test_a_worker_killed_during_a_reload_leaves_one_model_set(service):
    """The reload's call races the death of either worker (the one doing it, or the other): an
    explicit answer or a cut connection, never a hang; then both workers agree, and a load works."""
    answer: list = []
    t = threading.Thread(target=lambda: answer.append(load(service, "cnn", {"slo_ms": 77})))
    victim = max(workers(service), key=lambda p: p.pid)
    t.start()
    time.sleep(0.3)
    os.kill(victim.pid, signal.SIGKILL)
    t.join(timeout=150)
    assert not t.is_alive(), "the load hangs"
    status = answer[0][0]
    assert status in (200, 503) or isinstance(status, str) and status != "timeout", answer
    all_serving(service, 3)  # the killed worker is back (and has joined the ports: it applied the book)
    status, body = load(service, "cnn", {"slo_ms": 78})
    assert status == 200, body
    seen = {(slo_of(service, "cnn"), infer(service, "cnn")) for _ in range(10)}
    assert seen == {("78.0", 200)}, seen
    states = {json.dumps(index(service), sort_keys=True) for _ in range(8)}
    assert len(states) == 1, states
