"""KServe V2 REST wire format <-> :class:`~sloserve.gateway.types.InferRequest` / ``InferResponse``.

Handles JSON with flat or nested ``data`` and Triton's binary tensor data extension: when the
``Inference-Header-Content-Length`` header is present, the body is that many bytes of JSON
followed by the raw tensors of the inputs whose ``parameters.binary_data_size`` is set, in order.
Every client mistake raises :class:`~sloserve.gateway.errors.InvalidArgument` naming what to fix.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from sloserve.gateway.errors import InvalidArgument, PayloadTooLarge
from sloserve.gateway.limits import SizeLimits
from sloserve.gateway.types import (
    NUMPY_TO_V2,
    V2_TO_NUMPY,
    InferRequest,
    InferResponse,
    RequestedOutput,
    RequestParams,
)

MAX_DIMS = 16
MAX_ELEMENTS = 1 << 28


def body_too_large(limit: int, declared: int | None = None) -> PayloadTooLarge:
    """The 413 for a REST body over ``limit``, declared up front or found while it streams."""
    what = f"request body of {declared:,} bytes is" if declared is not None else "request body is"
    return PayloadTooLarge(
        f"{what} over the {limit:,}-byte limit (max_request_bytes; by default the most the largest request "
        "the served models accept takes): send smaller batches"
    )


# numpy dtype kinds a JSON list may hold for each target kind
_JSON_KINDS = {"b": "b", "i": "biu", "u": "biu", "f": "biuf"}


def shape_of(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, (list, tuple)):
        raise InvalidArgument(f"{where}: 'shape' must be a list of non-negative integers, got {raw!r:.80}")
    if len(raw) > MAX_DIMS:
        raise InvalidArgument(f"{where}: shape has {len(raw)} dimensions, at most {MAX_DIMS} allowed")
    dims = []
    for d in raw:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise InvalidArgument(f"{where}: shape {list(raw)!r:.120} must hold non-negative integers")
        if d > MAX_ELEMENTS:
            raise InvalidArgument(f"{where}: shape dimension {d} is over {MAX_ELEMENTS:,}")
        dims.append(d)
    if math.prod(dims) > MAX_ELEMENTS:
        raise InvalidArgument(f"{where}: shape {dims} has {math.prod(dims):,} elements, over {MAX_ELEMENTS:,}")
    return tuple(dims)


def parse_params(raw: Any, where: str = "parameters") -> RequestParams:
    """Read the SLO parameters (``slo_ms``, ``min_accuracy``, ``priority``, ``timeout``, ``variant``,
    ``device_type``)."""
    p = RequestParams()
    if raw is None:
        return p
    if not isinstance(raw, dict):
        raise InvalidArgument(f"'{where}' must be an object, got {type(raw).__name__}")
    if "slo_ms" in raw:
        p.slo_ms = _number(raw["slo_ms"], "slo_ms", lo=0.0, lo_open=True, hi=3.6e6)
    if "min_accuracy" in raw:
        p.min_accuracy = _number(raw["min_accuracy"], "min_accuracy", lo=0.0, hi=1.0)
    if "priority" in raw:
        v = raw["priority"]
        if isinstance(v, bool) or not isinstance(v, int) or not -(2**31) <= v < 2**64:  # Triton: uint64
            raise InvalidArgument(f"parameter 'priority' must be an integer, got {v!r:.40}")
        p.priority = int(v)
    if "timeout" in raw:
        v = raw["timeout"]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
            raise InvalidArgument(f"parameter 'timeout' must be a non-negative integer (microseconds), got {v!r:.40}")
        p.timeout_us = int(v) or None
    if "variant" in raw:
        v = raw["variant"]
        if not isinstance(v, str) or not v:
            raise InvalidArgument(f"parameter 'variant' must be a variant name (string), got {v!r:.40}")
        p.variant = v
    if "device_type" in raw:
        v = raw["device_type"]
        if not isinstance(v, str) or not v:
            raise InvalidArgument(f"parameter 'device_type' must be a device type name (string), got {v!r:.40}")
        p.device_type = v
    return p


def _number(v: Any, name: str, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise InvalidArgument(f"parameter '{name}' must be a number, got {v!r:.40}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidArgument(f"parameter '{name}' must be a finite number, got {v!r:.40}")
    if v < lo or v > hi or (lo_open and v <= lo):
        bound = f"> {lo}" if lo_open else f">= {lo}"
        raise InvalidArgument(f"parameter '{name}' must be {bound} and <= {hi}, got {v}")
    return float(v)


def array_from_json(data: Any, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    dtype = V2_TO_NUMPY[datatype]
    count = math.prod(shape)
    if datatype == "BYTES":
        arr = np.array([_to_bytes(x, where) for x in _flatten(data, where)], dtype=np.object_)
    else:
        try:
            arr = np.asarray(data)
        except (ValueError, TypeError) as e:
            raise InvalidArgument(f"{where}: 'data' is not a regular (non-ragged) list of numbers: {e}") from None
        if arr.dtype.kind not in _JSON_KINDS[dtype.kind] and not (arr.size == 0 and arr.dtype.kind == "f"):
            raise InvalidArgument(f"{where}: 'data' holds {_kind_name(arr.dtype)} values but datatype is {datatype}")
        if dtype.kind in "iu" and arr.size:
            info = np.iinfo(dtype)
            # As Python ints: numpy cannot compare a bool array's extreme with uint64's max (OverflowError)
            if int(arr.min()) < info.min or int(arr.max()) > info.max:
                raise InvalidArgument(f"{where}: values out of range for {datatype} [{info.min}, {info.max}]")
        with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf: InputLimits refuses it
            arr = arr.astype(dtype, copy=False)
    if arr.size != count:
        raise InvalidArgument(f"{where}: shape {list(shape)} needs {count} elements but 'data' has {arr.size}")
    return arr.reshape(shape)


def _kind_name(dt: np.dtype) -> str:
    return {
        "b": "boolean",
        "i": "integer",
        "u": "integer",
        "f": "floating-point",
        "U": "string",
        "O": "mixed/non-numeric",
    }.get(dt.kind, str(dt))


def _flatten(data: Any, where: str, depth: int = 0):
    if depth > MAX_DIMS:
        raise InvalidArgument(f"{where}: 'data' is nested deeper than {MAX_DIMS} levels")
    if isinstance(data, list):
        for x in data:
            yield from _flatten(x, where, depth + 1)
    else:
        yield data


def _to_bytes(x: Any, where: str) -> bytes:
    if isinstance(x, str):
        return x.encode()
    raise InvalidArgument(f"{where}: BYTES data must be strings, got {type(x).__name__}")


def array_from_binary(buf: memoryview, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        items, off = [], 0
        while off < len(buf):
            if off + 4 > len(buf):
                raise InvalidArgument(f"{where}: truncated BYTES element length at byte {off}")
            (n,) = struct.unpack_from("<I", buf, off)
            off += 4
            if off + n > len(buf):
                raise InvalidArgument(f"{where}: BYTES element of {n} bytes runs past the tensor's data")
            items.append(bytes(buf[off : off + n]))
            off += n
        if len(items) != count:
            raise InvalidArgument(f"{where}: shape {list(shape)} needs {count} BYTES elements, got {len(items)}")
        return np.array(items, dtype=np.object_).reshape(shape)
    dtype = V2_TO_NUMPY[datatype]
    if len(buf) != count * dtype.itemsize:
        raise InvalidArgument(
            f"{where}: binary_data_size is {len(buf)} bytes but shape {list(shape)} of {datatype} "
            f"needs {count * dtype.itemsize}"
        )
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def decode_rest(
    body: bytes,
    header_length: int | None,
    model: str,
    version: str | None,
    headers: dict[str, str] | None = None,
    names: Sequence[str] | None = None,
    limits: InputLimits | None = None,
) -> InferRequest:
    """Decode a V2 REST infer body (JSON, or JSON + binary tensors).

    ``names``: the model's input names; ``limits``: the per-request bounds. With them, the count of
    inputs, every name and every declared shape are checked before any tensor is decoded
    (:func:`check_input_count`, :func:`check_input_name`, :meth:`InputLimits.check_shape`), so a body
    of thousands of tiny or unknown inputs costs one JSON parse."""
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise InvalidArgument(
                f"Inference-Header-Content-Length is {header_length} but the body has {len(body)} bytes"
            )
        head, binary = body[:header_length], memoryview(body)[header_length:]
    else:
        head, binary = body, memoryview(b"")
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as e:
        raise InvalidArgument(f"malformed JSON body: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("the request body must be a JSON object with an 'inputs' list")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidArgument("the request needs a non-empty 'inputs' list")
    params_raw = doc.get("parameters")
    params = parse_params(params_raw)
    if headers:
        _params_from_headers(params, headers)
    inputs = _rest_inputs(raw_inputs, binary, model, names, limits)
    binary_output = bool(isinstance(params_raw, dict) and params_raw.get("binary_data_output") is True)
    outputs = _rest_outputs(doc.get("outputs"), binary_output)
    rid = doc.get("id")
    if rid is not None and not isinstance(rid, str):
        raise InvalidArgument("'id' must be a string")
    return InferRequest(
        model=model, version=version, inputs=inputs, id=rid, outputs=outputs, params=params, binary_output=binary_output
    )


def _rest_inputs(
    raw_inputs: list, binary: memoryview, model: str, names: Sequence[str] | None, limits: InputLimits | None
) -> dict[str, tuple[str, np.ndarray]]:
    """The ``inputs`` list: each tensor from its JSON ``data`` or its slice of the binary part, in order.
    Every entry's name, datatype, shape and binary size is checked first; then the tensors are decoded."""
    check_input_count(len(raw_inputs), model, names)
    declared: list[tuple[str, str, tuple[int, ...], str, memoryview | None, Any]] = []
    seen: set[str] = set()
    offset = 0
    for i, t in enumerate(raw_inputs):
        if not isinstance(t, dict):
            raise InvalidArgument(f"inputs[{i}] must be an object with name, shape, datatype and data")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"inputs[{i}] needs a 'name' string")
        where = f"input '{name:.64}'"
        check_input_name(name, seen, model, names)
        datatype = t.get("datatype")
        if not isinstance(datatype, str) or datatype not in V2_TO_NUMPY:
            raise InvalidArgument(f"{where}: unknown datatype {datatype!r:.40}; use one of {sorted(V2_TO_NUMPY)}")
        shape = shape_of(t.get("shape"), where)
        if limits is not None:
            limits.check_shape(where, shape)
        tparams = t.get("parameters") or {}
        if not isinstance(tparams, dict):
            raise InvalidArgument(f"{where}: 'parameters' must be an object")
        size = tparams.get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InvalidArgument(f"{where}: binary_data_size must be a non-negative integer")
            if "data" in t:
                raise InvalidArgument(f"{where}: give either 'data' or binary_data_size, not both")
            if offset + size > len(binary):
                raise InvalidArgument(
                    f"{where}: binary_data_size {size} runs past the {len(binary)} bytes of binary data "
                    f"(Inference-Header-Content-Length set correctly?)"
                )
            declared.append((name, datatype, shape, where, binary[offset : offset + size], None))
            offset += size
        elif "data" in t:
            declared.append((name, datatype, shape, where, None, t["data"]))
        else:
            raise InvalidArgument(f"{where} has neither 'data' nor parameters.binary_data_size")
    if offset != len(binary):
        raise InvalidArgument(f"{len(binary) - offset} bytes of binary data follow the inputs unused")
    inputs: dict[str, tuple[str, np.ndarray]] = {}
    for name, datatype, shape, where, buf, data in declared:
        if buf is not None:
            arr = array_from_binary(buf, datatype, shape, where)
        else:
            arr = array_from_json(data, datatype, shape, where)
        inputs[name] = (datatype, arr)
    return inputs


