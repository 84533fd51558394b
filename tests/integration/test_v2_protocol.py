"""The foundation's protocol suite, driven by NVIDIA's tritonclient exactly as users drive Triton."""

import asyncio
import json
import urllib.error
import urllib.request

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from sloserve.loadtests.promtext import families
from sloserve.models.repository import ModelConfig
from tests.integration.conftest import BACKENDS

pytestmark = pytest.mark.integration
RNG = np.random.default_rng(0)


@pytest.fixture(params=BACKENDS)  # two gateway workers: tests/integration/test_workers*.py
def server(request, servers):
    return servers(request.param)


def reference(model_repo, model, variant, x):
    sess = ort.InferenceSession(str(model_repo / model / variant / "model.onnx"), providers=["CPUExecutionProvider"])
    probs, label = sess.run(["probs", "label"], {"input": x})
    return probs, label


def config(model_repo, model="digits") -> ModelConfig:
    """The model's config as built here: the build measures each variant's accuracy on this box (for
    digits, large or medium may come out on top), so expectations are read from it."""
    return ModelConfig.model_validate_json((model_repo / model / "config.json").read_text())


def as_accurate_as_best(model_repo, model="digits") -> tuple[float, set[str]]:
    """The accuracy of the model's default variant (the most accurate; ties: the cheaper), and the
    variants that reach it (it, and any tie)."""
    cfg = config(model_repo, model)
    top = cfg.variant(cfg.best_variant).accuracy
    return top, {v.name for v in cfg.variants if v.accuracy >= top}


def digits_input(n=1):
    return (RNG.random((n, 64)) * 16).astype(np.float32)


def http_inputs(x, binary=True):
    i = httpclient.InferInput("input", list(x.shape), "FP32")
    i.set_data_from_numpy(x, binary_data=binary)
    return [i]


