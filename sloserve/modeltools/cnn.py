"""The ``cnn`` demo model: convolutional nets on the 8x8 digits whose variants differ in cost on a GPU
as well as on a CPU.

On a GPU at these sizes a variant's cost is set by the number of kernels it launches, not by its
FLOPs, so the variants differ in depth (the node count of ONNX Runtime's optimized graph):

* ``large``: a ResNet-style stack: a stem conv, residual blocks of two 3x3 convs (BatchNorm folded
  into the convs at export) with identity adds, global average pooling and a linear read-out;
* ``medium``: two 3x3 convs and a linear read-out;
* ``small``: the image average-pooled to 4x4, one 3x3 conv of 4 channels and a linear read-out;

``fp16=True`` adds ``large-fp16``: ``large`` in FP16 (:func:`sloserve.modeltools.variants_build.convert_fp16`, as
``sloserve models variants`` makes it), where a GPU runs it. The default build leaves it out too: on
an H100 it is as accurate as ``large`` and 1.3-1.7x slower at batch sizes 1 to 64 (the graph is
launch-bound at these sizes, and its casts add kernels), so it trades nothing either.

``int8=True`` adds ``large-int8``: ``large`` statically quantized by ONNX Runtime (QDQ, the
calibration of ``sloserve models variants``, :func:`sloserve.modeltools.variants_build.quantize_int8`, on rows of
the training split). The default build leaves it out: it is as accurate as ``large`` but slower on a
CPU (2.4x at batch 1, 1.9x at batch 8: ONNX Runtime fuses about half of the convs into QLinearConv
and runs the rest in float between Quantize/Dequantize nodes, 211 nodes against 40), so it trades
nothing.

The nets are trained in PyTorch (seeded, deterministic, one thread) on the training split of
``sloserve models build`` and scored on its held-out split, like ``digits``. The input is ``[-1, 64]``
as ``digits``'s (values 0..16), so a client sends the same rows to both.

``sloserve models build`` does not train them: the package ships the three default variants, trained
and exported by this module, in ``sloserve/modeltools/prebuilt/cnn/`` (``<variant>/model.onnx``, the
``config.json`` the repository gets, and ``source.json``: the seed of the split, the PyTorch and ONNX
versions, each file's SHA-256). :func:`copy_prebuilt` copies them into the repository and scores them
again on the held-out split with ONNX Runtime; the build then profiles them on this machine as it
does every demo model. So a host without PyTorch (``make run`` installs none) serves the same ``cnn``
as one with it, byte for byte. Only ``sloserve models build --seed N`` with another seed than the
prebuilt files' trains the nets here, where PyTorch is installed (``pip install 'sloserve[train]'``).

To regenerate the prebuilt files (after changing :data:`ARCHS`, the training or the export), with
PyTorch installed, from the checkout's root::

    python -m sloserve.modeltools.cnn --out sloserve/modeltools/prebuilt/cnn

The build imports PyTorch here only, and only to train.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from sloserve.models.onnx_graph import classifier_model
from sloserve.models.repository import ModelConfig, TensorSpec, VariantConfig, write_config

NAME = "cnn"
OPSET = 17
TRAIN_HINT = "pip install 'sloserve[train]'"
PREBUILT_DIR = Path(__file__).parent / "prebuilt" / NAME  # <variant>/model.onnx, config.json, source.json
REGENERATE = "python -m sloserve.modeltools.cnn --out sloserve/modeltools/prebuilt/cnn"


@dataclass(frozen=True, slots=True)
class Arch:
    """One variant's net: ``pool`` (1: none, 2: 2x2 average pooling of the image first), plain 3x3
    conv layers ``convs`` as (channels, stride), then ``blocks`` residual blocks of ``channels``
    each, and the read-out: ``flatten`` (a linear layer on every position) or global average pooling."""

    pool: int
    convs: tuple[tuple[int, int], ...]
    blocks: int = 0
    flatten: bool = True
    epochs: int = 20
    shift: bool = False  # train on the images shifted by up to one pixel too


# (variant, architecture), the cheapest first
ARCHS: tuple[tuple[str, Arch], ...] = (
    ("small", Arch(pool=2, convs=((4, 1),), epochs=30)),
    ("medium", Arch(pool=1, convs=((8, 1), (16, 2)), epochs=20)),
    ("large", Arch(pool=1, convs=((16, 1),), blocks=16, flatten=False, epochs=20, shift=True)),
)


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# --- the nets in PyTorch ---------------------------------------------------------------------------


def _net(arch: Arch) -> Any:
    """The trainable net (Conv + BatchNorm + ReLU layers) of ``arch``, on rows of 64 values / 16."""
    import torch
    from torch import nn

    class ConvBN(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(cout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.conv(x))

    class Block(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.a, self.b = ConvBN(c, c, 1), ConvBN(c, c, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x + self.b(torch.relu(self.a(x))))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers, cin, side = [], 1, 8 // arch.pool
            for cout, stride in arch.convs:
                layers.append(ConvBN(cin, cout, stride))
                cin, side = cout, (side + stride - 1) // stride
            self.convs = nn.ModuleList(layers)
            self.blocks = nn.ModuleList([Block(cin) for _ in range(arch.blocks)])
            self.head = nn.Linear(cin * side * side if arch.flatten else cin, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x.reshape(-1, 1, 8, 8) / 16.0
            if arch.pool > 1:
                h = nn.functional.avg_pool2d(h, arch.pool)
            for layer in self.convs:
                h = torch.relu(layer(h))
            for block in self.blocks:
                h = block(h)
            h = h.flatten(1) if arch.flatten else h.mean(dim=(2, 3))
            return self.head(h)

    return Net()


def train(arch: Arch, x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    """Adam on a one-cycle learning rate, batches of 64 (images shifted by up to a pixel where
    ``arch.shift``), seeded; returns the net in eval mode."""
    import torch

    torch.manual_seed(seed)
    net = _net(arch)
    xt, yt = torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))
    shifted = torch.from_numpy(_shifted(x) if arch.shift else x[None].astype(np.float32))
    steps_per_epoch = (len(xt) + 63) // 64
    opt = torch.optim.Adam(net.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=arch.epochs * steps_per_epoch)
    gen = torch.Generator().manual_seed(seed)
    net.train()
    for _ in range(arch.epochs):
        order = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), 64):
            idx = order[i : i + 64]
            pick = torch.randint(len(shifted), (len(idx),), generator=gen)
            loss = torch.nn.functional.cross_entropy(net(shifted[pick, idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    return net.eval()


def _shifted(x: np.ndarray) -> np.ndarray:
    """The 8x8 images of ``x`` shifted by -1, 0 and 1 pixel in each direction (zeros shifted in):
    ``[9, rows, 64]``."""
    img = np.pad(x.reshape(-1, 8, 8).astype(np.float32), ((0, 0), (1, 1), (1, 1)))
    return np.stack(
        [img[:, 1 + dy : 9 + dy, 1 + dx : 9 + dx].reshape(-1, 64) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    )


# --- export ------------------------------------------------------------------------------------------


def _fold(layer: Any) -> tuple[np.ndarray, np.ndarray]:
    """A ConvBN's conv weights and bias with its BatchNorm (eval statistics) folded in."""
    bn = layer.bn
    scale = (bn.weight / (bn.running_var + bn.eps).sqrt()).detach().numpy()
    w = layer.conv.weight.detach().numpy() * scale[:, None, None, None]
    b = bn.bias.detach().numpy() - bn.running_mean.detach().numpy() * scale
    return w.astype(np.float32), b.astype(np.float32)


