"""A request's decoding cost is bounded before any tensor is decoded: the count of inputs, their
names and their declared shapes are checked against the model and the limits first, on every path
(REST JSON, REST binary extension, gRPC raw and typed contents), so thousands of tiny or unknown
inputs cost one parse, never a numpy conversion and a NaN check each."""

from __future__ import annotations

import shutil

import httpx
import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb

import sloserve.gateway.transports.codec as codec
import sloserve.gateway.transports.grpc as grpc_transport
from sloserve.gateway.backends.threads import InProcessBackend
from sloserve.gateway.config import Settings
from sloserve.gateway.dataplane import DataPlane
from sloserve.gateway.errors import InvalidArgument
from sloserve.gateway.transports.codec import InputLimits, decode_rest
from sloserve.gateway.transports.grpc import InferenceServicer, ReceivedInfer, decode_grpc
from sloserve.gateway.transports.rest import create_asgi
from sloserve.gateway.transports.restdecode import RestDecoder
from sloserve.models.repository import ModelRepository
from sloserve.replica.runtime import RuntimeOptions

NAMES = ("a", "b")
LIMITS = InputLimits(max_elements=1000, max_rows=8)
HOSTILE = 18_000  # tiny inputs: about 0.9 MB of JSON


@pytest.fixture
def no_decoding(monkeypatch):
    """Every tensor decoder fails the test if it is reached."""
    calls: list[str] = []

    def spy(name):
        def decode(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} decoded a tensor before the request's inputs were checked")

        return decode

    monkeypatch.setattr(codec, "array_from_json", spy("array_from_json"))
    monkeypatch.setattr(codec, "array_from_binary", spy("array_from_binary"))
    monkeypatch.setattr(grpc_transport, "array_from_binary", spy("array_from_binary"))
    return calls


def _json_input(name: str, shape=(1, 2)) -> dict:
    return {"name": name, "shape": list(shape), "datatype": "FP32", "data": [1] * int(np.prod(shape))}


def _binary(inputs: list[tuple[str, tuple[int, ...]]]) -> tuple[bytes, int]:
    docs = [
        {"name": n, "shape": list(s), "datatype": "FP32", "parameters": {"binary_data_size": 4 * int(np.prod(s))}}
        for n, s in inputs
    ]
    head = orjson.dumps({"inputs": docs})
    return head + b"".join(np.zeros(s, np.float32).tobytes() for _, s in inputs), len(head)


def _grpc(inputs: list[tuple[str, tuple[int, ...]]], raw: bool = True) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m")
    for n, s in inputs:
        t = req.inputs.add(name=n, datatype="FP32", shape=list(s))
        if raw:
            req.raw_input_contents.append(np.zeros(s, np.float32).tobytes())
        else:
            t.contents.fp32_contents.extend([0.0] * int(np.prod(s)))
    return req


# each: the inputs (name, shape), and what the 400 says
CASES = [
    ([(f"x{i}", (1,)) for i in range(HOSTILE)], "the request has 18,000 inputs but model 'm' has 2"),
    ([("a", (1, 2)), ("a", (1, 2))], "input 'a' appears twice"),
    ([("a", (1, 2)), ("zzz", (1, 2))], "model 'm' has no input 'zzz'; inputs: ['a', 'b']"),
    ([("a", (1, 2)), ("b", (1, 2000))], "input 'b' holds 2,000 elements, over the limit of 1,000"),
    ([("a", (1, 2)), ("b", (9, 2))], "input 'b' carries 9 batch rows, over the limit of 8"),
]


@pytest.mark.parametrize("inputs, says", CASES, ids=["many", "twice", "unknown", "elements", "rows"])
def test_every_path_refuses_before_decoding_a_tensor(no_decoding, inputs, says):
    body = orjson.dumps({"inputs": [_json_input(n, s) for n, s in inputs]})
    wire, head_len = _binary(inputs)
    attempts = {
        "REST JSON": lambda: decode_rest(body, None, "m", None, names=NAMES, limits=LIMITS),
        "REST binary": lambda: decode_rest(wire, head_len, "m", None, names=NAMES, limits=LIMITS),
        "gRPC raw": lambda: decode_grpc(_grpc(inputs), None, NAMES, LIMITS),
        "gRPC typed": lambda: decode_grpc(_grpc(inputs, raw=False), None, NAMES, LIMITS),
    }
    for path, attempt in attempts.items():
        with pytest.raises(InvalidArgument) as e:
            attempt()
        assert says in e.value.message, (path, e.value.message)
    assert no_decoding == []


