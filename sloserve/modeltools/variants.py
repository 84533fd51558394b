"""``sloserve models variants``: turn one ONNX model and a labelled validation set into a served model
whose accuracy variants really trade accuracy for cost, each measured.

From ``VAL.npz`` (``x``: rows of the model's first input; ``y``: an integer label per row) a seeded
split takes a calibration part and a held-out part. The variants:

* ``fp32``: the model as given;
* ``int8``: ONNX Runtime's static quantization (QDQ), calibrated on the calibration part;
* ``fp16``: the graph in half precision with FP32 inputs and outputs, only where a GPU runs it;
* any ``NAME=PATH`` model the user supplies, with the original's inputs and outputs.

Each is scored on the held-out part (accuracy against ``y``, agreement with the original's argmax),
profiled per batch size on every device type present (:func:`sloserve.modeltools.profiler.profile_repo`, the
profiler of ``sloserve models build``), and written as ``<repo>/<name>/config.json`` (variants most
accurate first) and ``<repo>/<name>/<variant>/model.onnx``, all in a temporary folder first: bad input
writes nothing, and the model folder appears whole or not at all.

>>> from sloserve.modeltools.variants import generate_variants  # doctest: +SKIP
>>> generate_variants("model.onnx", "val.npz", "mymodel", "model_repository")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from tqdm import tqdm

from sloserve.models.repository import ModelConfig, ModelProblem, VariantConfig, check_name, load_model_dir
from sloserve.models.variants_check import (
    VariantsError,
    graph_signature,
    load_onnx,
    load_validation,
    parse_extras,
    same_signature,
    scored_output,
    split,
)
from sloserve.modeltools.variants_build import (
    convert_fp16,
    cuda_available,
    flops_per_row,
    param_count,
    predict,
    quantize_int8,
)
from sloserve.modeltools.variants_types import Plan, Variant
from sloserve.replica.runtime import CPU, RuntimeOptions, ort

KINDS = ("fp32", "fp16", "int8")
__all__ = [
    "KINDS",
    "Plan",
    "Variant",
    "VariantsError",
    "convert_fp16",
    "cuda_available",
    "export_demo_validation",
    "flops_per_row",
    "generate_variants",
    "graph_signature",
    "load_validation",
    "plan_variants",
    "same_signature",
    "split",
]


# --- the command ------------------------------------------------------------------------------------


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
    """Profile every variant on each device (``sloserve.modeltools.profiler.profile_repo``, the build's profiler)
    and keep the p50 per batch size on each :class:`Variant`."""
    from sloserve.modeltools.profiler import profile_repo

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
    from sloserve.modeltools.variants_report import plot, report, table

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

    from sloserve.modeltools.demo import _upsample

    data = load_digits()
    _, x, _, y = train_test_split(
        data.data.astype(np.float32), data.target, test_size=0.25, random_state=seed, stratify=data.target
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "digits_val.npz", x=x, y=y)
    np.savez(out / "heavy_val.npz", x=_upsample(x), y=y)
    return [out / "digits_val.npz", out / "heavy_val.npz"]
