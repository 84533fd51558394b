"""``sloserve models variants``: turn one ONNX model and a labelled validation set into a served model
whose accuracy variants really trade accuracy for cost, each measured.

From ``VAL.npz`` (``x``: rows of the model's first input; ``y``: an integer label per row) a seeded
split takes a calibration part and a held-out part. The variants:

* ``fp32``: the model as given;
* ``int8``: ONNX Runtime's static quantization (QDQ), calibrated on the calibration part;
* ``fp16``: the graph in half precision with FP32 inputs and outputs, only where a GPU runs it;
* any ``NAME=PATH`` model the user supplies, with the original's inputs and outputs.

Each is scored on the held-out part (accuracy against ``y``, agreement with the original's argmax),
profiled per batch size on every device type present (:func:`models.profiler.profile_repo`, the
profiler of ``sloserve models build``), and written as ``<repo>/<name>/config.json`` (variants most
accurate first) and ``<repo>/<name>/<variant>/model.onnx``, all in a temporary folder first: bad input
writes nothing, and the model folder appears whole or not at all.

>>> from models.variants import generate_variants  # doctest: +SKIP
>>> generate_variants("model.onnx", "val.npz", "mymodel", "model_repository")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from tqdm import tqdm

from models.datatypes import NUMPY_TO_V2, V2_TO_NUMPY
from models.repository import ModelConfig, ModelProblem, TensorSpec, VariantConfig, check_name, load_model_dir
from models.runtime import CPU, CUDA, RuntimeOptions, gpu_present, make_session, ort

KINDS = ("fp32", "fp16", "int8")
logger = logging.getLogger(__name__)


class VariantsError(ValueError):
    """Input ``sloserve models variants`` cannot use, saying what to fix; nothing has been written."""


@dataclass(frozen=True, slots=True)
class Signature:
    """A graph's inputs and outputs as config.json names them (shapes without the batch dimension)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(slots=True)
class Variant:
    """One built variant and what was measured on it."""

    name: str
    path: Path
    kind: str  # fp32 | fp16 | int8 | extra
    accuracy: float = 0.0
    agreement: float = 0.0
    size_bytes: int = 0
    params: int = 0
    cost_flops: float = 0.0
    p50_ms: dict[str, dict[int, float]] = field(default_factory=dict)  # device type -> batch -> ms


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


# --- building and scoring ---------------------------------------------------------------------------


def quantize_int8(src: Path, dst: Path, input_name: str, calib_x: np.ndarray, batch: int = 32) -> None:
    """Static INT8 quantization (QDQ, per-channel weights), activation ranges from ``calib_x``, after
    ONNX Runtime's pre-processing (shape inference and graph optimization) where it succeeds."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = dst.with_name("preprocessed.onnx")
    try:  # symbolic shape inference would need sympy; ONNX's own shape inference is enough for static shapes
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        src = pre
    except Exception as e:  # an op the optimizer cannot take: quantize the graph as given
        logger.info("int8: pre-processing %s failed (%s: %s); quantizing it as given", src, type(e).__name__, e)

    class Calibration(CalibrationDataReader):
        """The calibration rows, ``batch`` at a time."""

        def __init__(self) -> None:
            self.batches = iter([{input_name: calib_x[i : i + batch]} for i in range(0, len(calib_x), batch)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantize_static(
        str(src),
        str(dst),
        Calibration(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    pre.unlink(missing_ok=True)


def convert_fp16(src: Path, dst: Path) -> None:
    """The graph in FP16 with its inputs and outputs kept FP32 (the served signature is unchanged)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(dst))


def cuda_available() -> bool:
    """ONNX Runtime offers CUDA and a GPU is visible: where FP16 pays and a CUDA profile is taken."""
    return CUDA in ort.get_available_providers() and gpu_present()


def predict(path: Path, x: np.ndarray, input_name: str, output: TensorSpec, device: str = "cpu") -> np.ndarray:
    """The class each row gets: the argmax of ``output`` (or the output itself if it is a label)."""
    sess = make_session(path, RuntimeOptions(device=device))  # the serving session's providers and options
    outs = [sess.run([output.name], {input_name: x[i : i + 256]})[0] for i in range(0, len(x), 256)]
    out = np.concatenate(outs)
    return out.astype(np.int64) if out.ndim == 1 else out.argmax(axis=1)


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