def check_input_count(n: int, model: str, names: Sequence[str] | None) -> None:
    """A request naming more inputs than its model has is refused before any entry is looked at."""
    if names is not None and n > len(names):
        raise InvalidArgument(f"the request has {n:,} inputs but model '{model:.64}' has {len(names)}: {list(names)}")


def check_input_name(name: str, seen: set[str], model: str, names: Sequence[str] | None) -> None:
    """An input's name, before its tensor is decoded: not given twice, and one of the model's inputs."""
    if name in seen:
        raise InvalidArgument(f"input '{name:.64}' appears twice")
    if names is not None and name not in names:
        raise InvalidArgument(f"model '{model:.64}' has no input '{name:.64}'; inputs: {list(names)}")
    seen.add(name)


def _rest_outputs(raw_outputs: Any, binary_output: bool) -> list[RequestedOutput] | None:
    """The ``outputs`` list, or None for every output."""
    if raw_outputs is None:
        return None
    if not isinstance(raw_outputs, list):
        raise InvalidArgument("'outputs' must be a list of {name, parameters}")
    outputs = []
    for j, o in enumerate(raw_outputs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise InvalidArgument(f"outputs[{j}] must be an object with a 'name'")
        op = o.get("parameters") or {}
        if not isinstance(op, dict):
            raise InvalidArgument(f"outputs[{j}].parameters must be an object")
        outputs.append(RequestedOutput(o["name"], bool(op.get("binary_data", binary_output))))
    return outputs


_HEADER_PARAMS = {
    "x-slo-ms": "slo_ms",
    "x-min-accuracy": "min_accuracy",
    "x-priority": "priority",
    "x-variant": "variant",
    "x-device-type": "device_type",
}


def _params_from_headers(params: RequestParams, headers: dict[str, str]) -> None:
    """Headers mirror the parameters for clients that cannot set them; the body wins."""
    raw = {}
    for h, key in _HEADER_PARAMS.items():
        if h in headers:
            val: Any = headers[h]
            if key == "priority":
                try:
                    val = int(val)
                except ValueError:
                    raise InvalidArgument(f"header {h} must be an integer, got {val!r:.40}") from None
            raw[key] = val
    if not raw:
        return
    hp = parse_params(raw, "headers")
    for key in raw:
        default = RequestParams()
        if getattr(params, key) == getattr(default, key):
            setattr(params, key, getattr(hp, key))


def encode_rest(resp: InferResponse) -> tuple[bytes, int | None]:
    """Encode a response; returns (body, header length or None when all JSON)."""
    out_docs = []
    blobs: list[bytes] = []
    wanted = {o.name: o.binary for o in resp.requested} if resp.requested is not None else None
    for name, arr in resp.outputs.items():
        binary = wanted[name] if wanted is not None else resp.binary_output
        doc: dict[str, Any] = {"name": name, "datatype": NUMPY_TO_V2.get(arr.dtype, "BYTES"), "shape": list(arr.shape)}
        if binary:
            raw = raw_bytes(arr)
            doc["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            doc["data"] = arr.ravel()
        out_docs.append(doc)
    head: dict[str, Any] = {"model_name": resp.model, "model_version": resp.version, "outputs": out_docs}
    if resp.id is not None:
        head["id"] = resp.id
    if resp.parameters:
        head["parameters"] = resp.parameters
    try:
        js = orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # dtypes orjson cannot serialize natively (e.g. object)
        for d in out_docs:
            if "data" in d:
                d["data"] = [x.decode() if isinstance(x, bytes) else x for x in d["data"].tolist()]
        js = orjson.dumps(head)
    if not blobs:
        return js, None
    return b"".join([js, *blobs]), len(js)


def raw_bytes(arr: np.ndarray) -> bytes:
    """A tensor in KServe's binary form (REST's binary extension, gRPC's ``raw_output_contents``):
    numbers as little-endian raw data; BYTES (object or string arrays) as 4-byte length-prefixed
    elements, never the array's memory (for an object array, that is pointers)."""
    if arr.dtype.kind in "OUS":
        parts = []
        for x in arr.ravel():
            b = x if isinstance(x, bytes) else str(x).encode()
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    return np.ascontiguousarray(arr).tobytes()


class InputLimits:
    """Per-request bounds from the settings, checked on every decoded request (REST and gRPC).

    ``max_elements`` per input tensor, ``max_rows`` on the batch (first) dimension, and whether
    NaN / +-Inf may appear in floating-point inputs (``allow_nonfinite``). Each refusal is a 400
    naming the input, the bound and the setting that moves it.
    """

    __slots__ = ("allow_nonfinite", "max_elements", "max_json_bytes", "max_rows")

    def __init__(
        self,
        max_elements: int = MAX_ELEMENTS,
        max_rows: int | None = None,
        allow_nonfinite: bool = True,
        max_json_bytes: int | None = None,
    ):
        self.max_elements = max_elements
        self.max_rows = max_rows
        self.allow_nonfinite = allow_nonfinite
        self.max_json_bytes = max_json_bytes

    @classmethod
    def from_settings(cls, s: Any, sizes: SizeLimits | None = None) -> InputLimits:
        """The settings' bounds; ``sizes.json`` (the data plane's :class:`~sloserve.gateway.limits.SizeLimits`) caps JSON."""
        return cls(s.max_tensor_elements, s.max_batch_rows, s.allow_nonfinite, sizes.json if sizes else None)

    def check_json(self, n_bytes: int) -> None:
        """A REST request's JSON part, before it is parsed (413 over ``max_json_bytes``)."""
        if self.max_json_bytes is not None and n_bytes > self.max_json_bytes:
            raise PayloadTooLarge(
                f"the request's JSON is {n_bytes:,} bytes, over the limit of {self.max_json_bytes:,} "
                "(max_json_bytes): send large tensors in the binary tensor extension "
                "(tritonclient.http's binary_data=True) or over gRPC"
            )

    def check_shape(self, where: str, shape: tuple[int, ...]) -> None:
        """An input's declared shape against ``max_elements`` and ``max_rows``, before it is decoded."""
        size = math.prod(shape)
        if size > self.max_elements:
            raise InvalidArgument(
                f"{where} holds {size:,} elements, over the limit of {self.max_elements:,} (max_tensor_elements)"
            )
        if self.max_rows is not None and shape and shape[0] > self.max_rows:
            raise InvalidArgument(
                f"{where} carries {shape[0]} batch rows, over the limit of "
                f"{self.max_rows} (max_batch_rows); split the request"
            )

    def check(self, req: InferRequest) -> None:
        for name, (datatype, arr) in req.inputs.items():
            where = f"input '{name:.64}'"
            if arr.size > self.max_elements:
                raise InvalidArgument(
                    f"{where} holds {arr.size:,} elements, over the limit of "
                    f"{self.max_elements:,} (max_tensor_elements)"
                )
            if self.max_rows is not None and arr.ndim and arr.shape[0] > self.max_rows:
                raise InvalidArgument(
                    f"{where} carries {arr.shape[0]} batch rows, over the limit of "
                    f"{self.max_rows} (max_batch_rows); split the request"
                )
            if not self.allow_nonfinite and arr.dtype.kind == "f" and arr.size:
                finite = np.isfinite(arr)
                if not finite.all():
                    i = int(np.argmin(finite.ravel()))
                    v = arr.ravel()[i]
                    raise InvalidArgument(
                        f"{where} ({datatype}) holds a non-finite value ({v}) at flat index {i} "
                        f"(NaN, Inf, or a number too large for {datatype}); this server refuses them "
                        f"(allow_nonfinite is false)"
                    )
