"""The tensors of a Triton model's config.pbtxt against its ONNX graph (sloserve/models/triton.py):
``max_batch_size`` and the batch dimension, ``input``/``output`` completed from the graph or checked
against it (``data_type``, ``dims``, ``reshape``), and the config's lines for problems that name one."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sloserve.models.datatypes import NUMPY_TO_V2, V2_TO_NUMPY
from sloserve.models.schema import ModelProblem

AUTO_MAX_BATCH_SIZE = 4  # Triton's default-max-batch-size, what its auto-complete sets


class Where:
    """config.pbtxt's lines, for problems that name one: ``line(key)`` is the first line (from
    ``start``) that sets ``key`` (to ``value`` when given); comments are not searched."""

    def __init__(self, path: Path, text: str):
        self.path = path
        self.lines = [re.sub(r"#.*$", "", ln) if '"' not in ln else ln for ln in text.splitlines()]

    def line(self, key: str, start: int = 1, value: str | None = None) -> int | None:
        tail = rf"\s*\[?\s*[\"']{re.escape(value)}[\"']" if value is not None else ""
        pat = re.compile(rf"(?<![\w.]){re.escape(key)}\s*(?::|\{{|\[)" + tail)
        for i in range(max(start, 1) - 1, len(self.lines)):
            if pat.search(self.lines[i]):
                return i + 1
        return None

    def tensor_line(self, kind: str, name: str, key: str | None = None) -> int | None:
        """The line of ``key`` in ``kind``'s (input / output) tensor ``name``, else of its name."""
        at = self.line("name", self.line(kind) or 1, name)
        if at is None or key is None:
            return at
        found = self.line(key, at)
        nxt = self.line("name", at + 1)  # not past the next tensor
        return found if found is not None and (nxt is None or found < nxt or found == at) else at

    def problem(self, key: str, message: str, line: int | None = None) -> ModelProblem:
        at = f"{self.path}:{line}" if line is not None else str(self.path)
        return ModelProblem(f"{at}: '{key}': {message}")


@dataclass(frozen=True)
class GraphTensor:
    """One input or output of an ONNX graph: its V2 datatype (None: no V2 name) and full dims (-1 = any)."""

    name: str
    datatype: str | None
    dims: tuple[int, ...] | None  # None: the graph gives no shape


def graph_tensors(graph) -> tuple[dict[str, GraphTensor], dict[str, GraphTensor]]:
    """The inputs (initializers excluded) and outputs of an ONNX ``graph`` (a ModelProto)."""
    from onnx import helper

    def one(t) -> GraphTensor:
        tt = t.type.tensor_type
        try:
            dt: str | None = NUMPY_TO_V2.get(np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)), "BYTES")
        except (KeyError, TypeError, ValueError):
            dt = None
        dims = (
            tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
            if tt.HasField("shape")
            else None
        )
        return GraphTensor(t.name, dt, dims)

    init = {t.name for t in graph.graph.initializer}
    return (
        {t.name: one(t) for t in graph.graph.input if t.name not in init},
        {t.name: one(t) for t in graph.graph.output},
    )


def batch_size(pb, where: Where, graph) -> tuple[int, bool]:
    """(sloserve's max_batch_size, whether config.pbtxt has a batch dimension)."""
    if pb.max_batch_size < 0:
        raise where.problem("max_batch_size", f"{pb.max_batch_size} is negative", where.line("max_batch_size"))
    if pb.max_batch_size > 4096:
        raise where.problem("max_batch_size", f"{pb.max_batch_size} is above 4096", where.line("max_batch_size"))
    if pb.max_batch_size > 0:
        return pb.max_batch_size, True
    every = [*graph[0].values(), *graph[1].values()]
    if not pb.input and not pb.output and every and all(t.dims and t.dims[0] == -1 for t in every):
        return AUTO_MAX_BATCH_SIZE, True  # Triton's auto-complete: the variable first dimension is the batch
    firsts = {t.name: _model_dims(t) for t in (*pb.input, *pb.output)}
    for kind, specs in (("input", graph[0]), ("output", graph[1])):
        for t in specs.values():
            cfg = firsts.get(t.name)
            first = cfg[0] if cfg else None
            gfirst = t.dims[0] if t.dims else None
            if first == 1 or gfirst == 1 or (kind == "output" and first in (None, -1) and gfirst == -1):
                continue
            raise where.problem(
                "max_batch_size",
                f"is 0 (no batch dimension), but {kind} {t.name!r} has a first dimension of "
                f"{first if first is not None else gfirst} ({'dims' if cfg else 'the ONNX graph'}): sloserve batches "
                "along the first dimension; set max_batch_size above 0 when it is the batch (and leave it out of "
                "'dims'), or fix it at 1",
                where.line("max_batch_size") or where.tensor_line(kind, t.name, "dims"),
            )
    return 1, False


def _model_dims(t) -> tuple[int, ...]:
    """The dims the model takes for config tensor ``t``: its reshape when it has one, else its dims."""
    return tuple(t.reshape.shape) if t.HasField("reshape") else tuple(t.dims)


