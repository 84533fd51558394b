"""The ``cnn`` demo model: the built one (the suite's repository) is ordered by measured accuracy
and its variants really differ in depth; a tiny family builds, exports what it trained and makes
its INT8 variant with ``models variants``' quantization; the prebuilt variants the package ships
are what their config says and load in ONNX Runtime, and the build serves them with or without
PyTorch (trains them anew only for another seed, where PyTorch is installed)."""

from __future__ import annotations

import hashlib
import importlib.abc
import json
import sys
import tomllib
from pathlib import Path, PurePosixPath

import numpy as np
import onnx
import pytest

from sloserve.models.repository import ModelConfig, ModelRepository, load_model_dir, write_config
from sloserve.modeltools import cnn, demo
from sloserve.modeltools.data import digits_split

TINY = (
    ("small", cnn.Arch(pool=2, convs=((2, 1),), epochs=2)),
    ("large", cnn.Arch(pool=1, convs=((4, 1),), blocks=2, flatten=False, epochs=2, shift=True)),
)


def _digits(rows: int = 400):
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.data.astype(np.float32), d.target
    return x[:rows], y[:rows], x[rows : rows + 200], y[rows : rows + 200]


def test_the_built_cnn_lists_its_variants_most_accurate_first(model_repo):
    m = ModelRepository(model_repo).load().models["cnn"]
    accs = [v.accuracy for v in m.config.variants]
    assert accs == sorted(accs, reverse=True)
    assert {"small", "medium", "large"} <= {v.name for v in m.config.variants}
    small, large = m.config.variant("small"), m.config.variant("large")
    assert large.accuracy >= 0.97 and large.accuracy - small.accuracy >= 0.03  # measured, really apart
    assert [t.name for t in m.config.inputs] == ["input"] and m.config.inputs[0].shape == (64,)
    assert [t.name for t in m.config.outputs] == ["probs", "label"]
    # a GPU's cost follows the kernels launched: the large variant runs several times the nodes
    nodes = {v: cnn.optimized_node_count(m.onnx_path(v)) for v in ("small", "large")}
    assert nodes["large"] >= 4 * nodes["small"], nodes


def test_a_tiny_family_builds_its_int8_variant_and_passes_the_repository_check(tmp_path):
    pytest.importorskip("torch")
    x_tr, y_tr, x_te, y_te = _digits()
    lines: list[str] = []
    cfg = cnn.build_cnn(tmp_path, x_tr, y_tr, x_te, y_te, log=lines.append, archs=TINY, int8=True, calib_rows=64)
    names = [v.name for v in cfg.variants]
    assert set(names) >= {"small", "large", "large-int8"}
    assert [v.accuracy for v in cfg.variants] == sorted((v.accuracy for v in cfg.variants), reverse=True)
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(str(tmp_path / "cnn/large-int8/model.onnx")).graph.node)
    assert all(v.cost_flops > 0 and v.params > 0 for v in cfg.variants)
    write_config(tmp_path, cfg)
    assert load_model_dir(tmp_path, "cnn").config == cfg  # what the server's check loads
    assert len(lines) == len(names) and all(line.startswith("  cnn/") for line in lines)


def test_the_same_seed_trains_the_same_net(tmp_path):
    pytest.importorskip("torch")
    x_tr, y_tr, x_te, y_te = _digits(200)
    a = cnn.build_cnn(tmp_path / "a", x_tr, y_tr, x_te, y_te, log=lambda _: None, archs=TINY[:1])
    b = cnn.build_cnn(tmp_path / "b", x_tr, y_tr, x_te, y_te, log=lambda _: None, archs=TINY[:1])
    assert a == b
    assert (tmp_path / "a/cnn/small/model.onnx").read_bytes() == (tmp_path / "b/cnn/small/model.onnx").read_bytes()


class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.fixture
def no_torch(monkeypatch):
    """As on a host without PyTorch: ``import torch`` raises ImportError and ``sys.modules`` has no torch
    (libraries that look there, as SciPy does, see none)."""
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NoTorch(), *sys.meta_path])


def _small_demo(monkeypatch) -> None:
    """digits and heavy with one cheap variant each: the build's cnn is what these tests look at."""
    monkeypatch.setattr(demo, "DIGITS_VARIANTS", [("small", (), 2, 50)])
    monkeypatch.setattr(demo, "HEAVY_VARIANTS", [("small", (), 8, 50)])


def test_the_prebuilt_variants_are_what_their_config_says_and_load_in_onnx_runtime():
    from sloserve.replica.runtime import ort

    src, cfg, source = cnn.PREBUILT_DIR, cnn.prebuilt_config(), cnn.prebuilt_source()
    assert cfg.name == src.name == cnn.NAME
    # one file a variant of the default family, and no other
    assert {v.name for v in cfg.variants} == {name for name, _ in cnn.ARCHS} == set(source["sha256"])
    assert {p.parent.name for p in src.glob("*/model.onnx")} == set(source["sha256"])
    for name, digest in source["sha256"].items():
        assert hashlib.sha256((src / name / "model.onnx").read_bytes()).hexdigest() == digest, name
    # the server's own check of a model folder: config.json against each graph (names, datatypes, shapes)
    assert load_model_dir(src.parent, cnn.NAME).config == cfg
    _, x_te, _, y_te = digits_split(source["seed"])
    for v in cfg.variants:
        sess = ort.InferenceSession(str(src / v.name / "model.onnx"), providers=["CPUExecutionProvider"])
        assert [(i.name, i.shape[1:]) for i in sess.get_inputs()] == [("input", [64])]
        probs, label = sess.run(["probs", "label"], {"input": x_te})
        assert probs.shape == (len(x_te), 10) and label.shape == (len(x_te),)
        assert round(float((label == y_te).mean()), 4) == v.accuracy, v.name  # measured on its held-out split


