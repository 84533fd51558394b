"""The inputs of ``sloserve models variants``, checked before anything is written: the model's
signature, the validation set against it, the split, the extra variants' names and tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from sloserve.models.datatypes import NUMPY_TO_V2, V2_TO_NUMPY
from sloserve.models.repository import TensorSpec, check_name


class VariantsError(ValueError):
    """Input ``sloserve models variants`` cannot use, saying what to fix; nothing has been written."""


@dataclass(frozen=True, slots=True)
class Signature:
    """A graph's inputs and outputs as config.json names them (shapes without the batch dimension)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


# --- the inputs -------------------------------------------------------------------------------------


def graph_signature(model: onnx.ModelProto, where: str) -> Signature:
    """The inputs (initializers excluded) and outputs of ``model``; a batch dimension the graph fixes
    is an error (batches run 1..max_batch_size rows)."""
    from onnx import helper

    init = {t.name for t in model.graph.initializer}

    def spec(t, kind: str) -> TensorSpec:
        tt = t.type.tensor_type
        try:
            dt = NUMPY_TO_V2[np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))]
        except (KeyError, TypeError, ValueError):
            raise VariantsError(f"{where}: {kind} {t.name!r} has a type config.json cannot name") from None
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        if not dims:
            raise VariantsError(f"{where}: {kind} {t.name!r} has no batch dimension (rank 0 or unknown shape)")
        if dims[0] > 0:
            raise VariantsError(
                f"{where}: {kind} {t.name!r} fixes the batch dimension at {dims[0]} (shape {dims}); export the "
                f"model with a dynamic first dimension"
            )
        return TensorSpec(name=t.name, datatype=dt, shape=tuple(dims[1:]))

    return Signature(
        inputs=tuple(spec(t, "input") for t in model.graph.input if t.name not in init),
        outputs=tuple(spec(t, "output") for t in model.graph.output),
    )


def load_onnx(path: str | Path, what: str) -> onnx.ModelProto:
    path = Path(path)
    if not path.is_file():
        raise VariantsError(f"{what} {path} does not exist")
    try:
        model = onnx.load(str(path))
    except Exception as e:  # the protobuf parser's own errors
        raise VariantsError(f"{what} {path} is not an ONNX model ({type(e).__name__}: {e})") from None
    if not model.graph.node:
        raise VariantsError(f"{what} {path} has an empty graph")
    return model


def load_validation(path: str | Path, sig: Signature) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (cast to the first input's datatype) and ``y`` (int64) from ``path``, checked against the
    model's first input."""
    path = Path(path)
    if not path.is_file():
        raise VariantsError(f"validation set {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:
        raise VariantsError(f"validation set {path} is not a numpy .npz file ({type(e).__name__}: {e})") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise VariantsError(
            f"validation set {path} has keys {sorted(arrays)} but lacks {missing}: save it with "
            f"np.savez(path, x=inputs, y=labels) (x: rows of the model's first input, y: one integer label a row)"
        )
    x, y = arrays["x"], arrays["y"]
    first = sig.inputs[0]
    want = [-1, *first.shape]
    if x.ndim != len(want) or any(w > 0 and w != d for w, d in zip(want[1:], x.shape[1:], strict=True)):
        raise VariantsError(
            f"validation set {path}: x has shape {list(x.shape)}, but the model's input {first.name!r} takes "
            f"{want} (rows first, -1 = any)"
        )
    dtype = V2_TO_NUMPY[first.datatype]
    if x.dtype.kind not in "biuf" or dtype.kind not in "biuf":
        raise VariantsError(f"validation set {path}: x is {x.dtype}, the input {first.name!r} is {first.datatype}")
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise VariantsError(
            f"validation set {path}: y must be one integer label a row (1-D, integer), not {y.dtype} shape "
            f"{list(y.shape)}"
        )
    if len(y) != len(x):
        raise VariantsError(f"validation set {path}: x has {len(x)} rows but y has {len(y)} labels")
    if len(x) < 4:
        raise VariantsError(f"validation set {path}: {len(x)} rows; at least 4 are needed (calibration + held out)")
    if y.min() < 0:
        raise VariantsError(f"validation set {path}: y holds a negative label ({int(y.min())}); labels are 0..n-1")
    return x.astype(dtype, copy=False), y.astype(np.int64)


def split(n: int, calib_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices of the calibration part and of the held-out part (a seeded permutation)."""
    if not 0.0 < calib_fraction < 1.0:
        raise VariantsError(f"calib_fraction must be between 0 and 1, not {calib_fraction}")
    order = np.random.default_rng(seed).permutation(n)
    k = min(max(1, round(n * calib_fraction)), n - 1)
    return np.sort(order[:k]), np.sort(order[k:])


def parse_extras(items: Sequence[str], kinds: Sequence[str]) -> dict[str, Path]:
    """``NAME=PATH`` strings as {name: path}, names checked (safe, distinct, not a built kind's)."""
    out: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise VariantsError(f"--extra-variant {item!r}: write it NAME=PATH (e.g. tiny=tiny.onnx)")
        try:
            check_name("variant", name)
        except ValueError as e:
            raise VariantsError(f"--extra-variant {item!r}: {e}") from None
        if name in out or name in kinds:
            raise VariantsError(f"--extra-variant {item!r}: the variant name {name!r} is taken; choose another")
        out[name] = Path(path)
    return out


def scored_output(sig: Signature, name: str | None) -> TensorSpec:
    """The output whose argmax is the class: ``name``, else the first; scores [n, classes] or labels [n]."""
    outs = {o.name: o for o in sig.outputs}
    if name is not None and name not in outs:
        raise VariantsError(f"--output {name!r} is not an output of the model; it has {sorted(outs)}")
    spec = outs[name] if name is not None else sig.outputs[0]
    labels = spec.shape == () and V2_TO_NUMPY[spec.datatype].kind in "iu"
    if len(spec.shape) != 1 and not labels:
        raise VariantsError(
            f"output {spec.name!r} has shape {[-1, *spec.shape]}: name a class-score output [rows, classes] or "
            f"a label output [rows] with --output (outputs: {[o.name for o in sig.outputs]})"
        )
    return spec


def same_signature(sig: Signature, other: Signature) -> str | None:
    """What differs between two signatures (names, datatypes, shapes), or None."""
    for kind, a, b in (("inputs", sig.inputs, other.inputs), ("outputs", sig.outputs, other.outputs)):
        if [t.name for t in a] != [t.name for t in b]:
            return f"its {kind} are {[t.name for t in b]}, the original's {[t.name for t in a]}"
        for ta, tb in zip(a, b, strict=True):
            if (ta.datatype, ta.shape) != (tb.datatype, tb.shape):
                return (
                    f"its {kind[:-1]} {tb.name!r} is {tb.datatype} {[-1, *tb.shape]}, the original's "
                    f"{ta.datatype} {[-1, *ta.shape]}"
                )
    return None
