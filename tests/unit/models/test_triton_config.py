"""A Triton model folder (``config.pbtxt`` + numbered version folders) read and translated by
sloserve/models/triton.py: the versions served by each policy, tensors completed from (or checked
against) the ONNX graph, the batching and instance settings kept, the parameters mapping, and every
refusal naming the file, the line and the key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from sloserve.cli.main import main
from sloserve.models.repository import ModelProblem, ModelRepository, load_model_dir

ROOT = Path(__file__).resolve().parents[3]


def graph(path: Path, batch: int | str = "batch", width: int = 4, in_type=TensorProto.FLOAT) -> None:
    """``x`` [batch, width] -> Relu -> ``y`` FP32 [batch, width], and ArgMax -> ``label`` INT64 [batch]."""
    x = helper.make_tensor_value_info("x", in_type, [batch, width])
    y = helper.make_tensor_value_info("y", in_type, [batch, width])
    label = helper.make_tensor_value_info("label", TensorProto.INT64, [batch])
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("ArgMax", ["y"], ["label"], axis=1, keepdims=0)],
        "g",
        [x],
        [y, label],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def triton_model(root: Path, name: str, pbtxt: str, versions=("1", "2"), **graph_kw) -> Path:
    d = root / name
    for v in versions:
        graph(d / v / "model.onnx", **graph_kw)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(textwrap.dedent(pbtxt).lstrip("\n"))
    return d


BASE = """
platform: "onnxruntime_onnx"
max_batch_size: 8
"""


def load(root: Path, name: str = "m", override=None):
    return load_model_dir(root, name, override)


def refused(root: Path, name: str = "m") -> str:
    with pytest.raises(ModelProblem) as e:
        load(root, name)
    return str(e.value)


# --- translation -----------------------------------------------------------------------------------


def test_tensors_are_completed_from_the_graph_and_the_latest_version_served(tmp_path):
    triton_model(tmp_path, "m", BASE)
    m = load(tmp_path)
    c = m.config
    assert c.versions == ("2",) and [v.name for v in c.variants] == ["2"] and c.best_variant == "2"
    assert [(t.name, t.datatype, t.shape) for t in c.inputs] == [("x", "FP32", (4,))]
    assert [(t.name, t.datatype, t.shape) for t in c.outputs] == [("y", "FP32", (4,)), ("label", "INT64", ())]
    assert c.max_batch_size == 8 and c.platform == "onnxruntime_onnx"
    assert m.triton is not None and m.triton.version_policy == "latest" and m.triton.batch_dimension
    assert m.onnx_path("2") == tmp_path / "m" / "2" / "model.onnx"


@pytest.mark.parametrize(
    "policy, folders, served",
    [
        ("", ("1", "2", "3"), ("3",)),
        ("version_policy: { latest: { num_versions: 2 } }", ("1", "2", "10"), ("2", "10")),
        ("version_policy: { all: {} }", ("1", "2", "3"), ("1", "2", "3")),
        ("version_policy: { specific: { versions: [1, 3] } }", ("1", "2", "3"), ("1", "3")),
    ],
)
def test_version_policy_decides_the_versions_served(tmp_path, policy, folders, served):
    triton_model(tmp_path, "m", BASE + policy, versions=folders)
    (tmp_path / "m" / "0").mkdir()  # neither "0", "01" nor a name is a version (as in Triton)
    (tmp_path / "m" / "01").mkdir()
    (tmp_path / "m" / "extra").mkdir()
    m = load(tmp_path)
    c = m.config
    assert c.versions == served
    assert sorted(v.name for v in c.variants) == sorted(served) and c.best_variant == served[-1]


def test_listed_tensors_are_checked_and_typed(tmp_path):
    triton_model(
        tmp_path,
        "m",
        BASE
        + """
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [
          { name: "y" data_type: TYPE_FP32 dims: [ -1 ] },
          { name: "label" data_type: TYPE_INT64 dims: [ 1 ] reshape: { shape: [ ] } }
        ]
        """,
    )
    m = load(tmp_path)
    c = m.config
    assert [(t.name, t.datatype, t.shape) for t in c.inputs] == [("x", "FP32", (4,))]
    assert [(t.name, t.shape) for t in c.outputs] == [("y", (-1,)), ("label", ())]
    assert m.triton is not None and m.triton.reshape == {"label": (1,)}


def test_an_output_subset_is_served(tmp_path):
    triton_model(tmp_path, "m", BASE + 'output [ { name: "label" data_type: TYPE_INT64 dims: [ ] } ]')
    assert [t.name for t in load(tmp_path).config.outputs] == ["label"]


def test_max_batch_size_zero_with_a_first_dimension_of_one_serves_one_row_batches(tmp_path):
    triton_model(tmp_path, "m", 'platform: "onnxruntime_onnx"\n', versions=("1",), batch=1)
    m = load(tmp_path)
    c = m.config
    assert c.max_batch_size == 1 and c.inputs[0].shape == (4,)
    assert m.triton is not None and not m.triton.batch_dimension


def test_max_batch_size_zero_with_listed_full_dims(tmp_path):
    triton_model(
        tmp_path,
        "m",
        """
        backend: "onnxruntime"
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
        """,
        versions=("1",),
        batch=1,
    )
    m = load(tmp_path)
    c = m.config
    assert c.max_batch_size == 1 and c.inputs[0].shape == (4,) and c.outputs[0].shape == (4,)


def test_max_batch_size_absent_with_a_dynamic_graph_is_auto_completed_as_triton_does(tmp_path):
    triton_model(tmp_path, "m", 'platform: "onnxruntime_onnx"\n', versions=("1",))
    m = load(tmp_path)
    c = m.config
    assert c.max_batch_size == 4 and m.triton is not None and m.triton.batch_dimension


def test_dynamic_batching_instance_groups_and_ignored_keys_are_kept(tmp_path):
    triton_model(
        tmp_path,
        "m",
        BASE
        + """
        dynamic_batching {
          preferred_batch_size: [ 2, 4 ]
          max_queue_delay_microseconds: 300
          priority_levels: 3
          default_priority_level: 2
          default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000 allow_timeout_override: true max_queue_size: 16 }
        }
        instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_GPU gpus: [ 0, 1 ] } ]
        model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value { data_type: TYPE_FP32 dims: [4] zero_data: true } } } ]
        parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
        """,
    )
    m = load(tmp_path)
    t, db = m.triton, m.config.dynamic_batching
    assert t is not None and db is not None
    assert (db.preferred_batch_sizes, db.max_queue_delay_us, db.priority_levels, db.default_priority_level) == (
        (2, 4),
        300,
        3,
        2,
    )
    q = db.default_queue_policy
    assert (q.timeout_action, q.default_timeout_us, q.allow_timeout_override, q.max_queue_size) == (
        "DELAY",
        5000,
        True,
        16,
    )
    assert [(g.kind, g.count, g.gpus) for g in t.instance_groups] == [("KIND_CPU", 2, ()), ("KIND_GPU", 1, (0, 1))]
    assert "model_warmup" in t.ignored and "parameters.intra_op_thread_count" in t.ignored


def test_parameters_carry_sloserve_settings(tmp_path):
    triton_model(
        tmp_path,
        "m",
        BASE
        + """
        version_policy: { all: {} }
        dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2500 }
        parameters [
          { key: "slo_ms" value: { string_value: "30" } },
          { key: "accuracy_v1" value: { string_value: "0.8" } },
          { key: "accuracy_v2" value: { string_value: "0.95" } },
          { key: "default_variant" value: { string_value: "1" } },
          { key: "batching_policy" value: { string_value: "fixed" } },
          { key: "description" value: { string_value: "two digits models" } }
        ]
        """,
    )
    m = load(tmp_path)
    c = m.config
    assert c.slo_ms == 30.0 and c.description == "two digits models"
    assert {v.name: v.accuracy for v in c.variants} == {"1": 0.8, "2": 0.95}
    assert c.best_variant == "1"
    assert c.batching == {"policy": "fixed", "max_queue_delay_ms": 2.5, "preferred_batch_sizes": [4]}
    assert m.triton is not None and m.triton.variant_fallback  # accuracies given: versions are accuracy variants


def test_batching_json_parameter_wins_over_the_policy_name(tmp_path):
    triton_model(
        tmp_path,
        "m",
        BASE
        + """
        parameters { key: "batching_policy" value: { string_value: "timeout" } }
        parameters { key: "batching" value: { string_value: '{"policy": "slo", "max_wait_ms": 3}' } }
        parameters { key: "variant_fallback" value: { string_value: "true" } }
        """,
    )
    m = load(tmp_path)
    c = m.config
    assert c.batching == {"policy": "slo", "max_wait_ms": 3}
    assert m.triton is not None and m.triton.variant_fallback


def test_a_load_override_replaces_translated_keys(tmp_path):
    triton_model(tmp_path, "m", BASE)
    m = load(tmp_path, override={"slo_ms": 12.0, "max_batch_size": 4})
    assert (
        m.config.slo_ms == 12.0 and m.config.max_batch_size == 4 and m.override == {"slo_ms": 12.0, "max_batch_size": 4}
    )


def test_default_model_filename_and_a_model_folder(tmp_path):
    d = triton_model(tmp_path, "m", BASE + 'default_model_filename: "net.onnx"', versions=())
    graph(d / "1" / "net.onnx")
    graph(d / "2" / "net.onnx" / "model.onnx")  # Triton's ONNX Runtime backend reads such a folder
    m = load(tmp_path)
    assert m.onnx_path("2") == d / "2" / "net.onnx" / "model.onnx"
    assert m.triton is not None and m.triton.model_filename == "net.onnx"


def test_config_json_wins_when_both_are_there(tmp_path):
    import json

    triton_model(tmp_path, "m", "this is not a config.pbtxt {", versions=("small",))
    cfg = {
        "name": "m",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [4]}],
        "variants": [{"name": "small", "accuracy": 0.9, "cost_flops": 8.0}],
    }
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    assert load(tmp_path).triton is None


# --- refusals: file, line and key -------------------------------------------------------------------


REFUSALS = [
    # (config.pbtxt, line, what the message names)
    ('platform: "onnxruntime_onnx"\nmax_batch_size: 8 {\n', "2:", "Expected"),
    ('platform: "onnxruntime_onnx"\nmax_batch_size: 8\nfoo: 1\n', "3:1", 'no field named "foo"'),
    ('max_batch_size: 8\nplatform: "tensorflow_savedmodel"\n', "2", "'platform'"),
    ('max_batch_size: 8\nbackend: "python"\n', "2", "'backend'"),
    ("max_batch_size: 8\n", None, "'platform'"),
    (BASE + "sequence_batching { }\n", "3", "'sequence_batching'"),
    (BASE + 'ensemble_scheduling { step [ { model_name: "a" model_version: -1 } ] }\n', "3", "'ensemble_scheduling'"),
    (
        BASE + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "n" data_type: TYPE_FP32 } ]\n',
        "3",
        "'batch_input'",
    ),
    (BASE + 'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "y" } ]\n', "3", "'batch_output'"),
    (BASE + "model_transaction_policy { decoupled: true }\n", "3", "'model_transaction_policy.decoupled'"),
    (BASE + "instance_group [ { kind: KIND_MODEL } ]\n", "3", "'instance_group[0].kind'"),
    (
        BASE + 'input [\n  {\n    name: "x"\n    data_type: TYPE_FP32\n    dims: [ 5 ]\n  }\n]\n',
        "7",
        "'input[0].dims'",
    ),
    (BASE + 'input [ { name: "x" data_type: TYPE_INT32 dims: [ 4 ] } ]\n', "3", "'input[0].data_type'"),
    (BASE + 'input [ { name: "pixels" data_type: TYPE_FP32 dims: [ 4 ] } ]\n', "3", "'input[0].name'"),
    (BASE + 'output [\n  { name: "y" data_type: TYPE_FP32 dims: [ 4, 1 ] }\n]\n', "4", "'output[0].dims'"),
    (BASE + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]\n', "3", "'input[0].optional'"),
    (BASE + 'input [ { name: "x" data_type: TYPE_BF16 dims: [ 4 ] } ]\n', "3", "'input[0].data_type'"),
    (
        BASE + 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 3 ] } } ]\n',
        "3",
        "'output[0].reshape'",
    ),
    (BASE + 'name: "other"\n', "3", "'name'"),
    (BASE + "version_policy: { specific: { versions: [ 1, 7 ] } }\n", "3", "'version_policy.specific.versions'"),
    (BASE + "version_policy: { latest: { num_versions: 0 } }\n", "3", "'version_policy.latest.num_versions'"),
    (BASE + 'parameters { key: "slo" value: { string_value: "30" } }\n', "3", "'parameters.slo'"),
    (BASE + 'parameters { key: "slo_ms" value: { string_value: "fast" } }\n', "3", "'parameters.slo_ms'"),
    (BASE + 'parameters { key: "accuracy_v2" value: { string_value: "1.5" } }\n', "3", "'parameters.accuracy_v2'"),
    (BASE + 'parameters { key: "accuracy_v9" value: { string_value: "0.5" } }\n', "3", "'parameters.accuracy_v9'"),
    (
        BASE + 'parameters { key: "default_variant" value: { string_value: "1" } }\n',
        "3",
        "'parameters.default_variant'",
    ),
    (BASE + 'parameters { key: "batching" value: { string_value: "[1]" } }\n', "3", "'parameters.batching'"),
    (BASE + "dynamic_batching { preferred_batch_size: [ 4, 16 ] }\n", "3", "'dynamic_batching.preferred_batch_size'"),
    ('platform: "onnxruntime_onnx"\nmax_batch_size: 5000\n', "2", "'max_batch_size'"),
    (
        'platform: "onnxruntime_onnx"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n',
        None,
        "'max_batch_size'",
    ),
]


@pytest.mark.parametrize("pbtxt, line, needle", REFUSALS)
def test_a_refused_config_names_the_file_the_line_and_the_key(tmp_path, pbtxt, line, needle):
    triton_model(tmp_path, "m", pbtxt)
    msg = refused(tmp_path)
    path = str(tmp_path / "m" / "config.pbtxt")
    assert msg.startswith(path + (f":{line}" if line else "")), msg
    assert needle in msg, msg


def test_a_served_version_without_its_model_is_refused(tmp_path):
    triton_model(tmp_path, "m", BASE + "version_policy: { all: {} }")
    (tmp_path / "m" / "3").mkdir()
    msg = refused(tmp_path)
    assert "config.pbtxt" in msg and "version 3" in msg and str(tmp_path / "m" / "3" / "model.onnx") in msg


def test_a_model_without_version_folders_is_refused(tmp_path):
    triton_model(tmp_path, "m", BASE, versions=())
    assert "no version folder" in refused(tmp_path)


def test_versions_that_disagree_with_the_completed_config_are_refused(tmp_path):
    d = triton_model(tmp_path, "m", BASE + "version_policy: { all: {} }", versions=("2",))
    graph(d / "1" / "model.onnx", width=5)
    msg = refused(tmp_path)
    assert "version 1" in msg and "'input'" in msg and "completed from version 2" in msg


def test_max_batch_size_above_zero_needs_a_dynamic_batch_dimension(tmp_path):
    triton_model(tmp_path, "m", BASE, versions=("1",), batch=2)
    assert "batch dimension" in refused(tmp_path)


# --- the repository ---------------------------------------------------------------------------------


def test_the_repository_lists_triton_folders_and_one_bad_model_does_not_hide_the_others(tmp_path):
    triton_model(tmp_path, "good", BASE)
    triton_model(tmp_path, "bad", BASE.replace("onnxruntime_onnx", "pytorch_libtorch"))
    (tmp_path / "not_a_model").mkdir()
    repo = ModelRepository(tmp_path)
    assert repo.model_names() == ["bad", "good"]
    res = repo.check()
    assert res["good"] is None and res["bad"] is not None and "'platform'" in res["bad"]
    with pytest.raises(ModelProblem, match="pytorch_libtorch"):  # start-up refuses a broken folder, as for config.json
        ModelRepository(tmp_path).load()


def test_models_check_prints_the_versions_and_what_is_not_honoured(tmp_path, capsys):
    triton_model(tmp_path, "good", BASE + 'version_policy: { all: {} }\nmodel_warmup [ { name: "w" } ]')
    triton_model(tmp_path, "bad", BASE + "sequence_batching { }")
    assert main(["models", "check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "good: ok (Triton config.pbtxt, versions 1, 2; accepted, not honoured: model_warmup)" in out
    assert "bad: FAIL: " in out and "'sequence_batching'" in out


def test_reading_a_config_pbtxt_imports_no_grpc(tmp_path):
    triton_model(tmp_path, "m", BASE)
    code = (
        "import sys; from sloserve.models.repository import load_model_dir; "
        f"load_model_dir({str(tmp_path)!r}, 'm'); assert 'grpc' not in sys.modules, 'grpc imported'; "
        "import tritonclient.grpc.model_config_pb2 as pb; pb.ModelConfig(name='x')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