def test_the_package_data_ships_the_prebuilt_files():
    root = Path(__file__).resolve().parents[3]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "sloserve.modeltools"
    ]
    package = root / "sloserve" / "modeltools"
    for f in cnn.PREBUILT_DIR.rglob("*"):
        if f.is_file() and "__pycache__" not in f.parts:
            rel = PurePosixPath(f.relative_to(package).as_posix())
            assert any(len(rel.parts) == len(PurePosixPath(g).parts) and rel.match(g) for g in globs), rel


def test_without_torch_the_build_serves_cnn_from_the_prebuilt_files(tmp_path, monkeypatch, no_torch):
    assert not cnn.torch_available()
    _small_demo(monkeypatch)
    lines: list[str] = []
    built = demo.build_demo(tmp_path, log=lines.append)
    assert [c.name for c in built] == ["digits", "heavy", "cnn"]
    assert built[-1] == cnn.prebuilt_config()  # scored again on the same split: the same accuracies
    for v in built[-1].variants:
        served = (tmp_path / "cnn" / v.name / "model.onnx").read_bytes()
        assert served == (cnn.PREBUILT_DIR / v.name / "model.onnx").read_bytes()
    assert load_model_dir(tmp_path, "cnn").config == built[-1]  # what the server loads
    said = [line for line in lines if line.startswith("  cnn")]
    assert len(said) == 3 and all("prebuilt" in line for line in said), lines
    assert json.loads((tmp_path / ".built").read_text())["models"] == ["digits", "heavy", "cnn"]


def test_with_another_seed_and_no_torch_the_prebuilt_variants_keep_their_recorded_accuracies(
    tmp_path, monkeypatch, no_torch
):
    _small_demo(monkeypatch)
    lines: list[str] = []
    built = {c.name: c for c in demo.build_demo(tmp_path, seed=1, log=lines.append)}
    assert built["cnn"] == cnn.prebuilt_config()  # not scored on a split that may hold their training rows
    said = [line for line in lines if line.startswith("  cnn:")]
    assert len(said) == 1 and "seed 1" in said[0] and cnn.TRAIN_HINT in said[0], lines


def test_with_another_seed_and_torch_the_build_trains_cnn(tmp_path, monkeypatch):
    _small_demo(monkeypatch)
    calls: list[int] = []

    def build_cnn(repo, x_tr, y_tr, x_te, y_te, seed=0, log=print) -> ModelConfig:
        calls.append(seed)
        return cnn.copy_prebuilt(repo, x_te, y_te, seed=seed, log=log)

    monkeypatch.setattr(cnn, "torch_available", lambda: True)
    monkeypatch.setattr(cnn, "build_cnn", build_cnn)
    demo.build_demo(tmp_path / "a", seed=0, log=lambda _: None)
    assert calls == []  # the prebuilt seed: the prebuilt files, PyTorch or not
    demo.build_demo(tmp_path / "b", seed=2, log=lambda _: None)
    assert calls == [2]


def test_the_prebuilt_files_regenerate_from_the_training(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "prebuilt" / "cnn"
    (out / "gone").mkdir(parents=True)
    (out / "gone" / "model.onnx").write_bytes(b"a variant no longer built")
    cfg = cnn.write_prebuilt(out, seed=0, log=lambda _: None, archs=TINY)
    assert not (out / "gone").exists()
    assert cnn.prebuilt_config(out) == cfg and {v.name for v in cfg.variants} == {"small", "large"}
    source = cnn.prebuilt_source(out)
    assert source["seed"] == 0 and source["command"] == cnn.REGENERATE
    assert load_model_dir(out.parent, "cnn").config == cfg
    _, x_te, _, y_te = digits_split(0)
    assert cnn.copy_prebuilt(tmp_path / "repo", x_te, y_te, seed=0, log=lambda _: None, src=out) == cfg


def test_where_a_gpu_runs_it_the_large_variant_gets_an_fp16_twin(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from sloserve.modeltools import variants_build

    devices: list[str] = []
    real_predict = variants_build.predict

    def predict(path, x, input_name, output, device="cpu"):
        devices.append(device)
        return real_predict(path, x, input_name, output)  # this host's CPU stands in for the GPU

    monkeypatch.setattr(variants_build, "cuda_available", lambda: True)
    monkeypatch.setattr(variants_build, "predict", predict)
    x_tr, y_tr, x_te, y_te = _digits(200)
    cfg = cnn.build_cnn(tmp_path, x_tr, y_tr, x_te, y_te, log=lambda _: None, archs=TINY)
    assert {v.name for v in cfg.variants} == {"small", "large"}  # not by default: it trades nothing on an H100
    cfg = cnn.build_cnn(tmp_path, x_tr, y_tr, x_te, y_te, log=lambda _: None, archs=TINY, fp16=True)
    assert {v.name for v in cfg.variants} == {"small", "large", "large-fp16"}
    half = onnx.load(str(tmp_path / "cnn/large-fp16/model.onnx"))
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in half.graph.initializer)
    assert devices[-1] == "cuda"  # its accuracy is measured where it runs


def test_the_build_names_an_unknown_demo_model(tmp_path):
    with pytest.raises(ValueError, match=r"unknown demo model\(s\) \['resnet'\]: choose from digits, heavy, cnn"):
        demo.build_demo(tmp_path, models=("digits", "resnet"))
    assert not any(tmp_path.iterdir())  # refused before anything is written