def tensors(pb, where: Where, kind: str, graph: dict[str, GraphTensor], batch_dim: bool) -> list[dict]:
    """sloserve's TensorSpecs (as dicts) of the config's ``kind`` tensors, or of the graph's when the
    config lists none; checked against the graph."""
    listed = list(pb.input if kind == "input" else pb.output)
    out = []
    if not listed:
        for t in graph.values():
            if t.datatype is None or t.dims is None:
                raise where.problem(
                    kind, f"the ONNX graph's {kind} {t.name!r} has no type or shape to complete it from; list it", None
                )
            out.append({"name": t.name, "datatype": t.datatype, "shape": list(t.dims[1:])})
        return out
    for i, t in enumerate(listed):
        key = f"{kind}[{i}]"
        g = graph.get(t.name)
        if g is None:
            raise where.problem(
                f"{key}.name",
                f"{t.name!r} is not an {kind} of the ONNX graph; it has {sorted(graph)}",
                where.tensor_line(kind, t.name),
            )
        type_name = type(t).DESCRIPTOR.fields_by_name["data_type"].enum_type.values_by_number[t.data_type].name
        datatype = type_name.removeprefix("TYPE_").replace("STRING", "BYTES")
        if datatype not in V2_TO_NUMPY:
            raise where.problem(
                f"{key}.data_type",
                f"{type_name} has no V2 datatype sloserve serves",
                where.tensor_line(kind, t.name, "data_type"),
            )
        if g.datatype != datatype:
            raise where.problem(
                f"{key}.data_type",
                f"{type_name} for {t.name!r}, but the ONNX graph's is {g.datatype or 'a type without a V2 name'}",
                where.tensor_line(kind, t.name, "data_type"),
            )
        dims = _model_dims(t)
        if t.HasField("reshape"):
            a, b = math.prod(t.dims), math.prod(t.reshape.shape)
            if all(d >= 0 for d in (*t.dims, *t.reshape.shape)) and a != b:
                raise where.problem(
                    f"{key}.reshape",
                    f"{list(t.reshape.shape)} holds {b} elements, dims {list(t.dims)} hold {a}",
                    where.tensor_line(kind, t.name, "reshape"),
                )
        full = (-1, *dims) if batch_dim else dims
        gd = g.dims
        if gd is not None and (
            len(gd) != len(full) or any(c >= 0 and m >= 0 and c != m for c, m in zip(full, gd, strict=True))
        ):
            field = "reshape" if t.HasField("reshape") else "dims"
            shown = "[batch, ...]" if batch_dim else "(max_batch_size 0: no batch dimension)"
            raise where.problem(
                f"{key}.{field}",
                f"{list(dims)} for {t.name!r} {shown}, but the ONNX graph's shape is {list(gd)}",
                where.tensor_line(kind, t.name, field),
            )
        shape = list(dims) if batch_dim else list(dims[1:])
        out.append({"name": t.name, "datatype": datatype, "shape": shape})
    if kind == "input":
        extra = sorted(set(graph) - {t.name for t in listed})
        if extra:
            raise where.problem(
                "input",
                f"lists {[t.name for t in listed]}, but the ONNX graph also takes {extra} (list every input)",
                where.line("input"),
            )
    return out


def check_graph(pb, where: Where, graph, what: str, completed: dict[str, Any], top: str) -> None:
    """Another served version's graph against the config (``completed``: as translated from version
    ``top``'s): the same tensors, datatypes and shapes."""
    _, batch_dim = batch_size(pb, where, graph)
    try:
        for kind, key in (("input", "inputs"), ("output", "outputs")):
            mine = tensors(pb, where, kind, graph[0 if kind == "input" else 1], batch_dim)
            if (pb.input if kind == "input" else pb.output) or _same_tensors(mine, completed[key], kind):
                continue
            raise where.problem(
                kind,
                f"completed from version {top}'s graph as {_show(completed[key])}, but the graph has "
                f"{_show(mine)}: serve versions with one signature, or list the {kind}s",
            )
    except ModelProblem as e:
        raise ModelProblem(f"{e} (in {what})") from None


def _same_tensors(graph: list[dict], config: list[dict], kind: str) -> bool:
    have = {t["name"]: t for t in graph}
    if kind == "input" and set(have) != {t["name"] for t in config}:
        return False
    for t in config:
        g = have.get(t["name"])
        if g is None or g["datatype"] != t["datatype"] or len(g["shape"]) != len(t["shape"]):
            return False
        if any(a >= 0 and b >= 0 and a != b for a, b in zip(g["shape"], t["shape"], strict=True)):
            return False
    return True


def _show(specs: list[dict]) -> str:
    return ", ".join(f"{t['name']} {t['datatype']} {[-1, *t['shape']]}" for t in specs) or "none"


def reshapes(pb, batch_dim: bool) -> dict[str, list[int]]:
    """Tensor name -> the config's dims, for the tensors whose reshape differs from them."""
    out = {}
    for t in (*pb.input, *pb.output):
        if t.HasField("reshape") and list(t.reshape.shape) != list(t.dims):
            dims = list(t.dims)
            out[t.name] = dims if batch_dim else dims[1:]
    return out
