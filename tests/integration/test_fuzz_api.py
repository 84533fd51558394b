"""Fuzzing a live gateway: schemathesis over every operation of its own OpenAPI document (the
repository API's index, loads and unloads included), hypothesis over every RPC of
inference.GRPCInferenceService (messages built from the protobuf descriptors, and garbage bytes)
and over the REST binary extension. Zero 5xx, zero hangs (every call has a timeout), every refusal
a 4xx (or a gRPC client-error code) with a message naming the problem, and after every test each
model of the repository loads again and is ready.

The server runs in-process over a copy of the demo model repository, with one bearer token that has
the ``infer``, ``metrics`` and ``models`` scopes: every call carries it, so it gets past
authentication to the handlers. The model names in paths and messages are sometimes the served
ones, so loads, unloads and config overrides act on real models. The training API needs the Ray
backend and runs against a server of its own (tests/integration/test_fuzz_training.py).

CI runs a short pass. ``SLOSERVE_FUZZ_EXAMPLES`` (examples per operation / method / strategy)
scales it for the longer run documented in docs/reliability.md. The calls made per operation and
method, and the server errors among them, are printed at the end of the run (tests/fuzz/tally.py;
``SLOSERVE_FUZZ_OUT=path`` also writes them as JSON).
"""

from __future__ import annotations

import os
import shutil
import time

import grpc
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from tritonclient.grpc import service_pb2 as pb

from sloserve.gateway.transports.grpc import NOT_SERVED
from tests.conftest import ServerProcess
from tests.fuzz import tally
from tests.fuzz.strategies import grpc_request, proto_message, rest_binary_request

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
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
}
TOKEN = "fuzz-api-token-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GRPC_AUTH = (("authorization", f"Bearer {TOKEN}"),)
MODELS = ("digits", "heavy", "cnn")  # the demo repository's
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
METHODS = [m.name for m in SERVICE.methods]
IMPLEMENTED = set(METHODS) - set(NOT_SERVED)  # the others answer UNIMPLEMENTED


@pytest.fixture(scope="module")
def fuzz_server(model_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("fuzz") / "repo"  # loads and unloads act on a throwaway copy
    shutil.copytree(model_repo, repo)
    env = {"SLOSERVE_MAX_REQUEST_BYTES": str(1 << 20), "SLOSERVE_AUTH_TOKENS": f"{TOKEN} * infer,metrics,models"}
    srv = ServerProcess(repo, "inprocess", env=env).wait_ready()
    yield srv
    assert srv.proc.poll() is None, "the server died while being fuzzed:\n" + srv.output()
    log = srv.output()
    srv.stop()
    assert "internal error" not in log and "Traceback" not in log, log


def restore_models(srv: ServerProcess) -> None:
    """Loads every model of the repository as its folder has it (undoing fuzzed unloads and config
    overrides) and checks that each is ready."""
    with httpx.Client(base_url=f"http://{srv.http_url}", headers=AUTH, timeout=120) as c:
        for m in MODELS:
            r = c.post(f"/v2/repository/models/{m}/load")
            assert r.status_code == 200, (m, r.status_code, r.text)
            assert c.get(f"/v2/models/{m}/ready").status_code == 200, m


@pytest.fixture(autouse=True)
def models_restored(fuzz_server):
    yield
    assert fuzz_server.proc.poll() is None, "the server died while being fuzzed:\n" + fuzz_server.output()
    restore_models(fuzz_server)


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(f"http://{fuzz_server.http_url}/openapi.json")


REST_OPERATIONS = {
    "POST /v2/repository/index",
    "POST /v2/repository/models/{model}/load",
    "POST /v2/repository/models/{model}/unload",
    "GET /v2/models/stats",
    "GET /v2/models/{model}/stats",
    "GET /v2/models/{model}/versions/{version}/stats",
    "GET /v2/models/{model}/config",
    "GET /v2/models/{model}/versions/{version}/config",
    "GET /v2/health/live",
    "GET /v2/health/ready",
    "GET /v2",
    "GET /v2/models/{model}",
    "GET /v2/models/{model}/versions/{version}",
    "GET /v2/models/{model}/ready",
    "GET /v2/models/{model}/versions/{version}/ready",
    "GET /metrics",
    "POST /v2/models/{model}/infer",
    "POST /v2/models/{model}/versions/{version}/infer",
}


def test_openapi_lists_every_route_with_its_body(api_schema):
    """/openapi.json lists every REST route of the gateway, and every POST with its JSON body's schema
    (the repository API's bodies are optional objects: ``ready``; ``parameters``)."""
    ops = {o.label: o for o in (r.ok() for r in api_schema.get_all_operations())}
    assert set(ops) == REST_OPERATIONS
    for label, op in ops.items():
        if label.startswith("POST"):
            (body,) = [b for b in op.body if b.media_type == "application/json"]
            assert body.definition["schema"]["type"] == "object", label
    load = ops["POST /v2/repository/models/{model}/load"].body[0].definition["schema"]
    assert load["properties"]["parameters"]["properties"]["config"]["type"] == "string"


def error_names_the_problem(ctx, response, case):
    """Every 4xx is ``{"error": "<non-empty message>"}``."""
    if 400 <= response.status_code < 500:
        body = response.json()
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"].strip(), (
            f"{response.status_code} without an error message: {response.text[:200]}"
        )