def to_onnx(net: Any, arch: Arch, name: str) -> onnx.ModelProto:
    """input[-1, 64] (0..16) -> probs[-1, 10], label[-1]: Conv (BatchNorm folded), Relu, Add,
    pooling and Gemm nodes, written by hand (no exporter, so the graph is what this says)."""
    inits = [numpy_helper.from_array(np.array([-1, 1, 8, 8], np.int64), "image_shape")]
    nodes = [helper.make_node("Reshape", ["input", "image_shape"], ["image"])]
    cur, n = "image", 0

    def conv(x: str, layer: Any, stride: int, relu: bool) -> str:
        nonlocal n
        w, b = _fold(layer)
        if n == 0:  # the input's scale (1/16) folded into the first conv (pooling before it is linear)
            w = w / np.float32(16.0)
        n += 1
        inits.extend([numpy_helper.from_array(w, f"conv{n}.w"), numpy_helper.from_array(b, f"conv{n}.b")])
        out = f"conv{n}"
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"conv{n}.w", f"conv{n}.b"],
                [out],
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride] * 2,
            )
        )
        if relu:
            nodes.append(helper.make_node("Relu", [out], [f"relu{n}"]))
            out = f"relu{n}"
        return out

    if arch.pool > 1:
        nodes.append(
            helper.make_node("AveragePool", [cur], ["pooled"], kernel_shape=[arch.pool] * 2, strides=[arch.pool] * 2)
        )
        cur = "pooled"
    for layer, (_, stride) in zip(net.convs, arch.convs, strict=True):
        cur = conv(cur, layer, stride, relu=True)
    for i, block in enumerate(net.blocks):
        h = conv(conv(cur, block.a, 1, relu=True), block.b, 1, relu=False)
        nodes.append(helper.make_node("Add", [cur, h], [f"res{i}"]))
        nodes.append(helper.make_node("Relu", [f"res{i}"], [f"block{i}"]))
        cur = f"block{i}"
    if arch.flatten:
        nodes.append(helper.make_node("Flatten", [cur], ["features"], axis=1))
    else:
        nodes.append(helper.make_node("GlobalAveragePool", [cur], ["gap"]))
        nodes.append(helper.make_node("Flatten", ["gap"], ["features"], axis=1))
    inits.extend(
        [
            numpy_helper.from_array(net.head.weight.detach().numpy().astype(np.float32), "head.w"),
            numpy_helper.from_array(net.head.bias.detach().numpy().astype(np.float32), "head.b"),
        ]
    )
    nodes.append(helper.make_node("Gemm", ["features", "head.w", "head.b"], ["logits"], transB=1))
    return classifier_model(nodes, inits, "logits", name, 64, OPSET)


