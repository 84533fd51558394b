"""Property fuzzing of the tensor decoders, in process: every input decodes or is a named 400.

`SLOSERVE_FUZZ_EXAMPLES` raises the example count for the longer documented run
(docs/reliability.md); CI keeps the default, a few seconds in all.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from sloserve.gateway.errors import InvalidArgument
from sloserve.gateway.transports.codec import InputLimits, decode_rest
from sloserve.gateway.transports.grpc import decode_grpc, parse_infer
from sloserve.gateway.transports.status import http_status
from tests.fuzz.strategies import (
    grpc_request,
    nested,
    rest_binary_request,
    rest_json_request,
)

N = int(os.environ.get("SLOSERVE_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
LIMITS = InputLimits(max_elements=1 << 20, max_rows=64, allow_nonfinite=False)


def _decode_or_400(fn, *args) -> None:
    """The decoder returns a request that passes or fails the limits with a 400, nothing else."""
    try:
        req = fn(*args)
        LIMITS.check(req)
    except InvalidArgument as e:
        assert http_status(e) == 400 and e.message.strip(), e
        return
    for _name, (_dt, arr) in req.inputs.items():
        assert isinstance(arr, np.ndarray)
        assert arr.size <= LIMITS.max_elements
        if arr.dtype.kind == "f":
            assert np.isfinite(arr).all()


@FUZZ
@given(rest_binary_request(), st.sampled_from(["digits", "heavy"]))
def test_rest_binary_never_crashes(req, model):
    body, header_len = req
    _decode_or_400(decode_rest, body, header_len, model, None)


@FUZZ
@given(rest_json_request())
def test_rest_json_never_crashes(body):
    _decode_or_400(decode_rest, body, None, "digits", None)


@FUZZ
@given(st.binary(max_size=300), st.one_of(st.none(), st.integers(-(2**63), 2**63)))
def test_rest_random_bytes_never_crash(body, header_len):
    _decode_or_400(decode_rest, body, header_len, "digits", None)


@FUZZ
@given(grpc_request())
def test_grpc_never_crashes(req):
    _decode_or_400(decode_grpc, req)


@FUZZ
@given(st.binary(max_size=300))
def test_grpc_random_bytes_are_a_decode_error_or_a_400(data):
    """Garbage protobuf either fails to parse (the server's guard answers INVALID_ARGUMENT) or decodes."""
    from google.protobuf.message import DecodeError

    try:
        req = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        return
    _decode_or_400(decode_grpc, req)


def _outcome(fn, *args):
    """What decoding gives: the inputs as (datatype, dtype, shape, bytes), or the 400's message."""
    try:
        req = fn(*args)
    except InvalidArgument as e:
        return ("400", e.message)
    return sorted((k, dt, str(a.dtype), a.shape, _content(a)) for k, (dt, a) in req.inputs.items())


def _content(a: np.ndarray) -> object:
    """An array's values: BYTES tensors are object arrays, whose raw bytes are pointers."""
    return a.tolist() if a.dtype == object else a.tobytes()


@FUZZ
@given(grpc_request())
def test_grpc_zero_copy_parse_decodes_as_protobuf_does(req):
    """ModelInfer's own parser (raw tensors left as views of the received bytes) decodes every
    request to exactly what the protobuf parser's message decodes to."""
    data = req.SerializeToString()
    got = parse_infer(data)
    assert got.nbytes == len(data) and got.model_name == req.model_name
    assert _outcome(decode_grpc, got.msg, got.raw) == _outcome(decode_grpc, pb.ModelInferRequest.FromString(data))


@FUZZ
@given(st.binary(max_size=300))
def test_grpc_zero_copy_parse_of_garbage_fails_or_agrees(data):
    from google.protobuf.message import DecodeError

    try:
        expected = _outcome(decode_grpc, pb.ModelInferRequest.FromString(data))
    except DecodeError:
        with pytest.raises(DecodeError):
            parse_infer(data)
        return
    got = parse_infer(data)
    assert _outcome(decode_grpc, got.msg, got.raw) == expected


def test_grpc_zero_copy_parse_keeps_tensors_as_views_of_the_message():
    g = pb.ModelInferRequest(model_name="digits", id="r1")
    g.inputs.add(name="a", datatype="FP32", shape=[2, 2])
    g.inputs.add(name="b", datatype="INT64", shape=[3])
    g.raw_input_contents.extend([np.arange(4, dtype=np.float32).tobytes(), np.arange(3, dtype=np.int64).tobytes()])
    g.parameters["slo_ms"].double_param = 25.0
    data = g.SerializeToString()
    got = parse_infer(data)
    assert got.raw is not None and [v.obj is data for v in got.raw] == [True, True]
    req = decode_grpc(got.msg, got.raw)
    assert req.id == "r1" and req.params.slo_ms == 25.0
    assert req.inputs["a"][1].tolist() == [[0, 1], [2, 3]] and req.inputs["b"][1].tolist() == [0, 1, 2]


# ---- hostile cases by name, pinned ----------------------------------------------------------------
def _json(inputs) -> bytes:
    import orjson

    return orjson.dumps({"inputs": inputs})


@pytest.mark.parametrize(
    "body, needle",
    [
        (b'{"inputs": [{"name": "input", "shape": [1, 1], "datatype": "FP32", "data": [NaN]}]}', "malformed JSON"),
        (b'{"inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [1e400]}]}', "malformed JSON"),
        (_json([{"name": "input", "shape": [1], "datatype": "FP32", "data": [1e39]}]), "non-finite"),
        (_json([{"name": "input", "shape": [1], "datatype": "INT64", "data": [2**63]}]), "out of range"),
        (b'{"inputs": [{"name": "input", "shape": [1], "datatype": "INT64", "data": [' + b"9" * 400 + b"]}]}", None),
        (_json([{"name": "input", "shape": [0, 2**63 - 1], "datatype": "FP32", "data": []}]), "over"),
        (_json([{"name": "input", "shape": [2**62, 4], "datatype": "FP32", "data": [1.0]}]), "over"),
        (_json([{"name": "input", "shape": [-1], "datatype": "FP32", "data": [1.0]}]), "non-negative"),
        (_json([{"name": "input", "shape": [1], "datatype": "FP32", "data": nested(200)}]), None),
        (b"[" * 5000 + b"]" * 5000, "malformed JSON"),
        (_json([{"name": "input", "shape": [1], "datatype": "FP32", "data": ["1.0"]}]), "datatype is FP32"),
        (_json([{"name": "input", "shape": [2], "datatype": "BOOL", "data": [1.5, 2]}]), "datatype is BOOL"),
    ],
)
def test_named_cases_are_400_naming_the_problem(body, needle):
    with pytest.raises(InvalidArgument) as ei:
        LIMITS.check(decode_rest(body, None, "digits", None))
    assert http_status(ei.value) == 400
    if needle:
        assert needle in ei.value.message


def test_large_finite_values_pass():
    for dt, v in (("FP64", 1e308), ("FP32", 3.4e38), ("FP16", 65504.0)):
        LIMITS.check(
            decode_rest(_json([{"name": "input", "shape": [1], "datatype": dt, "data": [v]}]), None, "digits", None)
        )


def test_nonfinite_refused_on_every_path_unless_allowed():
    arr = np.array([[1.0, np.nan]], np.float32)
    head = _json(
        [{"name": "input", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": arr.nbytes}}]
    )
    g = pb.ModelInferRequest(model_name="digits")
    t = g.inputs.add(name="input", datatype="FP32", shape=[1, 2])
    g.raw_input_contents.append(arr.tobytes())
    g2 = pb.ModelInferRequest(model_name="digits")
    t2 = g2.inputs.add(name="input", datatype="FP64", shape=[1, 2])
    t2.contents.fp64_contents.extend([float("inf"), 0.0])
    decoded = [
        decode_rest(head + arr.tobytes(), len(head), "digits", None),
        decode_grpc(g),
        decode_grpc(g2),
        decode_rest(
            _json([{"name": "input", "shape": [1], "datatype": "FP16", "data": [70000.0]}]), None, "digits", None
        ),
    ]
    for req in decoded:
        with pytest.raises(InvalidArgument, match="allow_nonfinite"):
            LIMITS.check(req)
        InputLimits(allow_nonfinite=True).check(req)
    assert t.name and t2.name


def test_element_and_row_limits_name_their_setting():
    req = decode_rest(
        _json([{"name": "input", "shape": [65, 1], "datatype": "FP32", "data": [0.0] * 65}]), None, "digits", None
    )
    with pytest.raises(InvalidArgument, match="max_batch_rows"):
        LIMITS.check(req)
    with pytest.raises(InvalidArgument, match="max_tensor_elements"):
        InputLimits(max_elements=64).check(req)
