"""KServe V2 gRPC (``inference.GRPCInferenceService``) over grpc.aio: an adapter to the DataPlane.

Wire messages are the protobuf stubs generated for that very service that the tritonclient
package ships (``tritonclient.grpc.service_pb2``), never hand-written. Inputs come as
``raw_input_contents`` (what tritonclient sends) or typed ``contents``; outputs always go back as
``raw_output_contents``, the only form tritonclient decodes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from sloserve.gateway import tracing
from sloserve.gateway.dataplane import DataPlane
from sloserve.gateway.errors import InvalidArgument, ServingError
from sloserve.gateway.transports.auth import GrpcGuard, TokenTable, grpc_server_credentials, may_see
from sloserve.gateway.transports.callguard import CallGuard
from sloserve.gateway.transports.codec import (
    MAX_ELEMENTS,
    InputLimits,
    array_from_binary,
    check_input_count,
    check_input_name,
    parse_params,
    raw_bytes,
)
from sloserve.gateway.transports.status import set_grpc_error
from sloserve.gateway.types import NUMPY_TO_V2, V2_TO_NUMPY, InferRequest, InferResponse, RequestedOutput

log = logging.getLogger("sloserve.grpc")

_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def param_value(p: pb.InferParameter) -> Any:
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_RAW_INPUT_CONTENTS = 7  # ModelInferRequest.raw_input_contents (repeated bytes), in the V2 proto
_MAX_SPLIT_FIELDS = 4096  # past this many top-level fields, upb parses the message alone


class ReceivedInfer:
    """A received ModelInferRequest: the message without its raw tensors, the raw tensors as views
    of the received bytes (``raw`` None: still inside ``msg``), and the size on the wire."""

    __slots__ = ("msg", "nbytes", "raw")

    def __init__(self, msg: pb.ModelInferRequest, raw: list[memoryview] | None, nbytes: int):
        self.msg, self.raw, self.nbytes = msg, raw, nbytes

    @property
    def model_name(self) -> str:
        return self.msg.model_name


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _split_raw(data: bytes) -> tuple[bytes, list[memoryview]] | None:
    """The message's bytes without its ``raw_input_contents`` fields, and those fields' payloads as
    views of ``data``; None when the top level is not the plain shape this expects (upb decides)."""
    view, raw, keep = memoryview(data), [], []
    i = start = fields = 0
    n = len(data)
    while i < n:
        fields += 1
        if fields > _MAX_SPLIT_FIELDS:
            return None
        key, j = _varint(data, i)
        wire = key & 7
        if wire == 2:
            length, k = _varint(data, j)
            end = k + length
            if end > n:
                return None
            if key >> 3 == _RAW_INPUT_CONTENTS:
                keep.append(view[start:i])
                raw.append(view[k:end])
                start = end
            i = end
        elif wire == 0:
            i = _varint(data, j)[1]
        elif wire == 1:
            i = j + 8
        elif wire == 5:
            i = j + 4
        else:
            return None
    if i != n:
        return None
    keep.append(view[start:n])
    return (b"".join(keep) if raw else data), raw


def parse_infer(data: bytes) -> ReceivedInfer:
    """ModelInfer's request deserializer. upb would copy every raw tensor twice more (into the parsed
    message, then again on each access to ``raw_input_contents[i]``): a 60 MiB request cost the event
    loop three copies. Here the raw tensors stay views of the bytes grpc received, and upb parses only
    the rest (names, shapes, parameters). Malformed input raises, as the protobuf parser would."""
    try:
        split = _split_raw(data)
    except (IndexError, ValueError):
        split = None
    if split is None:
        return ReceivedInfer(pb.ModelInferRequest.FromString(data), None, len(data))
    rest, raw = split
    return ReceivedInfer(pb.ModelInferRequest.FromString(rest), raw, len(data))


def decode_grpc(
    req: pb.ModelInferRequest,
    raw_views: list[memoryview] | None = None,
    names: Sequence[str] | None = None,
    limits: InputLimits | None = None,
) -> InferRequest:
    """The request's tensors as numpy arrays. ``names`` (the model's inputs) and ``limits``: the count
    of inputs, every name and every declared shape are checked before any tensor is decoded."""
    raw: Any = req.raw_input_contents if raw_views is None else raw_views
    if raw and len(raw) != len(req.inputs):
        raise InvalidArgument(
            f"raw_input_contents has {len(raw)} entries for {len(req.inputs)} inputs; "
            f"give raw contents for every input or for none"
        )
    if not req.inputs:
        raise InvalidArgument("the request needs at least one input")
    check_input_count(len(req.inputs), req.model_name, names)
    declared: list[tuple[int, Any, tuple[int, ...], str]] = []
    seen: set[str] = set()
    for i, t in enumerate(req.inputs):
        where = f"input '{t.name:.64}'"
        if not t.name:
            raise InvalidArgument(f"inputs[{i}] needs a name")
        check_input_name(t.name, seen, req.model_name, names)
        if t.datatype not in V2_TO_NUMPY:
            raise InvalidArgument(f"{where}: unknown datatype {t.datatype!r:.40}; use one of {sorted(V2_TO_NUMPY)}")
        shape = tuple(t.shape)
        if any(d < 0 for d in shape) or len(shape) > 16:
            raise InvalidArgument(f"{where}: shape {list(shape)} must hold at most 16 non-negative dimensions")
        if any(d > MAX_ELEMENTS for d in shape) or math.prod(shape) > MAX_ELEMENTS:
            raise InvalidArgument(f"{where}: shape {list(shape)} has too many elements (max {MAX_ELEMENTS:,})")
        if limits is not None:
            limits.check_shape(where, shape)
        if raw:
            if t.HasField("contents"):
                raise InvalidArgument(f"{where}: give raw_input_contents or contents, not both")
        elif _CONTENTS_FIELD.get(t.datatype) is None:
            raise InvalidArgument(f"{where}: datatype {t.datatype} can only be sent as raw_input_contents")
        declared.append((i, t, shape, where))
    inputs: dict[str, tuple[str, np.ndarray]] = {}
    for i, t, shape, where in declared:
        if raw:
            arr = array_from_binary(memoryview(raw[i]), t.datatype, shape, where)
        else:
            field = _CONTENTS_FIELD[t.datatype]
            values = getattr(t.contents, field)
            count = math.prod(shape)
            if len(values) != count:
                raise InvalidArgument(
                    f"{where}: shape {list(shape)} needs {count} elements but contents.{field} has {len(values)}"
                )
            dtype = V2_TO_NUMPY[t.datatype]
            if t.datatype == "BYTES":
                arr = np.array(list(values), dtype=np.object_).reshape(shape)
            else:
                arr = np.asarray(values)
                if dtype.kind in "iu" and arr.size:
                    info = np.iinfo(dtype)
                    if int(arr.min()) < info.min or int(arr.max()) > info.max:
                        raise InvalidArgument(f"{where}: values out of range for {t.datatype}")
                with np.errstate(over="ignore", invalid="ignore"):  # inf: InputLimits refuses it
                    arr = arr.astype(dtype).reshape(shape)
        inputs[t.name] = (t.datatype, arr)
    params_raw = {k: param_value(v) for k, v in req.parameters.items()}
    params = parse_params(params_raw)
    outputs = [RequestedOutput(o.name, True) for o in req.outputs] if req.outputs else None
    return InferRequest(
        model=req.model_name,
        version=req.model_version or None,
        inputs=inputs,
        id=req.id or None,
        outputs=outputs,
        params=params,
        binary_output=True,
    )


def _set_param(p: pb.InferParameter, v: Any) -> None:
    if isinstance(v, bool):
        p.bool_param = v
    elif isinstance(v, int):
        p.int64_param = v
    elif isinstance(v, float):
        p.double_param = v
    else:
        p.string_param = str(v)


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dp: DataPlane):
        self.dp = dp
        self.limits = InputLimits.from_settings(dp.settings, dp.size_limits)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=self.dp.live())

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.dp.ready())

    async def ServerMetadata(self, request, context):
        md = self.dp.server_metadata()
        return pb.ServerMetadataResponse(name=md["name"], version=md["version"], extensions=md["extensions"])

    async def ModelReady(self, request, context):
        try:
            return pb.ModelReadyResponse(ready=self.dp.model_ready(request.name, request.version or None))
        except ServingError as e:
            set_grpc_error(context, e)
            return None

    async def ModelMetadata(self, request, context):
        try:
            md = self.dp.model(request.name, request.version or None).metadata()
        except ServingError as e:
            set_grpc_error(context, e)
            return None
        tm = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=md["name"],
            versions=md["versions"],
            platform=md["platform"],
            inputs=[tm(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in md["inputs"]],
            outputs=[tm(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in md["outputs"]],
        )

    async def ModelConfig(self, request, context):
        try:
            cfg = self.dp.model_config(request.name, request.version or None)
        except ServingError as e:
            set_grpc_error(context, e)
            return None
        return pb.ModelConfigResponse(config=json_format.ParseDict(cfg, model_config_pb2.ModelConfig()))

    async def ModelStatistics(self, request, context):
        try:
            stats = self.dp.statistics(request.name or None, request.version or None)
        except ServingError as e:
            set_grpc_error(context, e)
            return None
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse())

    async def RepositoryIndex(self, request, context):
        index = [m for m in self.dp.repository.index(request.ready) if may_see(m["name"])]  # the token's models
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**m) for m in index])

    async def RepositoryModelLoad(self, request, context):
        params = {k: param_value(v) for k, v in request.parameters.items()} or None
        try:
            await self.dp.repository.load(request.model_name, params)
        except ServingError as e:
            set_grpc_error(context, e)
            return None
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        params = {k: param_value(v) for k, v in request.parameters.items()} or None
        try:
            await self.dp.repository.unload(request.model_name, params)
        except ServingError as e:
            set_grpc_error(context, e)
            return None
        return pb.RepositoryModelUnloadResponse()

    async def ModelInfer(self, request, context):
        if tracing.TRACER is not None:  # the request in its trace, when sampled (sloserve/gateway/tracing.py)
            return await tracing.serve_grpc(self._model_infer, request, context)
        return await self._model_infer(request, context)

    async def _model_infer(self, request, context):
        ticket = failure = None
        model = request.model_name
        try:
            size = request.nbytes
            ticket = self.dp.admit(request.model_name, size)
            ticket.read(size)
            # a model that is not served is refused before the request is decoded; its inputs bound the decoding
            names = self.dp.input_names(model, request.msg.model_version or None)
            req = decode_grpc(request.msg, request.raw, names, self.limits)
            self.limits.check(req)
            md = dict(context.invocation_metadata() or ())
            if "x-slo-ms" in md and req.params.slo_ms is None:
                req.params.slo_ms = parse_params({"slo_ms": md["x-slo-ms"]}).slo_ms
            req.arrival_s = ticket.arrival_s
            resp = await self.dp.infer(req)
        except ServingError as e:
            failure = e.with_traceback(None)
        finally:
            if ticket is not None:
                ticket.release()
        if failure is not None:
            if tracing.TRACER is not None:
                tracing.failed(failure)
            set_grpc_error(context, failure)
            self.dp.metrics.shed_answered(model, failure)
            return None
        return encode_response(resp)


def _not_served(method: str) -> Any:
    async def not_served(self: InferenceServicer, request: Any, context: grpc.aio.ServicerContext) -> None:
        context.set_code(grpc.StatusCode.UNIMPLEMENTED)
        context.set_details(f"{method} is not served by this server")

    not_served.__name__, not_served.__qualname__ = method, f"InferenceServicer.{method}"
    return not_served


# The service's methods this server does not implement answer UNIMPLEMENTED by returning, not by
# raising as the generated base class does: that raise logged an error and its traceback on every call.
NOT_SERVED = tuple(
    m.name
    for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
    if m.name not in vars(InferenceServicer)
)
for _method in NOT_SERVED:
    setattr(InferenceServicer, _method, _not_served(_method))


def encode_response(resp: InferResponse) -> pb.ModelInferResponse:
    """The gRPC answer: every output in ``raw_output_contents`` (the form tritonclient decodes)."""
    out = pb.ModelInferResponse(model_name=resp.model, model_version=resp.version, id=resp.id or "")
    for name, arr in resp.outputs.items():
        t = out.outputs.add()
        t.name = name
        t.datatype = NUMPY_TO_V2.get(arr.dtype, "BYTES")
        t.shape.extend(arr.shape)
    out.raw_output_contents.extend(raw_bytes(arr) for arr in resp.outputs.values())
    for k, v in resp.parameters.items():
        _set_param(out.parameters[k], v)
    return out


MAX_STREAMS_PER_CONNECTION = 128


def create_server(dp: DataPlane, address: str, reuse_port: bool = False) -> tuple[grpc.aio.Server, int]:
    """The gRPC server on ``address``; ``reuse_port``: one of several workers sharing the port."""
    limit = dp.size_limits.grpc
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", max(limit, 64 * 1024 * 1024)),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            # one connection cannot hold every call slot: HTTP/2 streams per connection are capped
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
            # a connection that never completes its HTTP/2 handshake is closed (core's default: 120 s)
            ("grpc.server_handshake_timeout_ms", max(1, int(dp.settings.header_timeout_s * 1000))),
            # a connection without calls gets GOAWAY; its client reconnects on its next call
            ("grpc.max_connection_idle_ms", max(1, int(dp.settings.idle_timeout_s * 1000))),
        ],
        interceptors=[
            # outermost: a deadline for each call's request message, a cap per client address
            CallGuard(dp.settings.body_timeout_s, dp.settings.max_connections_per_client),
            GrpcGuard(TokenTable.from_settings(dp.settings), {MODEL_INFER: parse_infer}),
        ],
        maximum_concurrent_rpcs=dp.settings.max_connections,
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(dp), server)
    creds = grpc_server_credentials(dp.settings)
    port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"cannot bind gRPC on {address}")
    return server, port
