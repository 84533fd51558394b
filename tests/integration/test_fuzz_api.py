"""Fuzzing a live gateway: schemathesis over its own OpenAPI document, hypothesis over gRPC and
the REST binary extension. Zero 5xx, zero hangs (every call has a timeout), every refusal a 4xx
(or a gRPC client-error code) with a message naming the problem.

CI runs a short pass (~20 s). The longer run documented in docs/reliability.md sets
``SLOSERVE_FUZZ_EXAMPLES`` (examples per operation / per strategy).
"""

from __future__ import annotations

import os
import time

import grpc
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from tritonclient.grpc import service_pb2 as pb

from tests.conftest import ServerProcess
from tests.fuzz.strategies import grpc_request, rest_binary_request

pytestmark = pytest.mark.integration
N = int(os.environ.get("SLOSERVE_FUZZ_EXAMPLES", "15"))
TIMEOUT_S = 15.0
CLIENT_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
}


@pytest.fixture(scope="module")
def fuzz_server(model_repo):
    srv = ServerProcess(model_repo, "inprocess", env={"SLOSERVE_MAX_REQUEST_BYTES": str(1 << 20)}).wait_ready()
    yield srv
    assert srv.proc.poll() is None, "the server died while being fuzzed:\n" + srv.output()
    log = srv.output()
    srv.stop()
    assert "internal error" not in log and "Traceback" not in log, log


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(f"http://{fuzz_server.http_url}/openapi.json")


def error_names_the_problem(ctx, response, case):
    """Every 4xx is ``{"error": "<non-empty message>"}``."""
    if 400 <= response.status_code < 500:
        body = response.json()
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"].strip(), (
            f"{response.status_code} without an error message: {response.text[:200]}"
        )


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_openapi_fuzz(api_schema, mode):
    """Every operation of /openapi.json, bodies and parameters generated from the schema (positive)
    and violating it (negative: wrong types, missing fields, mutated bodies)."""
    ops = [r.ok() for r in api_schema.get_all_operations()]
    assert len(ops) >= 10, [o.label for o in ops]  # every route of gateway/transports/rest.py
    tried = 0
    for op in ops:

        @settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case):
            response = case.call(timeout=TIMEOUT_S)
            case.validate_response(response, checks=[not_a_server_error, error_names_the_problem])

        t0 = time.perf_counter()
        try:
            run()
            tried += 1
        except Unsatisfiable:  # no negative input exists for a GET whose only parameters are strings
            continue
        finally:
            print(f"{mode.value} {op.label}: {time.perf_counter() - t0:.2f} s")
    # negative: at least the two infer operations (their JSON bodies can break the schema)
    assert tried >= (len(ops) if mode is GenerationMode.POSITIVE else 2)


@settings(max_examples=N * 2, deadline=None, suppress_health_check=list(HealthCheck))
@given(rest_binary_request())
def test_rest_binary_fuzz(fuzz_server, req):
    body, header_len = req
    headers = {"Content-Type": "application/octet-stream"}
    if header_len is not None:
        headers["Inference-Header-Content-Length"] = str(header_len)
    r = httpx.post(
        f"http://{fuzz_server.http_url}/v2/models/digits/infer", content=body, headers=headers, timeout=TIMEOUT_S
    )
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.json()["error"].strip()


@pytest.fixture(scope="module")
def infer_call(fuzz_server):
    with grpc.insecure_channel(fuzz_server.grpc_url) as ch:
        yield ch.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda b: b,
            response_deserializer=pb.ModelInferResponse.FromString,
        )


@settings(max_examples=N * 2, deadline=None, suppress_health_check=list(HealthCheck))
@given(grpc_request())
def test_grpc_fuzz(infer_call, req):
    try:
        infer_call(req.SerializeToString(), timeout=TIMEOUT_S)
    except grpc.RpcError as e:
        assert e.code() in CLIENT_ERRORS, (e.code(), e.details())
        assert e.details().strip()


@settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck))
@given(st_bytes := __import__("hypothesis").strategies.binary(max_size=200))
def test_grpc_garbage_bytes(infer_call, st_bytes):
    try:
        infer_call(st_bytes, timeout=TIMEOUT_S)
    except grpc.RpcError as e:
        assert e.code() in CLIENT_ERRORS, (e.code(), e.details())