def grpc_inputs(x):
    i = grpcclient.InferInput("input", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return [i]


def raw_post(server, path, body: bytes, headers=None):
    headers = {"Content-Type": "application/json", **(headers or {})}  # urllib would say a form otherwise
    req = urllib.request.Request(f"http://{server.http_url}{path}", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def test_health_and_metadata_http(server):
    c = httpclient.InferenceServerClient(server.http_url)
    assert c.is_server_live() and c.is_server_ready()
    assert c.get_server_metadata()["name"] == "sloserve"
    for model in ("digits", "heavy"):
        assert c.is_model_ready(model) and c.is_model_ready(model, "1")
        md = c.get_model_metadata(model)
        assert md["inputs"][0]["name"] == "input" and md["inputs"][0]["shape"][0] == -1
        assert {v["name"] for v in md["parameters"]["variants"]} == {"small", "medium", "large"}
        assert c.get_model_metadata(model, "1")["name"] == model


def test_health_and_metadata_grpc(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    assert c.is_server_live() and c.is_server_ready()
    assert c.get_server_metadata().name == "sloserve"
    md = c.get_model_metadata("heavy")
    assert md.inputs[0].shape == [-1, 1024] and md.outputs[1].datatype == "INT64"
    assert c.is_model_ready("digits", "1")


@pytest.mark.parametrize("binary", [True, False])
def test_http_infer_json_and_binary(server, model_repo, binary):
    c = httpclient.InferenceServerClient(server.http_url)
    x = digits_input(3)
    outs = [
        httpclient.InferRequestedOutput("probs", binary_data=binary),
        httpclient.InferRequestedOutput("label", binary_data=binary),
    ]
    r = c.infer("digits", http_inputs(x, binary), outputs=outs, parameters={"variant": "medium"})
    probs, label = reference(model_repo, "digits", "medium", x)
    np.testing.assert_allclose(r.as_numpy("probs"), probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(r.as_numpy("label"), label)
    params = r.get_response()["parameters"]
    assert params["variant"] == "medium" and params["batch_size"] >= 3
    assert params["queue_ms"] >= 0 and params["compute_ms"] > 0


def test_http_default_outputs_are_binary(server, model_repo):
    """tritonclient asks for binary_data_output when no outputs are named."""
    c = httpclient.InferenceServerClient(server.http_url)
    x = (RNG.random((2, 1024)) * 16).astype(np.float32)
    i = httpclient.InferInput("input", [2, 1024], "FP32")
    i.set_data_from_numpy(x)
    r = c.infer("heavy", [i], parameters={"slo_ms": 500})
    served = r.get_response()["parameters"]["variant"]  # the slo policy may degrade under load
    probs, label = reference(model_repo, "heavy", served, x)
    np.testing.assert_allclose(r.as_numpy("probs"), probs, rtol=1e-4, atol=1e-5)
    assert r.as_numpy("label").dtype == np.int64


def _rows_json(rows: int, width: int) -> dict:
    data = [-1.2345678e-05] * (rows * width)
    return {"inputs": [{"name": "input", "shape": [rows, width], "datatype": "FP32", "data": data}]}


def test_grpc_message_over_the_largest_servable_request_is_refused_by_grpc(server):
    """gRPC refuses a message bigger than any served model accepts before the gateway reads it; the
    largest one a model accepts goes through."""
    c = grpcclient.InferenceServerClient(server.grpc_url)
    for rows, ok in ((64, True), (256, False)):
        i = grpcclient.InferInput("input", [rows, 1024], "FP32")
        i.set_data_from_numpy(np.ones((rows, 1024), np.float32))
        if ok:
            assert c.infer("heavy", [i]).as_numpy("probs").shape[0] == rows
        else:
            with pytest.raises(InferenceServerException) as e:
                c.infer("heavy", [i])
            assert "RESOURCE_EXHAUSTED" in str(e.value.status()) or "larger than max" in str(e.value), e.value


def test_grpc_infer(server, model_repo):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    x = digits_input(2)
    # min_accuracy at the best variant's own (measured by the build, so it differs by box): only the
    # best variant (or a tie) may serve, whatever load the shared server saw before
    top, reaching = as_accurate_as_best(model_repo)
    r = c.infer(
        "digits", grpc_inputs(x), priority=3, parameters={"slo_ms": 50.0, "min_accuracy": top}, request_id="abc"
    )
    resp = r.get_response()
    served = resp.parameters["variant"].string_param
    assert resp.id == "abc" and served in reaching, (served, reaching)
    probs, label = reference(model_repo, "digits", served, x)
    np.testing.assert_allclose(r.as_numpy("probs"), probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(r.as_numpy("label"), label)
    assert resp.parameters["batch_size"].int64_param >= 2


async def test_http_aio_and_grpc_aio(server, model_repo):
    """Each answer is checked against the variant that served it, as the response names it: an unpinned
    request gets the best variant at light load, but the first one after another test's burst may
    still get the level that burst raised (the slo policy lowers it only after restore_hold_s calm)."""
    x = digits_input(1)
    variants = {v.name for v in config(model_repo).variants}
    hc = httpaio.InferenceServerClient(server.http_url)
    try:
        i = httpaio.InferInput("input", [1, 64], "FP32")
        i.set_data_from_numpy(x)
        r = await hc.infer("digits", [i])
        served = r.get_response()["parameters"]["variant"]
        assert served in variants, served
        probs, _ = reference(model_repo, "digits", served, x)
        np.testing.assert_allclose(r.as_numpy("probs"), probs, rtol=1e-5, atol=1e-6)
        assert await hc.is_model_ready("digits")
    finally:
        await hc.close()
    gc = grpcaio.InferenceServerClient(server.grpc_url)
    try:
        i = grpcaio.InferInput("input", [1, 64], "FP32")
        i.set_data_from_numpy(x)
        r = await gc.infer("digits", [i])
        served = r.get_response().parameters["variant"].string_param
        assert served in variants, served
        probs, _ = reference(model_repo, "digits", served, x)
        np.testing.assert_allclose(r.as_numpy("probs"), probs, rtol=1e-5, atol=1e-6)
    finally:
        await gc.close()


async def test_64_concurrent_distinct_requests_each_get_their_own_answer(server, model_repo):
    """A burst of 64: each request must get its own rows back (a loose SLO: this checks routing).
    Each answer is checked against the variant that served it, as the response names it: under a
    burst the slo policy may legitimately degrade some requests to a cheaper variant."""
    xs = [digits_input(1 + k % 3) for k in range(64)]
    hc = httpaio.InferenceServerClient(server.http_url)
    gc = grpcaio.InferenceServerClient(server.grpc_url)

    async def one(k):
        x = xs[k]
        if k % 2:
            i = httpaio.InferInput("input", list(x.shape), "FP32")
            i.set_data_from_numpy(x, binary_data=bool(k % 4 == 1))
            r = await hc.infer("digits", [i], parameters={"slo_ms": 10000})
            served = r.get_response()["parameters"]["variant"]
        else:
            i = grpcaio.InferInput("input", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            r = await gc.infer("digits", [i], parameters={"slo_ms": 10000})
            served = r.get_response().parameters["variant"].string_param
        return r.as_numpy("probs"), r.as_numpy("label"), served

    try:
        results = await asyncio.gather(*(one(k) for k in range(64)))
    finally:
        await hc.close()
        await gc.close()
    for x, (probs, label, served) in zip(xs, results, strict=True):
        assert served in ("small", "medium", "large")
        rp, rl = reference(model_repo, "digits", served, x)
        np.testing.assert_allclose(probs, rp, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(label, rl)


BAD_HTTP = [
    # (path, body, expected status, message fragment)
    (
        "/v2/models/nope/infer",
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}]},
        404,
        "unknown model 'nope'",
    ),
    (
        "/v2/models/digits/versions/7/infer",
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}]},
        404,
        "no version '7'",
    ),
    (
        "/v2/models/digits/infer",
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "INT32", "data": [0] * 64}]},
        400,
        "expects FP32",
    ),
    (
        "/v2/models/digits/infer",
        {"inputs": [{"name": "input", "shape": [1, 63], "datatype": "FP32", "data": [0] * 63}]},
        400,
        "expects [-1, 64]",
    ),
    (
        "/v2/models/digits/infer",
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0] * 60}]},
        400,
        "needs 64 elements",
    ),
    (
        "/v2/models/digits/infer",
        {"inputs": [{"name": "other", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}]},
        400,
        "no input 'other'",
    ),
    (
        "/v2/models/digits/infer",
        {"inputs": [{"name": "input", "shape": [65, 64], "datatype": "FP32", "data": [0] * 65 * 64}]},
        400,
        "max_batch_size 64",
    ),
    (
        "/v2/models/digits/infer",
        {
            "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}],
            "parameters": {"variant": "huge"},
        },
        400,
        "unknown variant 'huge'",
    ),
    (
        "/v2/models/digits/infer",
        {
            "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}],
            "outputs": [{"name": "logits"}],
        },
        400,
        "no output 'logits'",
    ),
]


