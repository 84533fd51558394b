"""Overload: open-loop Poisson load at 3x the measured capacity, then back to normal.

The server is in-process with only the digits model, every batch held 100 ms in the replica
(``fault_delay_ms``) and batches capped at 4 rows, so capacity is a few tens of requests/s: small
enough for a Python open-loop generator sharing two cores, with the gateway's own CPU far from saturated.
Requests pin ``variant=small`` (one replica, one capacity) and carry ``slo_ms=250``.

Checked: nothing but 200, 429 and 503; no timeouts or connection errors; every refusal carries
Retry-After; admitted requests' p99 within the SLO (+20% tolerance: latency is measured from the
*scheduled* send time by a generator sharing two cores with the server); most refusals at once
(at admission); none later than the deadline; the server's RSS flat; goodput back to normal within
3 s of the load dropping. The longer run: docs/reliability.md ("Overload").
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import urllib.request

import httpx
import psutil
import pytest

from sloserve.gateway.config import Settings
from sloserve.gateway.server import Gateway
from sloserve.loadtests.openloop import pct, run_open_loop, v2_body
from sloserve.loadtests.promtext import prom_sum
from tests.conftest import ServerProcess

pytestmark = pytest.mark.integration
SLO_MS = 250.0
TOLERANCE = 1.6  # client side, from the scheduled send time: generator and server share 2 cores
PARAMS = {"variant": "small", "slo_ms": SLO_MS}


def server_config(fault_delay_ms: float = 100.0) -> dict:
    return {
        "max_queue_rows": 64,
        "models": {"digits": {"fault_delay_ms": fault_delay_ms, "batching": {"policy": "slo", "max_batch_size": 4}}},
    }


def rss_kb(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss // 1024


def make_bodies(n: int = 256) -> list[bytes]:
    rng = random.Random(7)
    return [v2_body("input", [float(rng.randint(0, 16)) for _ in range(64)], PARAMS) for _ in range(n)]


def phase(url: str, rate: float, duration: float, bodies: list[bytes], seed: int):
    return asyncio.run(
        run_open_loop(
            url, "/v2/models/digits/infer", rate, duration, lambda i: bodies[i % len(bodies)], timeout_s=5.0, seed=seed
        )
    )


@pytest.fixture(scope="module")
def overload_server(model_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(model_repo / "digits", repo / "digits")
    cfg = repo / "overload.json"
    cfg.write_text(json.dumps(server_config()))
    s = ServerProcess(repo, "inprocess", ["--config", str(cfg)]).wait_ready(60)
    yield s
    s.stop()


def capacity_ramp(url: str, bodies: list[bytes]) -> float:
    """Goodput (answers within the SLO per second) at the best step of a short geometric ramp."""
    phase(url, 15.0, 1.5, bodies, seed=99)  # warm-up: the policy calibrates on the round trips
    best = 0.0
    for k, rate in enumerate((20.0, 40.0, 80.0)):
        s = phase(url, rate, 1.5, bodies, seed=k).summary(SLO_MS / 1e3)
        best = max(best, s["goodput_rps"])
        if s["goodput_rps"] < 0.8 * s["offered_rps"]:
            break
    return best


def counters(url: str) -> dict[str, float]:
    """Answered-on-time and answered-ok counts from the gateway's own metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        "met": prom_sum(text, "sloserve_slo_requests_total", met="true"),
        "ok": prom_sum(text, "sloserve_requests_total", outcome="ok"),
        "shed_n": prom_sum(text, "sloserve_shed_answer_seconds_bucket", le="+Inf"),
        "shed_1ms": prom_sum(text, "sloserve_shed_answer_seconds_bucket", le="0.001"),
    }


