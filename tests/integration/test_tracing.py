"""One request followed from the client's ``traceparent`` to the replica's compute, through an OTLP/HTTP
receiver (tests/otlp.py decodes the exporters' protobufs with opentelemetry-proto).

A ``sloserve serve`` is started with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at the receiver; the
in-process backend computes in worker processes (``replica_processes``) and the Ray backend in its Serve
replicas, so the compute span must come from another process. Then:

* the server span continues the client's span; receive, admission, queue and encode/send are its
  children; the batch span links to the request's span and the compute span is the batch's child,
  recorded by a process whose resource says ``sloserve.role=replica`` and another pid;
* a malformed ``traceparent`` starts a new trace and the request is served;
* a refused request's server span carries the error and its reason;
* the latency histogram carries the trace id as an exemplar in the OpenMetrics exposition;
* with the endpoint down the requests are served as fast and the dropped spans are counted;
* the gateway's exporter process exports its records in the gateway's resource, and when it is
  killed the gateway counts the spans it could not hand over and starts another one.
"""

from __future__ import annotations

import json
import socket
import statistics
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess
from tests.otlp import OtlpReceiver, Span

pytestmark = pytest.mark.integration

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
BODY = json.dumps(
    {
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 64], "data": [0.5] * 64}],
        "parameters": {"slo_ms": 2000},
    }
).encode()
SPANS = ("sloserve.receive", "sloserve.admission", "sloserve.queue", "sloserve.encode_send")