@pytest.mark.parametrize("path, doc, status, fragment", BAD_HTTP)
def test_http_errors(server, path, doc, status, fragment):
    code, body, _ = raw_post(server, path, json.dumps(doc).encode())
    assert code == status, body
    assert fragment in json.loads(body)["error"]


def test_http_min_accuracy_errors(server, model_repo):
    """A min_accuracy no variant reaches, and one above the pinned variant's: both 400. The accuracies
    are the build's (they differ by box), so the thresholds are read from the model's config."""
    cfg = config(model_repo)
    ranked = cfg.variants_by_accuracy
    top, worst = ranked[0], ranked[-1]
    assert top.accuracy < 1.0 and worst.accuracy < top.accuracy, ranked  # the demo digits model's spread
    x = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0] * 64}]}
    for params, fragment in (
        ({"min_accuracy": (top.accuracy + 1.0) / 2}, "no variant of 'digits' reaches"),
        ({"variant": worst.name, "min_accuracy": top.accuracy}, "below the min_accuracy"),
    ):
        doc = json.dumps({**x, "parameters": params}).encode()
        code, body, _ = raw_post(server, "/v2/models/digits/infer", doc, {"Content-Type": "application/json"})
        assert code == 400, body
        assert fragment in json.loads(body)["error"], body


def test_http_malformed_and_oversized(server):
    code, body, _ = raw_post(server, "/v2/models/digits/infer", b"{oops")
    assert code == 400 and "malformed JSON" in json.loads(body)["error"]
    code, body, _ = raw_post(server, "/v2/models/digits/infer", b'{"inputs": 5}')
    assert code == 400 and "inputs" in json.loads(body)["error"]
    code, body, _ = raw_post(server, "/v2/models/digits/infer", b"{}", {"Inference-Header-Content-Length": "abc"})
    assert code == 400
    # The 413 comes from the headers alone, before the body is read. The default limit is what the
    # largest request the served models accept takes (heavy: 64 rows of 1,024 numbers in JSON, ~2 MiB).
    import socket

    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/digits/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n{"
            % (3 * 1024 * 1024)
        )
        reply = b""
        while b"max_request_bytes" not in reply:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 413") and "max_request_bytes" in reply
    code, body, _ = raw_post(server, "/v2/models/heavy/infer", json.dumps(_rows_json(64, 1024)).encode())
    assert code == 200, body  # the largest request heavy accepts, in JSON, is within it
    code, body, _ = raw_post(server, "/v2/nowhere", b"{}")
    assert code == 404 and "error" in json.loads(body)