SERVED_NAME = st.sampled_from([None, None, *MODELS])  # None: the name schemathesis generated
SERVED_VERSION = st.sampled_from([None, "1"])  # the demo models' version


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_openapi_fuzz(api_schema, fuzz_server, mode):
    """Every operation of /openapi.json, bodies and parameters generated from the schema (positive)
    and violating it (negative: wrong types, missing fields, mutated bodies), with the bearer token;
    a model in the path is a served one three times in five, a version the served one half the time.
    After each repository operation the models load again, so the operations after it find them served."""
    ops = [r.ok() for r in api_schema.get_all_operations()]
    assert {o.label for o in ops} == REST_OPERATIONS
    tried = 0
    for op in ops:

        @settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy(generation_mode=mode), name=SERVED_NAME, version=SERVED_VERSION)
        def run(case, name, version):
            path = case.path_parameters or {}
            if name is not None and "model" in path:
                path["model"] = name
            if version is not None and "version" in path:
                path["version"] = version
            response = case.call(headers=AUTH, timeout=TIMEOUT_S)
            tally.rest(case.operation.label, response.status_code)
            case.validate_response(response, checks=[not_a_server_error, error_names_the_problem])

        t0 = time.perf_counter()
        try:
            run()
            tried += 1
        except Unsatisfiable:  # no negative input exists for a GET whose only parameters are strings
            continue
        finally:
            print(f"{mode.value} {op.label}: {time.perf_counter() - t0:.2f} s")
            if op.path.startswith("/v2/repository/"):
                restore_models(fuzz_server)
    # negative: at least the infer and repository operations (their JSON bodies can break the schema)
    assert tried >= (len(ops) if mode is GenerationMode.POSITIVE else 5)


@settings(max_examples=N * 2, deadline=None, suppress_health_check=list(HealthCheck))
@given(rest_binary_request())
def test_rest_binary_fuzz(fuzz_server, req):
    """The REST binary tensor extension: JSON head and raw tensors, with wrong lengths and shapes."""
    body, header_len = req
    headers = {"Content-Type": "application/octet-stream", **AUTH}
    if header_len is not None:
        headers["Inference-Header-Content-Length"] = str(header_len)
    r = httpx.post(
        f"http://{fuzz_server.http_url}/v2/models/digits/infer", content=body, headers=headers, timeout=TIMEOUT_S
    )
    tally.rest("POST /v2/models/{model}/infer (binary)", r.status_code)
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.json()["error"].strip()


@pytest.fixture(scope="module")
def channel(fuzz_server):
    with grpc.insecure_channel(fuzz_server.grpc_url) as ch:
        yield ch


def grpc_call(channel: grpc.Channel, method: str, data: bytes) -> None:
    """One call of ``method`` with ``data`` as its serialized request (a stream of one message for a
    streaming method), counted; its status must be OK or a client error naming the problem (or
    UNIMPLEMENTED for a method the server does not implement), within TIMEOUT_S."""
    path = f"/{SERVICE.full_name}/{method}"
    details = ""
    try:
        if SERVICE.methods_by_name[method].client_streaming:
            for _ in channel.stream_stream(path)(iter([data]), timeout=TIMEOUT_S, metadata=GRPC_AUTH):
                pass
        else:
            channel.unary_unary(path)(data, timeout=TIMEOUT_S, metadata=GRPC_AUTH)
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code, details = e.code(), e.details() or ""
    implemented = method in IMPLEMENTED
    assert not tally.grpc_call(method, code, implemented), (method, code, details)
    if code is not grpc.StatusCode.OK:
        # (a method the server does not implement: UNIMPLEMENTED, or first a malformed message refused)
        expected = CLIENT_ERRORS if implemented else {grpc.StatusCode.UNIMPLEMENTED, *CLIENT_ERRORS}
        assert code in expected and details.strip(), (method, code, details)


@pytest.mark.parametrize("method", METHODS)
def test_grpc_every_method(channel, method):
    """Every RPC of inference.GRPCInferenceService with requests built from its message descriptor:
    random values in every field (served model names among them), nested messages, maps."""

    @settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(msg=proto_message(SERVICE.methods_by_name[method].input_type))
    def run(msg):
        grpc_call(channel, method, msg.SerializeToString())

    run()


@pytest.mark.parametrize("method", METHODS)
def test_grpc_garbage_bytes(channel, method):
    """Every RPC of inference.GRPCInferenceService with random bytes as its request message."""

    @settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.binary(max_size=200))
    def run(data):
        grpc_call(channel, method, data)

    run()


@settings(max_examples=N * 2, deadline=None, suppress_health_check=list(HealthCheck))
@given(grpc_request())
def test_grpc_fuzz(channel, req):
    """ModelInfer with hostile tensors: raw and typed contents, wrong byte counts, shapes, datatypes."""
    grpc_call(channel, "ModelInfer", req.SerializeToString())