def infer(server: ServerProcess, headers: dict[str, str], body: bytes = BODY) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/digits/infer",
        data=body,
        headers={"content-type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def openmetrics(server: ServerProcess) -> str:
    req = urllib.request.Request(
        f"http://{server.http_url}/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        return r.read().decode()


def chain(rx: OtlpReceiver, trace_id: str, client_span: str | None) -> dict[str, Span]:
    """The request's spans by name, once the compute span has arrived; checks how they hang together."""

    def complete(spans: list[Span]) -> bool:
        mine = [s for s in spans if s.trace_id == trace_id]
        names = {s.name for s in mine}
        return names >= {*SPANS, "sloserve.batch", "sloserve.replica.compute"} and any(
            s.name.startswith(("POST ", "inference.")) for s in mine
        )

    spans = [s for s in rx.wait_for(complete, 30) if s.trace_id == trace_id]
    by = {("server" if s.kind == 2 else s.name): s for s in spans}
    server = by["server"]
    if client_span is not None:
        assert server.parent_id == client_span  # the client's span continued
    for name in SPANS:
        assert by[name].parent_id == server.span_id, name
    batch = by["sloserve.batch"]
    assert (trace_id, server.span_id) in batch.links  # linked to its member (and here its parent)
    assert batch.parent_id == server.span_id
    assert batch.attributes["sloserve.model"] == "digits"
    assert batch.attributes["sloserve.batch.size"] >= 1 and batch.attributes["sloserve.variant"]
    assert batch.attributes["sloserve.device_type"]
    assert by["sloserve.queue"].links == [(trace_id, batch.span_id)]
    compute = by["sloserve.replica.compute"]
    assert compute.parent_id == batch.span_id
    assert compute.resource["sloserve.role"] == "replica"
    assert server.resource["sloserve.role"] == "gateway"
    assert compute.resource["process.pid"] != server.resource["process.pid"]  # computed in another process
    assert by["sloserve.admission"].attributes["sloserve.admission.decision"] == "admit"
    return by


def follow_one_request(server: ServerProcess, rx: OtlpReceiver) -> None:
    status, out = infer(server, {"traceparent": TRACEPARENT, "tracestate": "vendor=1"})
    assert status == 200, out
    chain(rx, CLIENT_TRACE, CLIENT_SPAN)

    # gRPC: the context comes in the call's metadata
    grpc_trace = "5bf92f3577b34da6a3ce929d0e0e4736"
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        x = grpcclient.InferInput("input", [1, 64], "FP32")
        x.set_data_from_numpy(np.full((1, 64), 0.5, np.float32))
        c.infer("digits", [x], headers={"traceparent": f"00-{grpc_trace}-{CLIENT_SPAN}-01"})
    by = chain(rx, grpc_trace, CLIENT_SPAN)
    assert by["server"].name == "inference.GRPCInferenceService/ModelInfer"

    # exemplars: the latency histogram names a sampled request's trace
    text = openmetrics(server)
    lines = [
        ln for ln in text.splitlines() if ln.startswith("sloserve_request_duration_seconds_bucket") and "# {" in ln
    ]
    assert lines and any("trace_id=" in ln for ln in lines), text[:2000]
    assert any(CLIENT_TRACE in ln or grpc_trace in ln for ln in lines)


def test_inprocess_workers_follow_a_request_to_the_replica(model_repo):
    with OtlpReceiver() as rx:
        server = ServerProcess(
            model_repo,
            "inprocess",
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint,
                "OTEL_SERVICE_NAME": "sloserve-test",
                "SLOSERVE_REPLICA_PROCESSES": "true",
                "SLOSERVE_INLINE_BELOW_US": "0",
            },
        )
        try:
            server.wait_ready()
            follow_one_request(server, rx)

            # a malformed traceparent: ignored, the request is served in a new trace
            status, _ = infer(server, {"traceparent": "00-not-a-trace-01", "tracestate": "bad key"})
            assert status == 200
            roots = rx.wait_for(
                lambda spans: any(s.kind == 2 and s.parent_id == "" and s.trace_id != CLIENT_TRACE for s in spans), 20
            )
            root = next(s for s in roots if s.kind == 2 and s.parent_id == "")
            assert root.resource["service.name"] == "sloserve-test"

            # an error: the server span's status says why
            bad_trace = "6bf92f3577b34da6a3ce929d0e0e4736"
            bad = BODY.replace(b'"input"', b'"nope"')
            status, _ = infer(server, {"traceparent": f"00-{bad_trace}-{CLIENT_SPAN}-01"}, bad)
            assert status == 400
            spans = rx.wait_for(lambda spans: any(s.trace_id == bad_trace and s.kind == 2 for s in spans), 20)
            (failed,) = [s for s in spans if s.trace_id == bad_trace and s.kind == 2]
            assert failed.status_code == 2 and "nope" in failed.status_message
            assert failed.attributes["sloserve.outcome"] != "ok"
        finally:
            server.stop()


def test_inprocess_threads_record_the_compute_in_the_gateway(model_repo):
    with OtlpReceiver() as rx:
        server = ServerProcess(model_repo, "inprocess", env={"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint})
        try:
            server.wait_ready()
            status, _ = infer(server, {"traceparent": TRACEPARENT})
            assert status == 200
            spans = rx.wait_for(lambda spans: {"sloserve.batch", "sloserve.replica.compute"} <= {s.name for s in spans})
        finally:
            server.stop()
    batch = next(s for s in spans if s.name == "sloserve.batch")
    compute = next(s for s in spans if s.name == "sloserve.replica.compute")
    assert compute.parent_id == batch.span_id and compute.trace_id == CLIENT_TRACE
    assert compute.resource["sloserve.role"] == "gateway"  # no worker process: the gateway computed it


def test_an_endpoint_that_is_down_slows_nothing_and_is_counted(model_repo):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    server = ServerProcess(
        model_repo,
        "inprocess",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{dead}", "OTEL_BSP_MAX_QUEUE_SIZE": "32"},
    )
    try:
        server.wait_ready()
        took = []
        for _ in range(300):
            t0 = time.perf_counter()
            status, _ = infer(server, {"traceparent": TRACEPARENT})
            took.append(time.perf_counter() - t0)
            assert status == 200
        assert statistics.median(took) < 0.05, f"median {statistics.median(took) * 1e3:.1f} ms"
        deadline = time.monotonic() + 30
        dropped = 0.0
        while time.monotonic() < deadline:
            text = openmetrics(server)
            dropped = sum(
                float(ln.rsplit(" ", 1)[1])
                for ln in text.splitlines()
                if ln.startswith("sloserve_trace_spans_dropped_total{")
            )
            if dropped > 0:
                break
            time.sleep(0.5)
        assert dropped > 0
    finally:
        server.stop()


@pytest.mark.slow
def test_ray_replicas_record_their_compute(model_repo):
    with OtlpReceiver() as rx:
        server = ServerProcess(model_repo, "ray", env={"OTEL_EXPORTER_OTLP_ENDPOINT": rx.endpoint})
        try:
            server.wait_ready()
            follow_one_request(server, rx)
        finally:
            server.stop()


def test_the_exporter_process_exports_and_its_death_is_counted(monkeypatch):
    """The gateway's records reach the receiver through the exporter process, in the gateway's resource;
    a killed exporter process costs the gateway nothing but counted spans, and another one starts."""
    import os
    import signal

    from sloserve.gateway import span_export
    from sloserve.gateway.span_export import SpanShipper
    from sloserve.replica.tracing import TraceConfig

    def piece(trace_id: int, n: int) -> tuple:
        return tuple(
            (f"s{i}", 0, trace_id, i + 1, 0, False, time.time_ns(), time.time_ns(), {"i": i}, (), None, None)
            for i in range(n)
        )

    monkeypatch.setattr(span_export, "RESTART_AFTER_S", 0.2)
    with OtlpReceiver() as rx:
        config = TraceConfig(exporter="otlp", endpoint=rx.endpoint + "/v1/traces", schedule_delay_s=0.05)
        shipper = SpanShipper(config, {"service.name": "sloserve-test", "sloserve.role": "gateway", "process.pid": 7})
        try:
            shipper.add(piece(1, 3))
            assert shipper.flush(30)
            got = rx.wait_for(lambda spans: len(spans) == 3, 5)
            assert {s.name for s in got} == {"s0", "s1", "s2"} and got[0].trace_id == f"{1:032x}"
            assert got[0].resource["process.pid"] == 7 and got[0].resource["sloserve.role"] == "gateway"
            first = shipper.exporter_pid
            assert first is not None and first != os.getpid()

            os.kill(first, signal.SIGKILL)
            deadline = time.monotonic() + 20
            while shipper.exporter_pid in (first, None) and time.monotonic() < deadline:
                shipper.add(piece(2, 2))  # the gateway goes on: what no exporter takes is counted
                time.sleep(0.02)
            assert shipper.exporter_pid not in (first, None), "no new exporter process"
            assert shipper.dropped()[1] > 0
            shipper.add(piece(3, 4))
            rx.wait_for(lambda spans: sum(s.trace_id == f"{3:032x}" for s in spans) == 4, 30)
        finally:
            t0 = time.monotonic()
            shipper.close()
            assert time.monotonic() - t0 < 10