def test_http_errors_through_tritonclient(server):
    c = httpclient.InferenceServerClient(server.http_url)
    x = digits_input(1)
    with pytest.raises(InferenceServerException, match="unknown model"):
        c.infer("nope", http_inputs(x))
    with pytest.raises(InferenceServerException, match="unknown variant"):
        c.infer("digits", http_inputs(x), parameters={"variant": "xl"})
    assert not c.is_model_ready("nope")


@pytest.mark.parametrize(
    "model, x, kwargs, code, fragment",
    [
        ("nope", np.zeros((1, 64), np.float32), {}, "StatusCode.NOT_FOUND", "unknown model"),
        ("digits", np.zeros((1, 64), np.float32), {"model_version": "9"}, "StatusCode.NOT_FOUND", "no version"),
        ("digits", np.zeros((1, 32), np.float32), {}, "StatusCode.INVALID_ARGUMENT", "expects [-1, 64]"),
        ("digits", np.zeros((1, 64), np.float64), {}, "StatusCode.INVALID_ARGUMENT", "expects FP32"),
        ("digits", np.zeros((70, 64), np.float32), {}, "StatusCode.INVALID_ARGUMENT", "max_batch_size"),
        (
            "digits",
            np.zeros((1, 64), np.float32),
            {"parameters": {"variant": "xl"}},
            "StatusCode.INVALID_ARGUMENT",
            "unknown variant",
        ),
    ],
)
def test_grpc_errors(server, model, x, kwargs, code, fragment):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    dt = {np.float32: "FP32", np.float64: "FP64"}[x.dtype.type]
    i = grpcclient.InferInput("input", list(x.shape), dt)
    i.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as e:
        c.infer(model, [i], **kwargs)
    assert e.value.status() == code and fragment in e.value.message()


def _typed_with_param(r, key, value):
    r.inputs.add(name="input", datatype="FP32", shape=[1, 64]).contents.fp32_contents.extend([1.0] * 64)
    r.parameters[key].string_param = value


def grpc_stub(server):
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))


@pytest.mark.parametrize(
    "build, fragment",
    [
        (
            lambda r: (
                r.inputs.add(name="input", datatype="FP32", shape=[1, 64]),
                r.raw_input_contents.append(b"\0" * 100),
            ),
            "needs 256",
        ),
        (lambda r: (r.inputs.add(name="input", datatype="FP32", shape=[1, 64]),), "needs 64 elements"),
        (
            lambda r: (
                r.inputs.add(name="input", datatype="FP32", shape=[1, 64]),
                r.inputs.add(name="x", datatype="FP32", shape=[1]),
                r.raw_input_contents.append(b"\0" * 256),
            ),
            "2 inputs",
        ),
        (lambda r: _typed_with_param(r, "priority", "high"), "priority"),
        (lambda r: _typed_with_param(r, "slo_ms", "soon"), "slo_ms"),
        (lambda r: None, "at least one input"),
    ],
)
def test_grpc_wire_mistakes(server, build, fragment):
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    req = pb.ModelInferRequest(model_name="digits")
    build(req)
    with pytest.raises(grpc.RpcError) as e:
        grpc_stub(server).ModelInfer(req, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in e.value.details()


def test_grpc_typed_contents(server, model_repo):
    from tritonclient.grpc import service_pb2 as pb

    x = digits_input(1)
    req = pb.ModelInferRequest(model_name="digits")
    req.inputs.add(name="input", datatype="FP32", shape=[1, 64]).contents.fp32_contents.extend(x.ravel().tolist())
    req.parameters["variant"].string_param = "small"
    req.parameters["slo_ms"].double_param = 100.0
    resp = grpc_stub(server).ModelInfer(req, timeout=10)
    probs = np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(1, 10)
    np.testing.assert_allclose(probs, reference(model_repo, "digits", "small", x)[0], rtol=1e-5, atol=1e-6)
    assert resp.parameters["variant"].string_param == "small"


def test_metrics_endpoint(server):
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as r:
        names = families(r.read().decode())  # prometheus_client's parser reads the whole page
    assert {"sloserve_requests", "sloserve_batch_rows", "sloserve_replica_runtime"} <= names
