"""V2 REST codec: JSON (flat/nested), binary extension, and every client mistake as a 400."""

import json
import struct

import numpy as np
import orjson
import pytest

from sloserve.gateway.errors import InvalidArgument
from sloserve.gateway.transports.codec import decode_rest, encode_rest
from sloserve.gateway.transports.status import http_status
from sloserve.gateway.types import InferResponse, RequestedOutput


def body(inputs, **extra):
    return json.dumps({"inputs": inputs, **extra}).encode()


def test_flat_and_nested_json_agree():
    flat = decode_rest(
        body([{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]}]), None, "m", None
    )
    nested = decode_rest(
        body([{"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [[1, 2, 3], [4, 5, 6]]}]), None, "m", None
    )
    a, b = flat.inputs["x"][1], nested.inputs["x"][1]
    assert a.dtype == np.float32 and a.shape == (2, 3)
    np.testing.assert_array_equal(a, b)


def test_binary_extension_roundtrip():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.array([7, 8], dtype=np.int64)
    head = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}},
                {"name": "y", "shape": [2], "datatype": "INT64", "data": [7, 8]},
            ],
            "parameters": {"binary_data_output": True, "slo_ms": 15, "priority": 2},
        }
    ).encode()
    req = decode_rest(head + x.tobytes(), len(head), "m", "1")
    np.testing.assert_array_equal(req.inputs["x"][1], x)
    np.testing.assert_array_equal(req.inputs["y"][1], y)
    assert req.binary_output and req.params.slo_ms == 15 and req.params.priority == 2


def test_bytes_binary():
    raw = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b""))
    head = json.dumps(
        {"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}]}
    ).encode()
    req = decode_rest(head + raw, len(head), "m", None)
    assert list(req.inputs["s"][1]) == [b"ab", b""]


@pytest.mark.parametrize(
    "raw, needle",
    [
        (b"{not json", "malformed JSON"),
        (b"[]", "JSON object"),
        (b'{"inputs": []}', "non-empty 'inputs'"),
        (body([{"name": "x", "shape": [2], "datatype": "FP32", "data": [1]}]), "needs 2 elements"),
        (body([{"name": "x", "shape": [2], "datatype": "FP99", "data": [1, 2]}]), "unknown datatype"),
        (body([{"name": "x", "shape": [2], "datatype": ["FP32"], "data": [1, 2]}]), "unknown datatype"),  # fuzz find
        (body([{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]), "non-negative"),
        (body([{"name": "x", "shape": "2", "datatype": "FP32", "data": [1]}]), "'shape' must be a list"),
        (body([{"name": "x", "shape": [2], "datatype": "FP32", "data": ["a", "b"]}]), "string values"),
        (body([{"name": "x", "shape": [2], "datatype": "INT8", "data": [1, 300]}]), "out of range"),
        (body([{"name": "x", "shape": [2], "datatype": "INT32", "data": [1.5, 2]}]), "floating-point values"),
        (body([{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3]]}]), "ragged"),
        (body([{"name": "x", "shape": [1 << 20, 1 << 20], "datatype": "FP32", "data": [1]}]), "elements"),
        (body([{"name": "x", "shape": [1], "datatype": "FP32"}]), "neither 'data'"),
        (body([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}] * 2), "twice"),
        (body([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], parameters={"slo_ms": -1}), "slo_ms"),
        (
            body([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], parameters={"min_accuracy": 2}),
            "min_accuracy",
        ),
        (
            body([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], parameters={"priority": "hi"}),
            "priority",
        ),
        (body([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], parameters={"variant": 3}), "variant"),
        (
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [99999999999999999999999]}]}',
            "datatype is INT64",
        ),
        (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [NaN]}]}', "malformed JSON"),
    ],
)
def test_client_mistakes_are_400_with_a_reason(raw, needle):
    with pytest.raises(InvalidArgument) as e:
        decode_rest(raw, None, "m", None)
    assert needle in e.value.message and http_status(e.value) == 400


def test_binary_size_mismatch_and_header_length():
    head = json.dumps(
        {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}
    ).encode()
    with pytest.raises(InvalidArgument, match="needs 8"):
        decode_rest(head + b"\0" * 4, len(head), "m", None)
    with pytest.raises(InvalidArgument, match="runs past"):
        decode_rest(head + b"\0" * 2, len(head), "m", None)
    with pytest.raises(InvalidArgument, match="Inference-Header-Content-Length"):
        decode_rest(head, len(head) + 10, "m", None)
    with pytest.raises(InvalidArgument, match="unused"):
        good = json.dumps(
            {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}]}
        ).encode()
        decode_rest(good + b"\0" * 8, len(good), "m", None)


def test_deep_nesting_is_a_400_not_a_crash():
    deep = (
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": '
        + b"[" * 5000
        + b"1"
        + b"]" * 5000
        + b"}]}"
    )
    with pytest.raises(InvalidArgument):
        decode_rest(deep, None, "m", None)