def test_a_request_that_fits_still_decodes():
    body = orjson.dumps({"inputs": [_json_input("b"), _json_input("a")]})
    req = decode_rest(body, None, "m", None, names=NAMES, limits=LIMITS)
    assert sorted(req.inputs) == ["a", "b"] and req.inputs["a"][1].shape == (1, 2)
    got = decode_grpc(_grpc([("a", (1, 2))]), None, NAMES, LIMITS)
    assert got.inputs["a"][1].shape == (1, 2)


# ---- through the served transports: the model's own inputs ------------------------------------------
@pytest.fixture(scope="module")
def plane(model_repo, tmp_path_factory):
    """A data plane over the demo digits model, not started: a request that passes decoding would get 503."""
    root = tmp_path_factory.mktemp("bounds") / "repo"
    shutil.copytree(model_repo / "digits", root / "digits")
    repo = ModelRepository(root).load()
    settings = Settings(repo=root, backend="inprocess", max_request_bytes=4 << 20, max_json_bytes=4 << 20)
    return DataPlane(repo, InProcessBackend(repo, RuntimeOptions(device="cpu")), settings)


def _hostile_body() -> bytes:
    return orjson.dumps({"inputs": [_json_input(str(i), ()) for i in range(HOSTILE)]})


async def test_rest_refuses_a_body_of_many_inputs_before_decoding_them(plane, no_decoding):
    body = _hostile_body()
    assert 800_000 < len(body) < 1 << 20  # decoded on the event loop (under json_offload_bytes)
    assert plane.size_limits.json > len(body)
    app = create_asgi(plane)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000") as c:
        r = await c.post("/v2/models/digits/infer", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert r.json()["error"].startswith("the request has 18,000 inputs but model 'digits' has 1: ['input']")
        wire, head_len = _binary([("nope", (1, 64))])
        r = await c.post(
            "/v2/models/digits/infer",
            content=wire,
            headers={"content-type": "application/octet-stream", "inference-header-content-length": str(head_len)},
        )
        assert r.status_code == 400 and "has no input 'nope'" in r.json()["error"]
    assert no_decoding == []


class _Context:
    def __init__(self):
        self.code = self.details = None

    def invocation_metadata(self):
        return ()

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details

    def set_trailing_metadata(self, md):
        pass


async def test_grpc_refuses_a_request_of_many_inputs_before_decoding_them(plane, no_decoding):
    msg = _grpc([(f"x{i}", (1,)) for i in range(HOSTILE)])
    msg.model_name = "digits"
    ctx = _Context()
    data = msg.SerializeToString()
    received = ReceivedInfer(pb.ModelInferRequest.FromString(data), None, len(data))
    assert await InferenceServicer(plane).ModelInfer(received, ctx) is None
    assert ctx.code.name == "INVALID_ARGUMENT"
    assert ctx.details.startswith("the request has 18,000 inputs but model 'digits' has 1")
    assert no_decoding == []


async def test_the_json_decoding_worker_checks_the_inputs_too():
    """A body of ``json_offload_bytes`` or more decodes in the worker process: the same checks first."""
    decoder = RestDecoder(LIMITS, offload_bytes=1)  # every body goes to the worker
    decoder.start()
    try:
        body = orjson.dumps({"inputs": [_json_input("a"), _json_input("zzz")]})
        with pytest.raises(InvalidArgument, match="model 'm' has no input 'zzz'"):
            await decoder.decode(body, None, "m", None, None, NAMES)
        got = await decoder.decode(orjson.dumps({"inputs": [_json_input("a")]}), None, "m", None, None, NAMES)
        assert got.inputs["a"][1].shape == (1, 2)
    finally:
        decoder.close()
