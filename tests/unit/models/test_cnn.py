"""The ``cnn`` demo model: the built one (the suite's repository) is ordered by measured accuracy
and its variants really differ in depth; a tiny family builds, exports what it trained and makes
its INT8 variant with ``models variants``' quantization; without PyTorch the build goes on without
it and says so in one line."""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import pytest

from sloserve.build import cnn, demo
from sloserve.models.repository import ModelRepository, load_model_dir, write_config

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


def test_without_torch_the_build_skips_cnn_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    monkeypatch.setattr(demo, "DIGITS_VARIANTS", [("small", (), 2, 50)])
    monkeypatch.setattr(demo, "HEAVY_VARIANTS", [("small", (), 8, 50)])
    lines: list[str] = []
    built = demo.build_demo(tmp_path, log=lines.append)
    assert [c.name for c in built] == ["digits", "heavy"]
    said = [line for line in lines if "cnn" in line]
    assert len(said) == 1 and "pip install 'sloserve[train]'" in said[0], lines
    assert not (tmp_path / "cnn").exists()
    assert json.loads((tmp_path / ".built").read_text())["models"] == ["digits", "heavy"]


def test_where_a_gpu_runs_it_the_large_variant_gets_an_fp16_twin(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from sloserve.build import variants_build

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
