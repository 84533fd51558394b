"""``sloserve models check DIR``: the server's own check of each model folder (config.json against
its ONNX graphs, every variant's file), run without serving; exit 1 on any problem."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import TensorProto, helper

from sloserve.cli.main import main


def graph(path, batch: int | str = "batch") -> None:
    """A tiny ONNX graph: ``x`` FP32 [batch, 4] -> Identity -> ``y``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def model(root, name: str, edit=None, batch: int | str = "batch", variants=("small",)) -> None:
    cfg = {
        "name": name,
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [4]}],
        "max_batch_size": 8,
        "variants": [{"name": v, "accuracy": 0.9, "cost_flops": 8.0} for v in variants],
    }
    if edit is not None:
        edit(cfg)
    (root / name).mkdir(parents=True)
    (root / name / "config.json").write_text(json.dumps(cfg))
    for v in variants:
        graph(root / name / v / "model.onnx", batch)


def check(root, capsys) -> tuple[int, dict[str, str]]:
    rc = main(["models", "check", str(root)])
    lines = capsys.readouterr().out.splitlines()
    return rc, {ln.split(":", 1)[0]: ln.split(":", 1)[1].strip() for ln in lines if ":" in ln}


def test_a_good_repository_passes(tmp_path, capsys):
    model(tmp_path, "good")
    model(tmp_path, "two", variants=("small", "large"))
    rc, out = check(tmp_path, capsys)
    assert rc == 0 and out["good"] == "ok" and out["two"] == "ok"


@pytest.mark.parametrize(
    "name, build, needle",
    [
        (
            "wrong_input",
            lambda root: model(root, "wrong_input", lambda c: c["inputs"][0].update(name="pixels")),
            "inputs ['pixels'] in config.json, but the ONNX graph takes ['x'] (fix 'inputs')",
        ),
        (
            "wrong_dtype",
            lambda root: model(root, "wrong_dtype", lambda c: c["outputs"][0].update(datatype="INT64")),
            "'outputs[0]' ('y') is INT64 in config.json, FP32 in the ONNX graph (fix its 'datatype')",
        ),
        (
            "wrong_shape",
            lambda root: model(root, "wrong_shape", lambda c: c["inputs"][0].update(shape=[5])),
            "has shape [-1, 5] in config.json, [-1, 4] in the ONNX graph (fix its 'shape')",
        ),
        (
            "fixed_batch",
            lambda root: model(root, "fixed_batch", batch=1),
            "fixes the batch dimension at 1, but batches run 1..8 rows",
        ),
        (
            "missing_file",
            lambda root: (model(root, "missing_file"), (root / "missing_file/small/model.onnx").unlink()),
            "variant 'small' has no",
        ),
        (
            "not_onnx",
            lambda root: (model(root, "not_onnx"), (root / "not_onnx/small/model.onnx").write_bytes(b"\x00garbage")),
            "cannot be loaded",
        ),
        (
            "bad_json",
            lambda root: (model(root, "bad_json"), (root / "bad_json/config.json").write_text("{")),
            "is not valid JSON",
        ),
        (
            "bad_field",
            lambda root: model(root, "bad_field", lambda c: c.update(max_batch_size=0)),
            "'max_batch_size': Input should be greater than or equal to 1",
        ),
    ],
)
def test_a_broken_model_fails_naming_what_to_fix(tmp_path, capsys, name, build, needle):
    model(tmp_path, "good")
    build(tmp_path)
    rc, out = check(tmp_path, capsys)
    assert rc == 1
    assert out["good"] == "ok"
    assert out[name].startswith("FAIL") and needle in out[name], out[name]


def test_a_missing_or_empty_repository_is_exit_2(tmp_path, capsys):
    assert main(["models", "check", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().out
    (tmp_path / "stray").mkdir()
    assert main(["models", "check", str(tmp_path)]) == 2
    assert "holds no <model>/config.json" in capsys.readouterr().out
