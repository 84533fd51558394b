"""Every replica says which device and ONNX Runtime execution provider it really runs on, in
``sloserve_replica_runtime`` (and in the log at load): on this CPU box, the CPU."""

from __future__ import annotations

import time
import urllib.request

import pytest

from sloserve.loadtests.promtext import samples

pytestmark = pytest.mark.integration


def runtimes(server) -> dict[tuple[str, str, str, str], float]:
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.labels["model"], s.labels["variant"], s.labels["device"], s.labels["provider"]): s.value
        for s in samples(text, "sloserve_replica_runtime")
        if s.value > 0
    }


def test_every_replica_reports_the_cpu_on_a_cpu_host(server):
    deadline = time.monotonic() + 30  # Ray: the counts follow the replicas' channels within a second
    seen = runtimes(server)
    while not {m for m, *_ in seen} >= {"digits", "heavy"} and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = runtimes(server)
    assert {(m, v) for m, v, *_ in seen} >= {("digits", "small"), ("digits", "large"), ("heavy", "small")}, seen
    assert {(d, p) for _, _, d, p in seen} == {("cpu", "CPUExecutionProvider")}, seen
