"""Hypothesis strategies for hostile V2 requests: REST JSON, REST binary and gRPC protobuf.

Shared by the codec fuzz tests (in-process, many examples) and the live-server fuzz tests (few
examples over the wire). Each strategy mixes well-formed pieces with the classic breakers:
truncated and oversized payloads, negative / zero / overflowing shapes, wrong byte counts, NaN and
infinities, mismatched datatypes, deeply nested JSON and huge numbers.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from sloserve.gateway.types import V2_TO_NUMPY

DATATYPES = sorted(V2_TO_NUMPY)
INPUT_NAMES = st.sampled_from(["input", "input", "x", "", "input\x00", "ü" * 3, "a" * 300])
datatypes = st.one_of(
    st.sampled_from(DATATYPES), st.sampled_from(["FP8", "fp32", "", "INT128", "STRING"]), st.text(max_size=8)
)
INT64 = (-(2**63), 2**63 - 1)
dims = st.one_of(
    st.integers(0, 8),
    st.sampled_from([1, 64, 1024, -1, -(2**31), 2**31, 2**32 + 1, 2**62, 2**63 - 1, -(2**63)]),
    st.integers(*INT64),
)
shapes = st.lists(dims, max_size=20)
special_floats = st.sampled_from([math.nan, math.inf, -math.inf, 1e39, -1e39, 3.4e38, 1e308, 5e-324, -0.0])
numbers = st.one_of(
    st.integers(-10, 10),
    st.floats(allow_nan=False, allow_infinity=False),
    special_floats,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
)
json_leaf = st.one_of(numbers, st.text(max_size=4), st.none())


def dumps(doc) -> bytes:
    """JSON as a hostile client writes it: big integers kept, NaN / Infinity as bare words."""
    return json.dumps(doc, allow_nan=True).encode()


def nested(depth: int) -> list:
    """A list nested ``depth`` deep (orjson refuses depth > 1024, numpy more than 64 dims)."""
    out: list = [1.0]
    for _ in range(depth):
        out = [out]
    return out


json_data = st.one_of(
    st.lists(numbers, max_size=80),
    st.lists(st.lists(numbers, min_size=1, max_size=8), max_size=8),  # often ragged
    st.recursive(json_leaf, lambda c: st.lists(c, max_size=4), max_leaves=30),
    st.sampled_from([20, 40, 70, 200, 1100]).map(nested),
    json_leaf,
)


@st.composite
def shaped_tensor(draw) -> tuple[str, list[int], bytes]:
    """A datatype, a shape and raw bytes that are right, or off by a little, for that shape."""
    dt = draw(st.sampled_from(DATATYPES))
    shape = draw(st.lists(st.integers(0, 6), min_size=1, max_size=3))
    count = math.prod(shape)
    if dt == "BYTES":
        items = draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
        raw = b"".join(struct.pack("<I", len(b)) + b for b in items)
    elif dt.startswith("FP"):
        vals = draw(st.lists(st.one_of(st.floats(width=16), special_floats), min_size=count, max_size=count))
        with np.errstate(over="ignore"):
            raw = np.asarray(vals, dtype=np.float64).astype(V2_TO_NUMPY[dt]).tobytes()
    else:
        raw = draw(st.binary(min_size=count * V2_TO_NUMPY[dt].itemsize, max_size=count * V2_TO_NUMPY[dt].itemsize))
    mutate = draw(st.sampled_from(["none", "none", "truncate", "extend", "shape"]))
    if mutate == "truncate" and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    elif mutate == "extend":
        raw += draw(st.binary(min_size=1, max_size=9))
    elif mutate == "shape":
        shape = draw(shapes)
    return dt, shape, raw


@st.composite
def rest_binary_request(draw) -> tuple[bytes, int | None]:
    """A (body, Inference-Header-Content-Length) pair: JSON head + binary tensors, then mutated."""
    tensors = draw(st.lists(shaped_tensor(), min_size=1, max_size=3))
    inputs, blobs = [], []
    for i, (dt, shape, raw) in enumerate(tensors):
        size = draw(
            st.one_of(
                st.just(len(raw)), st.integers(-5, len(raw) + 9), st.sampled_from([2**31, 2**63 - 1, 2**64, -(2**63)])
            )
        )
        inp = {
            "name": "input" if i == 0 else f"in{i}",
            "datatype": draw(st.one_of(st.just(dt), datatypes)),
            "shape": shape,
            "parameters": {"binary_data_size": size},
        }
        if draw(st.booleans()) and i == 0:
            inp["data"] = [1.0]
        inputs.append(inp)
        blobs.append(raw)
    doc = {"inputs": inputs}
    if draw(st.booleans()):
        doc["parameters"] = draw(
            st.dictionaries(
                st.sampled_from(["slo_ms", "priority", "variant", "min_accuracy", "binary_data_output"]),
                json_leaf,
                max_size=3,
            )
        )
    head = dumps(doc)
    body = head + b"".join(blobs)
    hl = draw(
        st.one_of(st.just(len(head)), st.integers(-3, len(body) + 3), st.none(), st.sampled_from([2**63 - 1, -(2**63)]))
    )
    cut = draw(st.one_of(st.none(), st.integers(0, len(body))))
    if cut is not None:
        body = body[:cut]
    return body, hl


@st.composite
def rest_json_request(draw) -> bytes:
    """A V2 JSON body with hostile shapes, datatypes and data."""
    n = draw(st.integers(1, 3))
    inputs = []
    for _i in range(n):
        inp = {
            "name": draw(INPUT_NAMES),
            "datatype": draw(datatypes),
            "shape": draw(st.one_of(shapes, json_leaf)),
            "data": draw(json_data),
        }
        if draw(st.integers(0, 9)) == 0:
            del inp[draw(st.sampled_from(["name", "datatype", "shape", "data"]))]
        inputs.append(inp)
    doc = {"inputs": inputs}
    if draw(st.booleans()):
        doc["outputs"] = draw(
            st.lists(
                st.fixed_dictionaries(
                    {"name": st.sampled_from(["probs", "label", "x"])},
                    optional={"parameters": st.dictionaries(st.just("binary_data"), json_leaf)},
                ),
                max_size=3,
            )
        )
    return dumps(doc)


@st.composite
def grpc_request(draw) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(
        model_name=draw(st.sampled_from(["digits", "heavy", "nope", ""])),
        model_version=draw(st.sampled_from(["", "1", "2", "../x"])),
    )
    raw_mode = draw(st.sampled_from(["raw", "raw", "contents", "mixed", "raw_count"]))
    for i in range(draw(st.integers(0, 3))):
        t = req.inputs.add()
        t.name = "input" if i == 0 else draw(INPUT_NAMES)
        if raw_mode in ("raw", "raw_count", "mixed"):
            dt, shape, raw = draw(shaped_tensor())
            t.datatype = draw(st.one_of(st.just(dt), datatypes))
            t.shape.extend(int(min(max(d, INT64[0]), INT64[1])) for d in shape)
            req.raw_input_contents.append(raw)
            if raw_mode == "mixed":
                t.contents.fp32_contents.append(1.0)
        else:
            t.datatype = draw(datatypes)
            t.shape.extend(draw(st.lists(st.one_of(st.integers(0, 70), st.integers(*INT64)), max_size=4)))
            field = draw(
                st.sampled_from(
                    [
                        "fp32_contents",
                        "fp64_contents",
                        "int_contents",
                        "int64_contents",
                        "uint_contents",
                        "uint64_contents",
                        "bool_contents",
                        "bytes_contents",
                    ]
                )
            )
            if field in ("fp32_contents", "fp64_contents"):
                vals = draw(st.lists(st.one_of(st.floats(width=32), special_floats), max_size=70))
            elif field == "bool_contents":
                vals = draw(st.lists(st.booleans(), max_size=70))
            elif field == "bytes_contents":
                vals = draw(st.lists(st.binary(max_size=4), max_size=10))
            else:
                lo, hi = {
                    "int_contents": (-(2**31), 2**31 - 1),
                    "int64_contents": INT64,
                    "uint_contents": (0, 2**32 - 1),
                    "uint64_contents": (0, 2**64 - 1),
                }[field]
                vals = draw(st.lists(st.integers(lo, hi), max_size=70))
            getattr(t.contents, field).extend(vals)
    if raw_mode == "raw_count" and req.raw_input_contents:
        req.raw_input_contents.append(b"\x00" * 4)
    for key in draw(st.lists(st.sampled_from(["slo_ms", "priority", "variant", "min_accuracy", "x"]), max_size=3)):
        which = draw(st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param"]))
        val = {
            "bool_param": st.booleans(),
            "int64_param": st.integers(*INT64),
            "string_param": st.text(max_size=5),
            "double_param": st.floats(),
            "uint64_param": st.integers(0, 2**64 - 1),
        }[which]
        setattr(req.parameters[key], which, draw(val))
    for name in draw(st.lists(st.sampled_from(["probs", "label", "bogus"]), max_size=2)):
        req.outputs.add().name = name
    return req


# ---- any message of a protobuf descriptor (every RPC of inference.GRPCInferenceService) ----------
_F = FieldDescriptor
_INT_RANGES = {
    _F.TYPE_INT32: (-(2**31), 2**31 - 1),
    _F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    _F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    _F.TYPE_INT64: INT64,
    _F.TYPE_SINT64: INT64,
    _F.TYPE_SFIXED64: INT64,
    _F.TYPE_UINT32: (0, 2**32 - 1),
    _F.TYPE_FIXED32: (0, 2**32 - 1),
    _F.TYPE_UINT64: (0, 2**64 - 1),
    _F.TYPE_FIXED64: (0, 2**64 - 1),
}
NAMES = st.one_of(
    st.sampled_from(["digits", "heavy", "cnn"]),  # the demo repository's models
    st.sampled_from(["nope", "", "../digits", "digits/small", "a" * 300]),
    st.text(max_size=12),
)
VERSIONS = st.one_of(
    st.sampled_from(["", "1"]), st.sampled_from(["2", "0", "-1", "99999999999999999999"]), st.text(max_size=6)
)
# string fields whose values the server looks up: names it knows, next to random text
_STRING_HINTS = {
    "name": NAMES,
    "model_name": NAMES,
    "version": VERSIONS,
    "model_version": VERSIONS,
    "datatype": datatypes,
    "string_param": st.one_of(st.sampled_from(["{}", '{"max_batch_size": 0}', "[]", "{"]), st.text(max_size=20)),
}


def _scalar(field: FieldDescriptor) -> st.SearchStrategy:
    t = field.type
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        return st.one_of(st.integers(-3, 70).filter(lambda v: lo <= v <= hi), st.integers(lo, hi))
    if t in (_F.TYPE_DOUBLE, _F.TYPE_FLOAT):
        return st.one_of(st.floats(width=32 if t == _F.TYPE_FLOAT else 64), special_floats)
    if t == _F.TYPE_BOOL:
        return st.booleans()
    if t == _F.TYPE_STRING:
        return _STRING_HINTS.get(field.name, st.text(max_size=16))
    if t == _F.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == _F.TYPE_ENUM:  # proto3 enums are open: unknown numbers parse too
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-(2**31), 2**31 - 1))
    raise TypeError(f"no strategy for field {field.full_name} of type {t}")


@st.composite
def proto_message(draw, descriptor: Descriptor, depth: int = 3) -> Message:
    """A message of ``descriptor`` with random fields set: scalars across their whole range (known
    model names and datatypes for the fields that carry them), nested messages ``depth`` deep,
    repeated fields and maps up to a few entries, one member of each oneof (the last one set wins)."""
    msg = GetMessageClass(descriptor)()
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, val_f = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            for key in draw(st.lists(_scalar(key_f), max_size=3)):
                if val_f.message_type is None:
                    getattr(msg, field.name)[key] = draw(_scalar(val_f))
                elif depth > 0:
                    getattr(msg, field.name)[key].CopyFrom(draw(proto_message(val_f.message_type, depth - 1)))
        elif field.message_type is not None:
            if depth <= 0:
                continue
            if field.label == _F.LABEL_REPEATED:
                for _ in range(draw(st.integers(0, 3))):
                    getattr(msg, field.name).add().CopyFrom(draw(proto_message(field.message_type, depth - 1)))
            else:
                getattr(msg, field.name).CopyFrom(draw(proto_message(field.message_type, depth - 1)))
        elif field.label == _F.LABEL_REPEATED:
            getattr(msg, field.name).extend(draw(st.lists(_scalar(field), max_size=8)))
        else:
            setattr(msg, field.name, draw(_scalar(field)))
    return msg
