"""Build the demo model repository locally, with no downloads.

* ``digits``: 8x8 digit images (64 values, 0..16) -> 10 class probabilities and a label.
  Variants really differ in accuracy and compute: ``small`` is a linear classifier on a 4x4
  average-pooled image, ``medium`` an MLP with one hidden layer of 64, ``large`` an MLP 512x512.
* ``heavy``: the same digits upsampled to 32x32 (1,024 values); ``large`` is a net with three
  hidden ReLU layers of 2,048 (random features, ridge read-out) (batch-1 CPU latency ~1-2 ms, per-row cost falling ~8x by batch 64),
  ``medium`` a linear classifier on the 4x4-pooled (8x8) image, ``small`` one on the 8x8-pooled
  (4x4) image: cheap variants that are really less accurate (~0.93 and ~0.83 against ~0.98).
* ``cnn``: the digits (``[-1, 64]``, as ``digits``) through convolutional nets, whose variants differ
  in depth, so in cost on a GPU as well as on a CPU (:mod:`sloserve.modeltools.cnn`). They are trained in
  PyTorch ahead of time and ship in the package (``sloserve/modeltools/prebuilt/cnn/``), so the build
  copies them, with or without PyTorch, and scores them again; only with another ``seed`` than theirs
  does it train them, where PyTorch is installed (``sloserve[train]``).

Held-out accuracy (stratified 25% split, fixed seed) is measured and written into each
model's ``config.json``; so is each variant's cost in FLOPs per row.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from sloserve.models.onnx_graph import classifier_model
from sloserve.models.repository import ModelConfig, TensorSpec, VariantConfig, write_config
from sloserve.modeltools import cnn
from sloserve.modeltools.data import digits_split

OPSET = 17


@dataclass
class Dense:
    weights: list[np.ndarray]
    biases: list[np.ndarray]

    @property
    def flops_per_row(self) -> float:
        return float(sum(2 * w.shape[0] * w.shape[1] for w in self.weights))

    @property
    def params(self) -> int:
        return int(sum(w.size + b.size for w, b in zip(self.weights, self.biases, strict=True)))


def mlp_to_onnx(net: Dense, n_in: int, scale: float, pre: np.ndarray | None, name: str) -> onnx.ModelProto:
    """input[-1, n_in] * scale (@ pre) -> Dense/ReLU stack -> probs[-1, 10], label[-1]."""
    inits = [numpy_helper.from_array(np.array([scale], np.float32), "scale")]
    nodes = [helper.make_node("Mul", ["input", "scale"], ["x0"])]
    cur = "x0"
    if pre is not None:
        inits.append(numpy_helper.from_array(pre.astype(np.float32), "pool"))
        nodes.append(helper.make_node("MatMul", [cur, "pool"], ["xp"]))
        cur = "xp"
    for i, (w, b) in enumerate(zip(net.weights, net.biases, strict=True)):
        inits += [
            numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
            numpy_helper.from_array(b.astype(np.float32), f"b{i}"),
        ]
        nodes.append(helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]))
        cur = f"a{i}"
        if i < len(net.weights) - 1:
            nodes.append(helper.make_node("Relu", [cur], [f"r{i}"]))
            cur = f"r{i}"
    return classifier_model(nodes, inits, cur, name, n_in, OPSET)


def _pool_matrix(side: int, factor: int) -> np.ndarray:
    """A (side*side, (side/factor)^2) matrix averaging factor x factor blocks."""
    out = side // factor
    m = np.zeros((side * side, out * out), np.float32)
    for r in range(side):
        for c in range(side):
            m[r * side + c, (r // factor) * out + c // factor] = 1.0 / (factor * factor)
    return m


def _upsample(x64: np.ndarray) -> np.ndarray:
    """8x8 -> 32x32 by bilinear-ish interpolation (separable linear interpolation)."""
    imgs = x64.reshape(-1, 8, 8)
    src = np.linspace(0, 7, 32)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, 7)
    fr = (src - lo).astype(np.float32)
    rows = imgs[:, lo, :] * (1 - fr)[None, :, None] + imgs[:, hi, :] * fr[None, :, None]
    out = rows[:, :, lo] * (1 - fr)[None, None, :] + rows[:, :, hi] * fr[None, None, :]
    return out.reshape(-1, 1024).astype(np.float32)


def _train(hidden: tuple[int, ...], x: np.ndarray, y: np.ndarray, seed: int, epochs: int) -> Dense:
    if epochs == 0:
        return _random_features(hidden, x, y, seed)
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        if not hidden:
            clf = LogisticRegression(max_iter=epochs, C=0.05).fit(x, y)
            return Dense([clf.coef_.T.copy()], [clf.intercept_.copy()])
        clf = MLPClassifier(
            hidden_layer_sizes=hidden,
            max_iter=epochs,
            random_state=seed,
            batch_size=128,
            learning_rate_init=1e-3,
            alpha=1e-4,
        )
        clf.fit(x, y)
    return Dense([w.copy() for w in clf.coefs_], [b.copy() for b in clf.intercepts_])


def _random_features(hidden: tuple[int, ...], x: np.ndarray, y: np.ndarray, seed: int) -> Dense:
    """A deep random-feature ReLU net with a ridge-regression read-out (closed form, seconds).

    Hidden layers are He-initialised and fixed; only the read-out is fitted. The ridge strength
    is chosen on a validation split of the training data, never on the test split.
    """
    rng = np.random.default_rng(seed)
    sizes = (x.shape[1], *hidden)
    ws = [
        (rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32)
        for a, b in zip(sizes, sizes[1:], strict=False)
    ]
    bs = [(rng.standard_normal(b) * 0.1).astype(np.float32) for b in hidden]
    ws[0] = ws[0].copy()
    bs[0] = bs[0] - 0.25 * ws[0].sum(0)  # centre the 0..1 inputs

    def feats(a: np.ndarray) -> np.ndarray:
        h = a
        for w, b in zip(ws, bs, strict=True):
            h = np.maximum(h @ w + b, 0.0)
        return h

    def fit(h: np.ndarray, labels: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
        t = np.eye(10, dtype=np.float64)[labels]
        hm, tm = h.mean(0), t.mean(0)
        a = (h - hm).T @ (h - hm) + lam * len(h) * np.eye(h.shape[1])
        w = np.linalg.solve(a, (h - hm).T @ (t - tm))
        return w.astype(np.float32), (tm - hm @ w).astype(np.float32)

    h = feats(x).astype(np.float64)
    n_val = len(h) // 5
    best = max(
        (1e-3, 1e-2, 1e-1),
        key=lambda lam: ((h[:n_val] @ fit(h[n_val:], y[n_val:], lam)[0]).argmax(1) == y[:n_val]).mean(),
    )
    wo, bo = fit(h, y, best)
    return Dense(ws + [wo], bs + [bo])


def _accuracy(model: onnx.ModelProto, x: np.ndarray, y: np.ndarray) -> float:
    from sloserve.replica.runtime import ort  # a clear error names the extras when no ONNX Runtime is installed

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    label = sess.run(["label"], {"input": x.astype(np.float32)})[0]
    return float((label == y).mean())


# (variant, hidden layers, pooling factor or None, max_iter; 0 = random features + ridge read-out)
DIGITS_VARIANTS = [("small", (), 2, 200), ("medium", (64,), None, 300), ("large", (512, 512), None, 200)]
# heavy's cheap variants are linear read-outs of pooled images, so they are far less accurate than
# large (about 0.83 / 0.93 / 0.98): the spread that makes degrading under a burst a real trade.
HEAVY_VARIANTS = [("small", (), 8, 200), ("medium", (), 4, 300), ("large", (2048, 2048, 2048), None, 0)]


MEASURED_DIR = Path(__file__).parent / "measured"


def copy_measured_profiles(
    repo: Path, models: list[str], log: Callable[[str], None] = print, measured: Path = MEASURED_DIR
) -> list[Path]:
    """Put the profiles measured on other hardware (``sloserve/modeltools/measured/<model>/<variant>/<device>.json``,
    e.g. an H100 through ONNX Runtime's CUDA provider) into the repository beside this host's own.

    Each is keyed by its device type, so a host uses the one of its own hardware; a GPU host that
    skips profiling (``--profile-iters 0``) starts from the measured curve of its GPU instead of a
    foreign one. A profile already in the repository (a local measurement) is never overwritten.
    """
    copied = []
    for src in sorted(measured.glob("*/*/*.json")):
        model, variant = src.parts[-3], src.parts[-2]
        dst = repo / model / variant / "profiles" / src.name
        if model in models and dst.parent.parent.is_dir() and not dst.exists():
            dst.parent.mkdir(exist_ok=True)
            dst.write_bytes(src.read_bytes())
            copied.append(dst)
    if copied:
        log(f"  measured profiles from other hardware: {len(copied)} ({', '.join(sorted({p.stem for p in copied}))})")
    return copied


DEMO_MODELS = ("digits", "heavy", "cnn")


def build_demo(
    repo: str | Path, seed: int = 0, log: Callable[[str], None] = print, models: tuple[str, ...] = DEMO_MODELS
) -> list[ModelConfig]:
    """Train, export, measure and write the ``digits`` and ``heavy`` models into ``repo``, and the ``cnn``
    model from its prebuilt files (trained here instead with another ``seed`` than theirs, where PyTorch
    is installed); only those of ``models``."""
    unknown = sorted(set(models) - set(DEMO_MODELS))
    if unknown:
        raise ValueError(f"unknown demo model(s) {unknown}: choose from {', '.join(DEMO_MODELS)}")
    repo = Path(repo)
    x_tr, x_te, y_tr, y_te = digits_split(seed)
    built = []
    specs = [
        (
            "digits",
            64,
            lambda a: a,
            DIGITS_VARIANTS,
            64,
            20.0,
            "8x8 handwritten digits (scikit-learn's digits data), pixel values 0..16",
        ),
        (
            "heavy",
            1024,
            _upsample,
            HEAVY_VARIANTS,
            64,
            20.0,
            "the digits upsampled to 32x32 (1,024 values, 0..16): a compute-heavy MLP where batching pays",
        ),
    ]
    for name, n_in, prep, variants, max_batch, slo_ms, desc in specs:
        if name not in models:
            continue
        xtr, xte = prep(x_tr), prep(x_te)
        vcfgs = []
        for vname, hidden, pool, iters in variants:
            t0 = time.perf_counter()
            pre = _pool_matrix(round(n_in**0.5), pool) if pool else None
            feats_tr = (xtr / 16.0) @ pre if pre is not None else xtr / 16.0
            net = _train(hidden, feats_tr, y_tr, seed, iters)
            model = mlp_to_onnx(net, n_in, 1.0 / 16.0, pre, f"{name}_{vname}")
            acc = _accuracy(model, xte, y_te)
            out = repo / name / vname / "model.onnx"
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(".tmp")
            tmp.write_bytes(model.SerializeToString())
            tmp.replace(out)
            flops = net.flops_per_row + (2.0 * pre.size if pre is not None else 0.0)
            vcfgs.append(VariantConfig(name=vname, accuracy=round(acc, 4), cost_flops=flops, params=net.params))
            log(
                f"  {name}/{vname}: hidden={hidden or 'linear'} accuracy={acc:.4f} "
                f"flops/row={flops:,.0f} ({time.perf_counter() - t0:.1f}s)"
            )
        cfg = ModelConfig(
            name=name,
            inputs=(TensorSpec(name="input", datatype="FP32", shape=(n_in,)),),
            outputs=(
                TensorSpec(name="probs", datatype="FP32", shape=(10,)),
                TensorSpec(name="label", datatype="INT64", shape=()),
            ),
            max_batch_size=max_batch,
            slo_ms=slo_ms,
            variants=tuple(vcfgs),
            description=desc,
        )
        write_config(repo, cfg)
        built.append(cfg)
    # The prebuilt cnn, with or without PyTorch: every host serves the same nets (training them again
    # here would give other weights wherever PyTorch's version or kernels differ) and the build needs
    # no PyTorch. Another seed's split may hold their training rows, so with one, train them anew.
    if "cnn" in models:
        if seed != cnn.prebuilt_source()["seed"] and cnn.torch_available():
            cfg = cnn.build_cnn(repo, x_tr, y_tr, x_te, y_te, seed=seed, log=log)
        else:
            cfg = cnn.copy_prebuilt(repo, x_te, y_te, seed=seed, log=log)
        write_config(repo, cfg)
        built.append(cfg)
    copy_measured_profiles(repo, [c.name for c in built], log)
    (repo / ".built").write_text(json.dumps({"models": [c.name for c in built], "seed": seed}) + "\n")
    return built
