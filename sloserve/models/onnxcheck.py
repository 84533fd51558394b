"""The checks of a model's ONNX files: each variant's file inside the repository, parsable, its external
data beside it, and its graph agreeing with the config (names, datatypes, shapes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sloserve.models.datatypes import NUMPY_TO_V2
from sloserve.models.schema import LoadedModel, ModelConfig, ModelProblem


def check_variants(model: LoadedModel, root: Path, src: str) -> None:
    """Every variant's ONNX file of ``model``: inside the repository, there, parsable, and agreeing
    with the config (``src`` names it in a problem)."""
    for v in model.config.variants:
        path = model.onnx_path(v.name)
        if not path.resolve().is_relative_to(root):
            raise ModelProblem(f"{path} is outside the repository {root}")
        if not path.is_file():
            raise ModelProblem(f"{src}: variant {v.name!r} has no {path}")
        graph = parse_onnx(path, root)
        problem = signature_mismatch(model.config, graph)
        if problem:
            raise ModelProblem(f"{src}: variant {v.name!r} ({path}): {problem}")


def parse_onnx(path: Path, root: Path):
    """The ONNX graph of ``path`` (without external data), or :class:`ModelProblem` saying why it
    cannot be loaded: a file that does not parse, an empty graph, external data outside its folder."""
    try:
        model = check_onnx_external_data(path, root)
    except ValueError as e:
        if "external data" in str(e):
            raise ModelProblem(str(e)) from None
        raise ModelProblem(f"model file {path} cannot be loaded ({type(e).__name__}: {e})") from None
    except Exception as e:  # the protobuf parser's own errors
        raise ModelProblem(f"model file {path} cannot be loaded ({type(e).__name__}: {e})") from None
    if model.ir_version <= 0 or not model.graph.node:
        raise ModelProblem(
            f"model file {path} cannot be loaded (no ir_version or an empty graph: an empty or foreign file?)"
        )
    return model


def check_onnx_external_data(path: Path, root: Path):
    """Refuse an ONNX file whose tensors point at external data outside its own directory.

    ONNX Runtime reads ``external_data`` locations relative to the model file; an absolute or
    ``..`` location (or a symlink out) would make it read any file the server can. The graph is
    parsed without its external data (~75 ms for the 41 MB heavy/large demo model).
    """
    import onnx
    from onnx import external_data_helper as edh

    model = onnx.load(str(path), load_external_data=False)
    base = path.resolve().parent
    for tensor in edh._get_all_tensors(model):
        if not edh.uses_external_data(tensor):
            continue
        loc = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (base / loc).resolve()
        if not loc or Path(loc).is_absolute() or not target.is_relative_to(base) or not target.is_relative_to(root):
            raise ValueError(
                f"{path}: tensor {tensor.name!r} reads external data from {loc!r}, "
                f"outside the model's directory; refused"
            )
    return model


def signature_mismatch(cfg: ModelConfig, model) -> str | None:
    """What in ``cfg`` (config.json) disagrees with the ONNX ``model``'s graph, naming the field to
    fix; None when they agree. Checked: the inputs are exactly the graph's (by name), and every
    tensor's datatype, rank and fixed dimensions; the first dimension is the batch, which the graph
    must leave dynamic (or fix at 1 for a ``max_batch_size`` of 1)."""
    from onnx import helper

    init = {t.name for t in model.graph.initializer}
    graph_in = {t.name: t for t in model.graph.input if t.name not in init}
    graph_out = {t.name: t for t in model.graph.output}
    names = [t.name for t in cfg.inputs]
    if set(names) != set(graph_in):
        return f"inputs {names} in config.json, but the ONNX graph takes {sorted(graph_in)} (fix 'inputs')"
    for kind, specs, graph in (("inputs", cfg.inputs, graph_in), ("outputs", cfg.outputs, graph_out)):
        for i, spec in enumerate(specs):
            t = graph.get(spec.name)
            where = f"'{kind}[{i}]' ({spec.name!r})"
            if t is None:
                return f"{where} is not an output of the ONNX graph; it has {sorted(graph)} (fix '{kind}')"
            tt = t.type.tensor_type
            try:
                onnx_dt = NUMPY_TO_V2.get(np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)), "BYTES")
            except (KeyError, TypeError, ValueError):
                onnx_dt = "an unknown type"
            if onnx_dt != spec.datatype:
                return f"{where} is {spec.datatype} in config.json, {onnx_dt} in the ONNX graph (fix its 'datatype')"
            if not tt.HasField("shape"):
                continue
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            want = [-1, *spec.shape]
            if dims and dims[0] > 0 and (dims[0] != 1 or cfg.max_batch_size != 1):
                return (
                    f"{where}: the ONNX graph fixes the batch dimension at {dims[0]}, but batches run 1.."
                    f"{cfg.max_batch_size} rows (export the graph with a dynamic first dimension, or, for a "
                    f"fixed 1, set 'max_batch_size' to 1)"
                )
            if len(dims) != len(want):
                return (
                    f"{where} has shape {want} in config.json (batch first), rank {len(dims)} in the ONNX "
                    f"graph {dims} (fix its 'shape')"
                )
            bad = [k for k in range(1, len(dims)) if dims[k] > 0 and want[k] != -1 and dims[k] != want[k]]
            if bad:
                return f"{where} has shape {want} in config.json, {dims} in the ONNX graph (fix its 'shape')"
    return None