def _torch_logits(net: Any, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return net(torch.from_numpy(x.astype(np.float32))).numpy()


def optimized_node_count(path: str | Path, provider: str = "CPUExecutionProvider") -> int:
    """Nodes in the graph ONNX Runtime runs after its optimizations (ORT_ENABLE_ALL) on ``provider``:
    on a GPU at these sizes, about the number of kernels a batch launches."""
    from sloserve.replica.runtime import ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        so.log_severity_level = 3
        ort.InferenceSession(str(path), sess_options=so, providers=[provider])
        return len(onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)


# --- the model ---------------------------------------------------------------------------------------


def build_cnn(
    repo: Path,
    x_tr: np.ndarray,
    y_tr: np.ndarray,
    x_te: np.ndarray,
    y_te: np.ndarray,
    seed: int = 0,
    log: Callable[[str], None] = print,
    archs: Sequence[tuple[str, Arch]] = ARCHS,
    int8: bool = False,
    fp16: bool = False,
    calib_rows: int = 256,
) -> ModelConfig:
    """Train, export and score every variant into ``repo/cnn/<variant>/model.onnx``; returns the
    config (variants most accurate first), not yet written. Needs PyTorch (:func:`torch_available`)."""
    import torch

    from sloserve.models.variants_check import split
    from sloserve.modeltools.variants_build import (
        convert_fp16,
        cuda_available,
        flops_per_row,
        param_count,
        predict,
        quantize_int8,
    )

    label = TensorSpec(name="label", datatype="INT64", shape=())
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)  # two threads on a shared two-core box ran 1x-5x slower, one stays ~11 s
    torch.use_deterministic_algorithms(True)
    variants: list[VariantConfig] = []
    try:
        for vname, arch in archs:
            t0 = time.perf_counter()
            net = train(arch, x_tr, y_tr, seed)
            model = to_onnx(net, arch, f"{NAME}_{vname}")
            out = _save(model, repo / NAME / vname / "model.onnx")
            pred = predict(out, x_te, "input", label)
            acc = float((pred == y_te).mean())
            agree = float((pred == _torch_logits(net, x_te).argmax(1)).mean())
            if agree < 0.99:  # the hand-written graph must compute what the trained net computes
                raise RuntimeError(f"{NAME}/{vname}: the ONNX graph agrees with the trained net on only {agree:.1%}")
            variants.append(
                VariantConfig(
                    name=vname, accuracy=round(acc, 4), cost_flops=flops_per_row(model), params=param_count(model)
                )
            )
            log(
                f"  {NAME}/{vname}: accuracy={acc:.4f} flops/row={variants[-1].cost_flops:,.0f} "
                f"nodes={optimized_node_count(out)} (trained in {time.perf_counter() - t0:.1f}s)"
            )
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    large = repo / NAME / archs[-1][0] / "model.onnx"
    derived: list[tuple[str, Callable[[Path], None], str]] = []
    if int8:
        calib, _ = split(len(x_tr), min(calib_rows, len(x_tr) - 1) / len(x_tr), seed)
        derived.append(("int8", lambda dst: quantize_int8(large, dst, "input", x_tr[calib].astype(np.float32)), "cpu"))
    if fp16 and cuda_available():
        derived.append(("fp16", lambda dst: convert_fp16(large, dst), "cuda"))
    for kind, make, device in derived:
        vname = f"{archs[-1][0]}-{kind}"
        t0 = time.perf_counter()
        dst = repo / NAME / vname / "model.onnx"
        dst.parent.mkdir(parents=True, exist_ok=True)
        make(dst)
        model = onnx.load(str(dst))
        acc = float((predict(dst, x_te, "input", label, device) == y_te).mean())
        variants.append(
            VariantConfig(
                name=vname, accuracy=round(acc, 4), cost_flops=flops_per_row(model), params=param_count(model)
            )
        )
        log(f"  {NAME}/{vname}: accuracy={acc:.4f} nodes={optimized_node_count(dst)} ({time.perf_counter() - t0:.1f}s)")
    return ModelConfig(
        name=NAME,
        inputs=(TensorSpec(name="input", datatype="FP32", shape=(64,)),),
        outputs=(TensorSpec(name="probs", datatype="FP32", shape=(10,)), label),
        max_batch_size=64,
        slo_ms=20.0,
        variants=tuple(sorted(variants, key=lambda v: (-v.accuracy, v.cost_flops))),
        description="the 8x8 digits (64 values, 0..16, as digits) through convolutional nets: the variants differ "
        "in depth, so they trade cost for accuracy on a GPU (kernel launches) as on a CPU (FLOPs)",
    )