def test_headers_mirror_parameters_body_wins():
    raw = body([{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], parameters={"slo_ms": 9})
    req = decode_rest(raw, None, "m", None, {"x-slo-ms": "30", "x-variant": "small"})
    assert req.params.slo_ms == 9 and req.params.variant == "small"


def test_encode_json_and_binary():
    probs = np.array([[0.25, 0.75]], np.float32)
    label = np.array([1], np.int64)
    resp = InferResponse("m", "1", {"probs": probs, "label": label}, id="r1", parameters={"variant": "large"})
    js, hl = encode_rest(resp)
    assert hl is None
    doc = orjson.loads(js)
    assert doc["outputs"][0]["data"] == [0.25, 0.75] and doc["outputs"][1]["data"] == [1]
    assert doc["id"] == "r1" and doc["parameters"]["variant"] == "large"
    resp.requested = [RequestedOutput("probs", True), RequestedOutput("label", False)]
    raw, hl = encode_rest(resp)
    head = orjson.loads(raw[:hl])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 8
    np.testing.assert_array_equal(np.frombuffer(raw[hl:], np.float32), probs.ravel())


def test_uint64_takes_json_booleans_and_integers_without_overflow():
    """Found by the codec fuzz: a boolean array's extreme against uint64's max raised OverflowError
    (a 500) instead of being range-checked as the integers 0 and 1."""
    from sloserve.gateway.transports.codec import array_from_json

    assert array_from_json(False, "UINT64", (), "input 'x'").tolist() == 0
    assert array_from_json([True, False], "UINT64", (2,), "input 'x'").tolist() == [1, 0]
    assert array_from_json([2**64 - 1], "UINT64", (1,), "input 'x'").tolist() == [2**64 - 1]
    with pytest.raises(InvalidArgument, match=r"out of range for UINT64"):
        array_from_json([-1], "UINT64", (1,), "input 'x'")
    with pytest.raises(InvalidArgument, match=r"out of range for INT64"):
        array_from_json([2**63], "INT64", (1,), "input 'x'")


def test_grpc_bytes_outputs_are_length_prefixed_elements_not_pointers():
    """A BYTES output (object or string array) goes into ``raw_output_contents`` as tritonclient
    decodes it: 4-byte little-endian lengths before each element (before: the array's memory, which
    for an object array is pointers)."""
    from tritonclient.grpc import InferResult

    from sloserve.gateway.transports.grpc import encode_response

    words = np.array([[b"seven"], ["eight"]], dtype=object)
    resp = InferResponse(model="m", version="1", outputs={"label": words, "p": np.array([[0.5], [0.25]], np.float32)})
    out = encode_response(resp)
    assert out.raw_output_contents[0] == struct.pack("<I", 5) + b"seven" + struct.pack("<I", 5) + b"eight"
    decoded = InferResult(out)
    assert decoded.as_numpy("label").tolist() == [[b"seven"], [b"eight"]]
    assert decoded.as_numpy("p").tolist() == [[0.5], [0.25]]


def _config(shape, datatype="FP32", max_batch=64):
    from sloserve.models.repository import ModelConfig

    return ModelConfig(
        name="m",
        inputs=[{"name": "x", "datatype": datatype, "shape": shape}],
        outputs=[{"name": "y", "datatype": "FP32", "shape": [10]}],
        max_batch_size=max_batch,
        variants=[{"name": "v", "accuracy": 0.9, "cost_flops": 1.0}],
    )


def test_size_limits_are_what_the_largest_servable_request_needs():
    from sloserve.gateway.config import Settings
    from sloserve.gateway.limits import MAX_BODY_BYTES, REQUEST_HEADROOM_BYTES, size_limits

    s = Settings()
    digits, heavy = _config([64]), _config([1024])
    assert digits.max_request_elements() == 64 * 64
    got = size_limits(s, [digits, heavy])
    assert got.body == got.json == 64 * 1024 * 32 + REQUEST_HEADROOM_BYTES  # heavy's 64 rows in JSON text
    assert got.grpc == 64 * 1024 * 10 + REQUEST_HEADROOM_BYTES
    # fewer rows per request (max_batch_rows) -> smaller bounds
    assert size_limits(Settings(max_batch_rows=8), [heavy]).grpc == 8 * 1024 * 10 + REQUEST_HEADROOM_BYTES
    # no bound from a model with a variable dimension or BYTES: the caps
    assert _config([-1]).max_request_elements() is None and _config([1], "BYTES").max_request_elements() is None
    assert size_limits(s, [digits, _config([-1])]).grpc == MAX_BODY_BYTES
    assert size_limits(s, []).body == MAX_BODY_BYTES
    # a huge fixed shape is capped too
    assert size_limits(s, [_config([1 << 24])]).body == MAX_BODY_BYTES
    # settings win when given
    got = size_limits(Settings(max_request_bytes=4096, max_json_bytes=2048), [heavy])
    assert (got.body, got.json, got.grpc) == (4096, 2048, 4096)