def test_three_times_capacity_then_normal(overload_server):
    s = overload_server
    url = f"http://{s.http_url}"
    bodies = make_bodies()
    capacity = capacity_ramp(url, bodies)
    assert capacity > 20, capacity
    rss_before = rss_kb(s.proc.pid)
    before = counters(url)

    over = phase(url, 3 * capacity, 6.0, bodies, seed=11)
    during = counters(url)
    normal_rate = 0.5 * capacity
    after = phase(url, normal_rate, 3.0, bodies, seed=12)
    rss_after = rss_kb(s.proc.pid)
    summary = over.summary(SLO_MS / 1e3)
    print("capacity", capacity, "overload", json.dumps(summary), "rss_kb", rss_before, rss_after)

    codes = summary["status"]
    assert set(codes) <= {"200", "429", "503"}, codes  # no 5xx but 503, no timeouts, no resets
    # Goodput under 3x overload stays near capacity (measured 92-98% since admission predicts
    # finishes batch by batch; 55-115% before). The bound leaves room for a noisy CI box.
    assert codes.get("200", 0) >= 0.7 * capacity * 6.0, (capacity, codes)
    refused = [r for r in over.records if r.status in (429, 503)]
    assert len(refused) >= len(over.records) / 3, codes  # 3x: most of the excess is refused
    assert all(r.retry_after for r in refused)
    # The SLO is measured from arrival at the gateway (docs/architecture.md): the server's own count
    # says whether admitted requests made their deadlines, free of the generator's lateness.
    admitted = during["ok"] - before["ok"]
    met = during["met"] - before["met"]
    # Goal: >= 99% of admitted requests on time; the test allows 95% on a machine it shares.
    assert admitted > 0 and met / admitted >= 0.95, (met, admitted)
    # A shed request gets its answer within 1 ms of the decision, timed by the server from
    # the decision to the 503 written (sloserve_shed_answer_seconds).
    shed_n, shed_1ms = during["shed_n"] - before["shed_n"], during["shed_1ms"] - before["shed_1ms"]
    print("sheds timed", shed_n, "within 1 ms", shed_1ms, "admitted on time", met, "of", admitted)
    assert shed_n >= len(refused) * 0.9 and shed_1ms >= 0.9 * shed_n, (shed_n, shed_1ms, len(refused))
    ok = [r.latency_s for r in over.records if r.status == 200]
    assert pct(ok, 99) <= TOLERANCE * SLO_MS / 1e3, summary  # client side: + generator lateness
    lat = [r.latency_s for r in refused]
    assert pct(lat, 50) < 0.05, summary  # refused at admission, at once
    assert max(lat) <= TOLERANCE * SLO_MS / 1e3, summary  # never later than the deadline (+ tolerance)
    assert rss_after - rss_before < 30 * 1024, (rss_before, rss_after)

    # Recovery: from 1 s after the load drops, normal load is served as before.
    t0 = after.started_s
    late = [r for r in after.records if r.due_s >= t0 + 1.0]
    good = sum(1 for r in late if r.status == 200 and r.latency_s <= SLO_MS / 1e3)
    assert good >= 0.8 * len(late), after.summary(SLO_MS / 1e3)
    assert good / (after.duration_s - 1.0) >= 0.8 * normal_rate, after.summary(SLO_MS / 1e3)


async def test_inflight_bytes_bound_refuses_with_retry_after(model_repo, tmp_path):
    """A global bound on request bytes held: past it, 429 + Retry-After naming the setting; the
    count returns to zero once the answers are out."""
    repo = tmp_path / "repo"
    shutil.copytree(model_repo / "digits", repo / "digits")
    # loop_lag_shed_ms 0: the test's clients share the gateway's event loop, so a burst of theirs lags
    # it, and the door's 503 would stand in for the 429 this test is about (on a busy box, often)
    settings = Settings(
        repo=repo,
        backend="inprocess",
        http_port=0,
        grpc_port=0,
        max_inflight_bytes=4096,
        loop_lag_shed_ms=0,
        **server_config(fault_delay_ms=200.0),
    )
    gw = Gateway(settings)
    await gw.start()
    try:
        body = v2_body("input", [1.0] * 64, {"slo_ms": 5000})
        assert 400 < len(body) < 1024
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10) as http:
            rs = await asyncio.gather(*[http.post("/v2/models/digits/infer", content=body) for _ in range(24)])
        codes = sorted(r.status_code for r in rs)
        assert set(codes) == {200, 429}, codes
        assert codes.count(200) <= 4096 // len(body)
        for r in rs:
            if r.status_code == 429:
                assert r.headers["retry-after"] and "max_inflight_bytes" in r.json()["error"]
        assert gw.dataplane.inflight.held == 0
    finally:
        await gw.stop()


async def test_a_chunked_body_is_counted_as_it_streams(model_repo, tmp_path):
    """A body without Content-Length holds its bytes against max_inflight_bytes from its first chunk,
    not once it is all in: while one streams slowly, a request that would pass the bound is refused."""
    repo = tmp_path / "repo"
    shutil.copytree(model_repo / "digits", repo / "digits")
    settings = Settings(  # (no door: as above)
        repo=repo, backend="inprocess", http_port=0, grpc_port=0, max_inflight_bytes=4096, loop_lag_shed_ms=0
    )
    gw = Gateway(settings)
    await gw.start()
    try:
        body = v2_body("input", [1.0] * 64, {"slo_ms": 5000})
        gate = asyncio.Event()

        async def slow_chunks():
            yield b" " * 3000  # leading whitespace is valid JSON
            await gate.wait()
            yield body

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gw.http_port}", timeout=10) as http:
            first = asyncio.create_task(http.post("/v2/models/digits/infer", content=slow_chunks()))
            for _ in range(200):
                if gw.dataplane.inflight.held >= 3000:
                    break
                await asyncio.sleep(0.01)
            assert gw.dataplane.inflight.held >= 3000, "the first chunk was not counted while the body streamed"
            second = await http.post("/v2/models/digits/infer", content=b" " * 1200 + body)
            assert second.status_code == 429 and "max_inflight_bytes" in second.json()["error"], second.text
            gate.set()
            assert (await first).status_code == 200
        assert gw.dataplane.inflight.held == 0
    finally:
        await gw.stop()