def _save(model: onnx.ModelProto, out: Path) -> Path:
    return _save_bytes(model.SerializeToString(), out)


def _save_bytes(data: bytes, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return out


# --- the prebuilt variants ---------------------------------------------------------------------------


def prebuilt_source(src: Path = PREBUILT_DIR) -> dict[str, Any]:
    """``source.json`` of the prebuilt variants: ``seed`` (of the digits split they were trained and
    scored on), ``torch`` and ``onnx`` (the versions that made them), ``sha256`` (variant: the digest of
    its ``model.onnx``) and ``command`` (the one that regenerates them)."""
    return dict(json.loads((src / "source.json").read_text()))


def prebuilt_config(src: Path = PREBUILT_DIR) -> ModelConfig:
    """The ``config.json`` the prebuilt variants come with (accuracies on their seed's held-out split)."""
    return ModelConfig.model_validate_json((src / "config.json").read_text())


def copy_prebuilt(
    repo: Path,
    x_te: np.ndarray,
    y_te: np.ndarray,
    seed: int = 0,
    log: Callable[[str], None] = print,
    src: Path = PREBUILT_DIR,
) -> ModelConfig:
    """Copy the prebuilt variants into ``repo/cnn/<variant>/model.onnx``; returns their config (variants
    most accurate first), not yet written. Needs no PyTorch.

    Where ``seed`` is the one they were trained with, ``x_te``/``y_te`` is their held-out split: each
    variant is scored on it again with ONNX Runtime and the measured accuracy goes into the config,
    as for the models trained here. With another seed that split may hold rows they were trained on,
    so the accuracies stay those of ``config.json``, and the log says so."""
    from sloserve.modeltools.variants_build import predict

    cfg, source = prebuilt_config(src), prebuilt_source(src)
    rescore = seed == source["seed"]
    label = next(t for t in cfg.outputs if t.name == "label")
    variants: list[VariantConfig] = []
    for v in cfg.variants:
        out = _save_bytes((src / v.name / "model.onnx").read_bytes(), repo / NAME / v.name / "model.onnx")
        acc = float((predict(out, x_te, "input", label) == y_te).mean()) if rescore else v.accuracy
        variants.append(v.model_copy(update={"accuracy": round(acc, 4)}))
        log(
            f"  {NAME}/{v.name}: accuracy={acc:.4f} flops/row={v.cost_flops:,.0f} nodes={optimized_node_count(out)} "
            f"(prebuilt: trained in PyTorch {source['torch']} on seed {source['seed']}'s split)"
        )
    if not rescore:
        log(
            f"  {NAME}: accuracies as measured on seed {source['seed']}'s held-out split, not seed {seed}'s "
            f"(it may hold their training rows); to train them on seed {seed}'s split: {TRAIN_HINT}"
        )
    return cfg.model_copy(update={"variants": tuple(sorted(variants, key=lambda v: (-v.accuracy, v.cost_flops)))})


def write_prebuilt(
    out: Path, seed: int = 0, log: Callable[[str], None] = print, archs: Sequence[tuple[str, Arch]] = ARCHS
) -> ModelConfig:
    """Train and export ``archs`` (:func:`build_cnn`, on the digits split of ``sloserve models build
    --seed``) into ``out``: ``<variant>/model.onnx``, ``config.json`` and ``source.json``
    (:func:`prebuilt_source`). Needs PyTorch."""
    import torch

    from sloserve.modeltools.data import digits_split

    x_tr, x_te, y_tr, y_te = digits_split(seed)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = build_cnn(Path(tmp), x_tr, y_tr, x_te, y_te, seed=seed, log=log, archs=archs)
        names = {v.name for v in cfg.variants}
        for stale in out.glob("*/model.onnx"):  # a variant no longer built
            if stale.parent.name not in names:
                stale.unlink()
                stale.parent.rmdir()
        digests = {}
        for v in cfg.variants:
            data = (Path(tmp) / NAME / v.name / "model.onnx").read_bytes()
            _save_bytes(data, out / v.name / "model.onnx")
            digests[v.name] = hashlib.sha256(data).hexdigest()
        _save_bytes(write_config(Path(tmp), cfg).read_bytes(), out / "config.json")  # as the repository gets it
    source = {
        "seed": seed,
        "torch": torch.__version__.split("+")[0],
        "onnx": onnx.__version__,
        "sha256": digests,
        "command": REGENERATE,
    }
    (out / "source.json").write_text(json.dumps(source, indent=2) + "\n")
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sloserve.modeltools.cnn",
        description="Train the cnn demo variants in PyTorch and write them where `sloserve models build` "
        "takes them from (its prebuilt files).",
    )
    p.add_argument("--out", type=Path, default=PREBUILT_DIR, help=f"the folder to write (default: {PREBUILT_DIR})")
    p.add_argument("--seed", type=int, default=0, help="the seed of the digits split and of the training")
    a = p.parse_args(argv)
    if not torch_available():
        print(
            f"python -m sloserve.modeltools.cnn: trains in PyTorch, which is not installed: {TRAIN_HINT}",
            file=sys.stderr,
        )
        return 2
    print(f"training {NAME} into {a.out} ...", flush=True)
    write_prebuilt(a.out, seed=a.seed)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
