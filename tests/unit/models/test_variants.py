"""``sloserve models variants`` on a small MLP trained here on scikit-learn's digits: the variants are
written and pass the repository's check, int8 is smaller and measured, and bad input is a clear error
that leaves the repository as it was."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from sloserve.cli.main import main
from sloserve.models.repository import ModelRepository, load_model_dir
from sloserve.modeltools.demo import _train, mlp_to_onnx
from sloserve.modeltools.variants import (
    convert_fp16,
    cuda_available,
    flops_per_row,
    graph_signature,
    same_signature,
    split,
)


@pytest.fixture(scope="module")
def user_model(tmp_path_factory):
    """(model.onnx, tiny.onnx, val.npz): an MLP 64x64 and a linear model, trained in seconds."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = d.data.astype(np.float32), d.target
    root = tmp_path_factory.mktemp("user")
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    tr, va = order[:1200], order[1200:1500]
    big = mlp_to_onnx(_train((64, 64), x[tr] / 16, y[tr], 0, 150), 64, 1 / 16, None, "big")
    tiny = mlp_to_onnx(_train((), x[tr] / 16, y[tr], 0, 100), 64, 1 / 16, None, "tiny")
    onnx.save(big, str(root / "model.onnx"))
    onnx.save(tiny, str(root / "tiny.onnx"))
    np.savez(root / "val.npz", x=x[va], y=y[va])
    return root / "model.onnx", root / "tiny.onnx", root / "val.npz"


def files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def run(model, val, repo, *extra: str) -> int:
    args = ["models", "variants", "--onnx", str(model), "--val", str(val), "--name", "m", "--repo", str(repo)]
    return main([*args, "--profile-iters", "2", *extra])


def test_variants_are_written_measured_and_load(user_model, tmp_path, capsys):
    model, tiny, val = user_model
    repo = tmp_path / "repo"
    assert run(model, val, repo, "--extra-variant", f"tiny={tiny}", "--max-batch", "8") == 0
    out = capsys.readouterr().out
    assert "variant" in out and "int8" in out and "tiny" in out  # the table
    loaded = load_model_dir(repo, "m")
    cfg = loaded.config
    names = [v.name for v in cfg.variants]
    assert set(names) == {"fp32", "int8", "tiny"} | ({"fp16"} if cuda_available() else set())
    accs = [v.accuracy for v in cfg.variants]
    assert accs == sorted(accs, reverse=True) and cfg.max_batch_size == 8  # most accurate first
    fp32, int8 = cfg.variant("fp32"), cfg.variant("int8")
    assert fp32.accuracy > 0.85 and abs(int8.accuracy - fp32.accuracy) < 0.05
    assert fp32.cost_flops == 2 * (64 * 64 + 64 * 64 + 64 * 10)
    assert (repo / "m/int8/model.onnx").stat().st_size < (repo / "m/fp32/model.onnx").stat().st_size / 2
    report = json.loads((repo / "m/variants.json").read_text())
    by = {v["name"]: v for v in report["variants"]}
    assert by["fp32"]["agreement"] == 1.0 and 0.9 < by["int8"]["agreement"] <= 1.0
    assert report["held_out_rows"] == 210 and report["calibration_rows"] == 90
    for v in names:  # a CPU profile per variant, from sloserve.modeltools.profiler, with batch sizes 1..8
        prof = json.loads(next((repo / "m" / v / "profiles").glob("cpu-*.json")).read_text())
        assert prof["batch_sizes"] == [1, 2, 4, 8] and prof["accuracy"] == cfg.variant(v).accuracy
    assert (repo / "m/variants.png").stat().st_size > 1000
    assert ModelRepository(repo).check() == {"m": None}
    assert main(["models", "check", str(repo)]) == 0
    assert [p for p in files(tmp_path) if ".variants-" in p] == []  # the temp folder is gone


def test_an_existing_model_is_replaced_only_with_force(user_model, tmp_path, capsys):
    model, _, val = user_model
    repo = tmp_path / "repo"
    assert run(model, val, repo, "--kinds", "fp32", "--profile-iters", "0") == 0
    before = files(repo)
    assert run(model, val, repo, "--kinds", "int8") == 2
    assert "exists; pass --force" in capsys.readouterr().err and files(repo) == before
    assert run(model, val, repo, "--kinds", "int8", "--force") == 0
    assert [v.name for v in load_model_dir(repo, "m").config.variants] == ["int8"]
    assert sorted(p.name for p in repo.iterdir()) == ["m"]


def bad_npz(path, **arrays) -> str:
    np.savez(path, **arrays)
    return str(path)