def flops_per_row(model: onnx.ModelProto) -> float:
    """Multiply-adds x2 per row of MatMul, Gemm and Conv nodes, from ONNX shape inference at batch 1
    (nodes whose shapes it cannot infer count 0)."""
    from onnx import numpy_helper, shape_inference

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.input:
        dims = t.type.tensor_type.shape.dim
        for i, d in enumerate(dims):
            if not d.HasField("dim_value"):
                d.dim_value = 1 if i == 0 else d.dim_value
    try:
        m = shape_inference.infer_shapes(m)
    except Exception:
        return 0.0
    shapes: dict[str, list[int]] = {}
    for vi in [*m.graph.input, *m.graph.value_info, *m.graph.output]:
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
    for t in m.graph.initializer:
        shapes[t.name] = list(numpy_helper.to_array(t).shape) if t.data_location == 0 else list(t.dims)
    total = 0.0
    for n in m.graph.node:
        out = shapes.get(n.output[0], [])
        a = shapes.get(n.input[0], []) if n.input else []
        w = shapes.get(n.input[1], []) if len(n.input) > 1 else []
        if not out or 0 in out or not a:
            continue
        if n.op_type in ("MatMul", "Gemm"):
            k = a[0] if n.op_type == "Gemm" and any(x.name == "transA" and x.i for x in n.attribute) else a[-1]
            total += 2.0 * float(np.prod(out)) * k
        elif n.op_type == "Conv" and len(w) >= 3:
            total += 2.0 * float(np.prod(out)) * float(np.prod(w[1:]))
    return total


def param_count(model: onnx.ModelProto) -> int:
    return int(sum(np.prod(t.dims) for t in model.graph.initializer if len(t.dims) >= 1))


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


# --- the command ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``generate_variants`` will build, every input checked; nothing written yet."""

    name: str
    source: Path
    sig: Signature
    output: TensorSpec
    kinds: tuple[str, ...]
    extras: dict[str, Path]
    x: np.ndarray
    y: np.ndarray
    calib: np.ndarray  # row indices
    held: np.ndarray
    reference: np.ndarray  # the original's classes on the held-out rows


