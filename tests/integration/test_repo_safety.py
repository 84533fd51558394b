"""Model repository safety: names, symlinks and ONNX external data can never lead outside the
configured repository, and nothing a client sends ever names a file.

Repositories are built in tmp_path from a copy of the demo ``digits`` model (small variant).
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from pydantic import ValidationError

from sloserve.models.repository import ModelConfig, ModelRepository, check_name

pytestmark = pytest.mark.integration

BAD_NAMES = [
    "",
    ".",
    "..",
    "../x",
    "x/..",
    "a/b",
    "/etc",
    "/",
    "\\x",
    "a\\..\\b",
    "C:\\x",
    ".hidden",
    "-rf",
    "a\x00b",
    "a b",
    "x" * 129,
    "..a",
    "a..",
    "ü",
    "%2e%2e",
    "~root",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_refused(name):
    with pytest.raises(ValueError):
        check_name("model", name)


def test_good_names_pass():
    for name in ["digits", "heavy", "resnet-50", "bert_base.v2", "A1", "x" * 128]:
        assert check_name("variant", name) == name


def _config(name="digits", variants=("small",)) -> dict:
    return {
        "name": name,
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [64]}],
        "outputs": [
            {"name": "probs", "datatype": "FP32", "shape": [10]},
            {"name": "label", "datatype": "INT64", "shape": []},
        ],
        "variants": [{"name": v, "accuracy": 0.9, "cost_flops": 1.0} for v in variants],
    }


@pytest.mark.parametrize(
    "field, value",
    [
        ("name", "../digits"),
        ("name", "/abs"),
        ("variant", "../../etc"),
        ("variant", "/tmp/x"),
        ("variant", "a/../../b"),
    ],
)
def test_config_names_validated(field, value):
    cfg = _config(value) if field == "name" else _config(variants=(value,))
    with pytest.raises(ValidationError, match="invalid"):
        ModelConfig.model_validate(cfg)


@pytest.fixture
def repo(tmp_path, model_repo):
    root = tmp_path / "repo"
    (root / "digits" / "small").mkdir(parents=True)
    shutil.copy(model_repo / "digits" / "small" / "model.onnx", root / "digits" / "small" / "model.onnx")
    (root / "digits" / "config.json").write_text(json.dumps(_config()))
    return root


def test_clean_repository_loads(repo):
    assert list(ModelRepository(repo).load().models) == ["digits"]


def test_symlinked_variant_dir_outside_refused(repo, tmp_path):
    outside = tmp_path / "outside" / "small"
    outside.parent.mkdir()
    shutil.move(repo / "digits" / "small", outside)
    (repo / "digits" / "small").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="outside the repository"):
        ModelRepository(repo).load()


def test_symlinked_onnx_outside_refused(repo, tmp_path):
    target = tmp_path / "evil.onnx"
    shutil.move(repo / "digits" / "small" / "model.onnx", target)
    (repo / "digits" / "small" / "model.onnx").symlink_to(target)
    with pytest.raises(ValueError, match="outside the repository"):
        ModelRepository(repo).load()


def test_symlinked_model_dir_outside_refused(repo, tmp_path):
    shutil.move(repo / "digits", tmp_path / "digits")
    (repo / "digits").symlink_to(tmp_path / "digits", target_is_directory=True)
    with pytest.raises(ValueError, match="outside the repository"):
        ModelRepository(repo).load()


def test_symlinked_config_outside_refused(repo, tmp_path):
    shutil.move(repo / "digits" / "config.json", tmp_path / "config.json")
    (repo / "digits" / "config.json").symlink_to(tmp_path / "config.json")
    with pytest.raises(ValueError, match="outside the repository"):
        ModelRepository(repo).load()


def test_symlink_inside_the_repository_is_fine(repo):
    (repo / "digits" / "small").rename(repo / "digits" / "small-v1")
    (repo / "digits" / "small").symlink_to(repo / "digits" / "small-v1", target_is_directory=True)
    assert "digits" in ModelRepository(repo).load().models


def test_directory_name_must_match_config_name(repo):
    (repo / "digits").rename(repo / "other")
    with pytest.raises(ValueError, match="differs from its directory"):
        ModelRepository(repo).load()


def _external_data_model(path, location: str) -> None:
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 10], np.zeros(640, np.float32))
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", "2560")):
        e = w.external_data.add()
        e.key, e.value = k, v
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "w"], ["probs"]),
            helper.make_node("ArgMax", ["probs"], ["label"], axis=1, keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, 64])],
        [
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, [None, 10]),
            helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
        ],
        [w],
    )
    onnx.save(helper.make_model(graph), str(path))


@pytest.mark.parametrize("location", ["../../../etc/passwd", "/etc/passwd", "../config.json"])
def test_onnx_external_data_outside_refused(repo, location):
    _external_data_model(repo / "digits" / "small" / "model.onnx", location)
    with pytest.raises(ValueError, match="external data"):
        ModelRepository(repo).load()


def test_onnx_external_data_beside_the_model_is_fine(repo):
    d = repo / "digits" / "small"
    _external_data_model(d / "model.onnx", "weights.bin")
    (d / "weights.bin").write_bytes(b"\0" * 2560)
    ModelRepository(repo).load()


# ---- nothing from the network becomes a path ----------------------------------------------------
@pytest.mark.parametrize(
    "path, status",
    [
        ("/v2/models/..%2Fdigits/infer", 404),
        ("/v2/models/%2Fetc%2Fpasswd/infer", 404),
        ("/v2/models/digits/versions/..%2F..%2F1/infer", 404),
        ("/v2/models/../digits/infer", 404),
    ],
)
def test_request_names_are_lookups_not_paths(servers, path, status):
    srv = servers("inprocess")
    body = json.dumps(
        {
            "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}],
            "parameters": {"variant": "../../small"},
        }
    ).encode()
    req = urllib.request.Request(
        f"http://{srv.http_url}{path}", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=10)
    assert ei.value.code == status
    assert json.loads(ei.value.read())["error"]


def test_variant_parameter_is_a_lookup(servers):
    srv = servers("inprocess")
    body = json.dumps(
        {
            "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}],
            "parameters": {"variant": "../heavy/large"},
        }
    ).encode()
    req = urllib.request.Request(
        f"http://{srv.http_url}/v2/models/digits/infer",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=10)
    assert ei.value.code == 400 and "unknown variant" in json.loads(ei.value.read())["error"]


# ---- config.json against the ONNX graph ------------------------------------------------------------
@pytest.mark.parametrize(
    "edit, needle",
    [
        (
            lambda c: c["inputs"][0].update(name="x"),
            r"inputs \['x'\] in config.json, but the ONNX graph takes \['input'\]",
        ),
        (lambda c: c["inputs"][0].update(datatype="INT64"), r"'inputs\[0\]' \('input'\) is INT64 in config.json, FP32"),
        (
            lambda c: c["inputs"][0].update(shape=[63]),
            r"'inputs\[0\]' \('input'\) has shape \[-1, 63\].*fix its 'shape'",
        ),
        (lambda c: c["inputs"][0].update(shape=[8, 8]), r"rank 2 in the ONNX graph"),
        (lambda c: c["outputs"][1].update(name="labels"), r"'outputs\[1\]' \('labels'\) is not an output"),
        (lambda c: c["outputs"][0].update(datatype="FP16"), r"'outputs\[0\]' \('probs'\) is FP16 in config.json, FP32"),
    ],
)
def test_a_config_that_disagrees_with_its_onnx_graph_is_a_load_error_naming_the_field(repo, edit, needle):
    """A config.json that does not match its ONNX graph stops loading with the field to fix (it
    used to load, and every request failed with a 500)."""
    path = repo / "digits" / "config.json"
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=needle):
        ModelRepository(repo).load()


# ---- a load's config override names no file and cannot nest without bound -----------------------------
def _load(srv, model: str, config: str):
    body = json.dumps({"parameters": {"config": config}}).encode()
    req = urllib.request.Request(
        f"http://{srv.http_url}/v2/repository/models/{model}/load",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.parametrize(
    "config, needle",
    [
        ("[" * 50_000 + "]" * 50_000, "'config' is 100,000 characters"),
        ("[" * 30_000 + "]" * 30_000, "'config' nests arrays and objects more than 16 deep"),
        ('{"batching": ' * 2_000 + "{}" + "}" * 2_000, "more than 16 deep"),
        (
            json.dumps({"batching": {"policy": "slo", "profile": "/"}}),
            "'batching.profile': cannot be set by a load",
        ),
        (json.dumps({"batching": {"latency_fn": "os.system"}}), "'batching.latency_fn': cannot be set by a load"),
        (json.dumps({"colour": "red"}), "'colour': not a key of config.json"),
    ],
)
def test_a_load_override_is_bounded_typed_and_names_no_file(servers, config, needle):
    """A config override nested 50,000 deep used to be a 500 (RecursionError); ``sloserve.batching.profile``
    named a directory that the load globbed and read on the event loop. Each is now a 400 naming the
    key, and the model keeps serving as it was."""
    srv = servers("inprocess")
    status, body = _load(srv, "cnn", config)
    assert status == 400 and needle in json.loads(body)["error"], body[:300]
    with urllib.request.urlopen(f"http://{srv.http_url}/v2/models/cnn/ready", timeout=10) as r:
        assert r.status == 200