def other_output(path) -> str:
    """An extra variant with 5 classes instead of 10."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])
    probs = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 5])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])
    w = onnx.numpy_helper.from_array(np.zeros((64, 5), np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["input", "w"], ["probs"]),
        helper.make_node("ArgMax", ["probs"], ["label"], axis=1, keepdims=0),
    ]
    g = helper.make_graph(nodes, "g", [x], [probs, label], initializer=[w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def fixed_batch(path) -> str:
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [4, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])
    g = helper.make_graph([helper.make_node("Identity", ["input"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


@pytest.mark.parametrize(
    "case, needle",
    [
        ("no_labels", "lacks ['y']"),
        ("no_x", "lacks ['x']"),
        ("float_labels", "y must be one integer label a row"),
        ("wrong_width", "x has shape [50, 32], but the model's input 'input' takes [-1, 64]"),
        ("wrong_rank", "x has shape [50, 8, 8]"),
        ("fewer_labels", "x has 50 rows but y has 49 labels"),
        ("label_out_of_range", "y holds label 12, but the output 'probs' scores 10 classes"),
        ("extra_changes_output", "does not serve the same tensors: its output 'probs' is FP32 [-1, 5]"),
        ("extra_name_taken", "the variant name 'int8' is taken"),
        ("extra_missing", "does not exist"),
        ("fixed_batch", "fixes the batch dimension at 4"),
        ("unknown_kind", "choose among fp32,fp16,int8"),
        ("fp16_without_gpu", "--kinds asks for fp16, but no GPU runs it here"),
        ("unknown_output", "--output 'scores' is not an output"),
        ("not_npz", "is not a numpy .npz file"),
    ],
)
def test_bad_input_is_a_clear_error_and_writes_nothing(user_model, tmp_path, capsys, case, needle):
    if case == "fp16_without_gpu" and cuda_available():
        pytest.skip("a GPU runs fp16 here")
    model, tiny, val = user_model
    z = np.load(val)
    x, y = z["x"][:50], z["y"][:50]
    repo = tmp_path / "repo"
    (repo / "other").mkdir(parents=True)
    (repo / "other" / "keep.txt").write_text("untouched")
    before = files(tmp_path)
    v, extra = str(val), []
    if case == "no_labels":
        v = bad_npz(tmp_path / "v.npz", x=x)
    elif case == "no_x":
        v = bad_npz(tmp_path / "v.npz", inputs=x, y=y)
    elif case == "float_labels":
        v = bad_npz(tmp_path / "v.npz", x=x, y=y.astype(np.float32))
    elif case == "wrong_width":
        v = bad_npz(tmp_path / "v.npz", x=x[:, :32], y=y)
    elif case == "wrong_rank":
        v = bad_npz(tmp_path / "v.npz", x=x.reshape(-1, 8, 8), y=y)
    elif case == "fewer_labels":
        v = bad_npz(tmp_path / "v.npz", x=x, y=y[:49])
    elif case == "label_out_of_range":
        v = bad_npz(tmp_path / "v.npz", x=x, y=np.where(y == 3, 12, y))
    elif case == "extra_changes_output":
        extra = ["--extra-variant", f"five={other_output(tmp_path / 'five.onnx')}"]
    elif case == "extra_name_taken":
        extra = ["--extra-variant", f"int8={tiny}"]
    elif case == "extra_missing":
        extra = ["--extra-variant", f"gone={tmp_path / 'gone.onnx'}"]
    elif case == "fixed_batch":
        model = fixed_batch(tmp_path / "fixed.onnx")
    elif case == "unknown_kind":
        extra = ["--kinds", "fp32,bf16"]
    elif case == "fp16_without_gpu":
        extra = ["--kinds", "fp32,fp16"]
    elif case == "unknown_output":
        extra = ["--output", "scores"]
    elif case == "not_npz":
        (tmp_path / "v.npz").write_text("x,y\n1,2\n")
        v = str(tmp_path / "v.npz")
    before = files(tmp_path)
    assert run(model, v, repo, *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("sloserve models variants: ") and needle in err, err
    assert files(tmp_path) == before  # nothing written, no temp folder left


def test_default_kinds_skip_fp16_with_a_note_on_a_cpu_host(user_model, tmp_path, capsys):
    if cuda_available():
        pytest.skip("a GPU runs fp16 here")
    model, _, val = user_model
    assert run(model, val, tmp_path / "repo", "--profile-iters", "0") == 0
    assert "no fp16 variant" in capsys.readouterr().out
    assert [v.name for v in load_model_dir(tmp_path / "repo", "m").config.variants] != []


def test_fp16_keeps_the_served_tensors_fp32(user_model, tmp_path):
    import onnxruntime as ort

    model, _, val = user_model
    convert_fp16(model, tmp_path / "half.onnx")
    half = onnx.load(str(tmp_path / "half.onnx"))
    assert same_signature(graph_signature(onnx.load(str(model)), "a"), graph_signature(half, "b")) is None
    assert any(t.data_type == TensorProto.FLOAT16 for t in half.graph.initializer)
    x = np.load(val)["x"][:100]
    a, b = (
        ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(["label"], {"input": x})[0]
        for p in (model, tmp_path / "half.onnx")
    )
    assert (a == b).mean() > 0.95


def test_split_is_seeded_and_disjoint():
    a, b = split(100, 0.3, 7)
    assert len(a) == 30 and len(b) == 70 and not set(a) & set(b)
    assert (split(100, 0.3, 7)[0] == a).all() and not (split(100, 0.3, 8)[0] == a).all()


def test_flops_count_matmuls_at_batch_one(user_model):
    _, tiny, _ = user_model
    assert flops_per_row(onnx.load(str(tiny))) == 2 * 64 * 10


def test_the_demo_validation_sets_fit_the_demo_models(tmp_path, model_repo):
    from sloserve.models.repository import ModelRepository
    from sloserve.modeltools.variants import export_demo_validation, load_validation

    paths = export_demo_validation(tmp_path)
    for path in paths:
        name = path.name.split("_")[0]
        m = ModelRepository(model_repo).load().models[name]
        x, y = load_validation(path, graph_signature(onnx.load(str(m.onnx_path("small"))), name))
        assert len(x) == len(y) == 450 and y.max() == 9