def plan_variants(
    onnx_path: str | Path,
    val_path: str | Path,
    name: str,
    kinds: Sequence[str] | None = None,
    extras: Sequence[str] = (),
    output: str | None = None,
    calib_fraction: float = 0.3,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> Plan:
    """Check every input (raising :class:`VariantsError`) and run the original on the held-out rows."""
    try:
        check_name("model", name)
    except ValueError as e:
        raise VariantsError(str(e)) from None
    asked = tuple(kinds) if kinds is not None else KINDS
    unknown = sorted(set(asked) - set(KINDS))
    if unknown or not asked:
        raise VariantsError(f"--kinds {','.join(asked)}: choose among {','.join(KINDS)}")
    if "fp16" in asked and not cuda_available():
        if kinds is not None:
            raise VariantsError(
                "--kinds asks for fp16, but no GPU runs it here (ONNX Runtime offers "
                f"{ort.get_available_providers()}): FP16 pays only on a GPU; install sloserve[gpu] on a GPU "
                "host, or leave fp16 out"
            )
        log("note: no GPU with ONNX Runtime's CUDA provider here, so no fp16 variant (it pays only on a GPU)")
        asked = tuple(k for k in asked if k != "fp16")
    source = Path(onnx_path)
    model = load_onnx(source, "model")
    sig = graph_signature(model, str(source))
    if len(sig.inputs) != 1:
        raise VariantsError(
            f"{source} takes {len(sig.inputs)} inputs {[t.name for t in sig.inputs]}; models variants needs "
            "a model with one input (the x of the validation set)"
        )
    out = scored_output(sig, output)
    extra_paths = parse_extras(extras, asked)
    for vname, path in extra_paths.items():
        other = graph_signature(load_onnx(path, f"extra variant {vname!r}:"), str(path))
        diff = same_signature(sig, other)
        if diff:
            raise VariantsError(f"extra variant {vname!r} ({path}) does not serve the same tensors: {diff}")
    x, y = load_validation(val_path, sig)
    calib, held = split(len(x), calib_fraction, seed)
    inp = sig.inputs[0].name
    try:
        sess = ort.InferenceSession(str(source), providers=[CPU])
        scores = sess.run([out.name], {inp: x[:1]})[0]
    except Exception as e:  # ONNX Runtime's own errors: a graph it cannot run, x it cannot take
        raise VariantsError(f"ONNX Runtime cannot run {source} on x ({type(e).__name__}: {e})") from None
    if scores.ndim == 2 and int(y.max()) >= scores.shape[1]:
        raise VariantsError(
            f"validation set {val_path}: y holds label {int(y.max())}, but the output {out.name!r} scores "
            f"{scores.shape[1]} classes (0..{scores.shape[1] - 1}); are the labels for this model?"
        )
    reference = predict(source, x[held], inp, out)
    return Plan(name, source, sig, out, asked, extra_paths, x, y, calib, held, reference)


def build_and_score(plan: Plan, folder: Path, bar: tqdm) -> list[Variant]:
    """Write each variant's ``model.onnx`` under ``folder`` and measure its accuracy and agreement."""
    inp = plan.sig.inputs[0].name
    jobs: list[tuple[str, str, Path | None]] = [(k, k, None) for k in plan.kinds]
    jobs += [(n, "extra", p) for n, p in plan.extras.items()]
    out: list[Variant] = []
    for vname, kind, src in jobs:
        bar.set_postfix_str(f"building {vname}")
        dst = folder / vname / "model.onnx"
        dst.parent.mkdir(parents=True)
        if kind == "int8":
            quantize_int8(plan.source, dst, inp, plan.x[plan.calib])
        elif kind == "fp16":
            convert_fp16(plan.source, dst)
        else:  # the original or a user's model: one self-contained file
            onnx.save(onnx.load(str(src or plan.source)), str(dst))
        graph = onnx.load(str(dst))
        diff = same_signature(plan.sig, graph_signature(graph, str(dst)))
        if diff:
            raise VariantsError(f"the {vname} variant changed the served tensors: {diff}")
        pred = predict(dst, plan.x[plan.held], inp, plan.output, "cuda" if kind == "fp16" else "cpu")
        v = Variant(vname, dst, kind, size_bytes=dst.stat().st_size, params=param_count(graph))
        v.accuracy = round(float((pred == plan.y[plan.held]).mean()), 4)
        v.agreement = round(float((pred == plan.reference).mean()), 4)
        v.cost_flops = flops_per_row(graph)
        out.append(v)
        bar.update()
    return out


def model_config(plan: Plan, variants: Sequence[Variant], max_batch: int, slo_ms: float) -> ModelConfig:
    return ModelConfig(
        name=plan.name,
        inputs=plan.sig.inputs,
        outputs=plan.sig.outputs,
        max_batch_size=max_batch,
        slo_ms=slo_ms,
        variants=tuple(
            VariantConfig(name=v.name, accuracy=v.accuracy, cost_flops=v.cost_flops, params=v.params) for v in variants
        ),
        description=f"variants of {plan.source.name} by sloserve models variants: accuracy on {len(plan.held)} "
        f"held-out rows, int8 calibrated on {len(plan.calib)}",
    )


def profile_variants(
    root: Path, name: str, variants: Sequence[Variant], iters: int, devices: Sequence[str]
) -> list[Path]:
    """Profile every variant on each device (``models.profiler.profile_repo``, the build's profiler)
    and keep the p50 per batch size on each :class:`Variant`."""
    from models.profiler import profile_repo

    by_name = {v.name: v for v in variants}
    written: list[Path] = []
    for device in devices:
        for path in profile_repo(root, RuntimeOptions(device=device), iters=iters, warmup=3, models=[name]):
            doc = json.loads(path.read_text())
            by_name[doc["variant"]].p50_ms[doc["device_type"]] = dict(
                zip(doc["batch_sizes"], doc["p50_ms"], strict=True)
            )
            written.append(path)
    return written


def generate_variants(
    onnx_path: str | Path,
    val_path: str | Path,
    name: str,
    repo: str | Path,
    kinds: Sequence[str] | None = None,
    extras: Sequence[str] = (),
    *,
    output: str | None = None,
    force: bool = False,
    max_batch: int = 64,
    slo_ms: float = 50.0,
    calib_fraction: float = 0.3,
    seed: int = 0,
    profile_iters: int = 30,
    log: Callable[[str], None] = print,
) -> list[Variant]:
    """Build, measure and write ``<repo>/<name>`` (see the module's doc); returns the variants, most
    accurate first. Raises :class:`VariantsError` on bad input, having written nothing."""
    from models.variants_report import plot, report, table

    repo = Path(repo)
    target = repo / name
    if target.exists() and not force:
        raise VariantsError(f"{target} exists; pass --force to replace it, or choose another --name")
    if not 1 <= max_batch <= 4096:
        raise VariantsError(f"--max-batch {max_batch}: between 1 and 4096")
    plan = plan_variants(onnx_path, val_path, name, kinds, extras, output, calib_fraction, seed, log)
    devices = ["cpu", *(["cuda"] if cuda_available() else [])]
    parent = repo if repo.is_dir() else repo.resolve().parent
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.variants-", dir=parent if parent.is_dir() else None))
    try:
        stage = tmp / "repo"
        folder = stage / name
        steps = len(plan.kinds) + len(plan.extras)
        with tqdm(total=steps, desc=f"variants of {plan.source.name}", unit="variant") as bar:
            variants = build_and_score(plan, folder, bar)
        (folder / "config.json").write_text(_config_json(plan, variants, max_batch, slo_ms))
        if profile_iters > 0:
            profile_variants(stage, name, variants, profile_iters, devices)
        first = next(iter(variants[0].p50_ms), None)
        variants.sort(key=lambda v: (-v.accuracy, v.p50_ms.get(first, {}).get(1, 0.0) if first else v.size_bytes))
        (folder / "config.json").write_text(_config_json(plan, variants, max_batch, slo_ms))
        (folder / "variants.json").write_text(report(plan, variants, devices) + "\n")
        if profile_iters > 0:
            plot(folder / "variants.png", name, variants)
        try:
            load_model_dir(stage, name)
        except ModelProblem as e:  # a variant the server would refuse: nothing goes into the repository
            raise VariantsError(f"the generated model fails the repository's check: {e}") from None
        if target.exists() and not force:
            raise VariantsError(f"{target} appeared meanwhile; pass --force to replace it")
        repo.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.rename(tmp / "replaced")
        shutil.move(str(folder), str(target))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(table(variants))
    log(f"wrote {target} ({len(variants)} variants){'; plot ' + str(target / 'variants.png') if profile_iters else ''}")
    for v in variants:
        v.path = target / v.name / "model.onnx"
    return variants


def _config_json(plan: Plan, variants: Sequence[Variant], max_batch: int, slo_ms: float) -> str:
    return json.dumps(model_config(plan, variants, max_batch, slo_ms).model_dump(mode="json"), indent=2) + "\n"


def export_demo_validation(out_dir: str | Path, seed: int = 0) -> list[Path]:
    """The demo models' held-out rows (the split ``sloserve models build`` scores them on) as
    ``<out_dir>/digits_val.npz`` and ``<out_dir>/heavy_val.npz``: the inputs of a ``models variants`` run
    on the demo models."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from models.build import _upsample

    data = load_digits()
    _, x, _, y = train_test_split(
        data.data.astype(np.float32), data.target, test_size=0.25, random_state=seed, stratify=data.target
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "digits_val.npz", x=x, y=y)
    np.savez(out / "heavy_val.npz", x=_upsample(x), y=y)
    return [out / "digits_val.npz", out / "heavy_val.npz"]
