"""The repository API's pure parts: load parameters, Triton's config and statistics shapes (they
must parse into tritonclient's own protobuf messages), and the token scope each path needs."""

from __future__ import annotations

import doctest
import json
import re

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb

import sloserve.gateway.modelinfo as modelinfo
from sloserve.gateway.errors import InvalidArgument
from sloserve.gateway.modelinfo import ModelStats, triton_config
from sloserve.gateway.repository import ConfigOverride, parse_load_parameters
from sloserve.gateway.transports.auth import _model_from_path, _scope_of
from sloserve.models.repository import ModelConfig

CFG = ModelConfig.model_validate(
    {
        "name": "digits",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [64]}],
        "outputs": [
            {"name": "label", "datatype": "INT64", "shape": []},
            {"name": "t", "datatype": "BYTES", "shape": [-1]},
        ],
        "max_batch_size": 16,
        "variants": [{"name": "small", "accuracy": 0.8, "cost_flops": 1.0}],
    }
)


def test_the_module_examples_hold():
    assert doctest.testmod(modelinfo).failed == 0


def test_the_config_is_tritons_model_config():
    msg = json_format.ParseDict(triton_config(CFG, "slo"), model_config_pb2.ModelConfig())
    assert msg.max_batch_size == 16 and msg.platform == "onnxruntime_onnx"
    assert msg.input[0].data_type == model_config_pb2.TYPE_FP32 and list(msg.input[0].dims) == [64]
    assert [o.data_type for o in msg.output] == [model_config_pb2.TYPE_INT64, model_config_pb2.TYPE_STRING]
    assert msg.parameters["batching_policy"].string_value == "slo"
    assert json.loads(msg.parameters["variants"].string_value)[0]["name"] == "small"


def test_the_statistics_are_tritons_model_statistics():
    s = ModelStats()
    s.success(0.003, 0.001, 0.0015, rows=2, now_s=0.005)
    s.fail(0.0005)
    s.batch(2, 0.0015)
    msg = json_format.ParseDict({"model_stats": [s.triton("digits", "1")]}, pb.ModelStatisticsResponse())
    st = msg.model_stats[0]
    assert (st.inference_count, st.execution_count, st.last_inference) == (2, 1, 5)
    assert st.inference_stats.fail.count == 1 and st.inference_stats.fail.ns == 500_000
    assert st.inference_stats.queue.ns == 1_000_000 and st.batch_stats[0].batch_size == 2


@pytest.mark.parametrize(
    "params, override",
    [
        (None, None),
        ({}, None),
        ({"config": '{"max_batch_size": 4}'}, {"max_batch_size": 4}),
        ({"config": '{"name": "digits", "slo_ms": 9}'}, {"name": "digits", "slo_ms": 9}),
        (
            {"config": '{"batching": {"policy": "timeout", "max_wait_ms": 2, "max_batch_size": 4}}'},
            {"batching": {"policy": "timeout", "max_wait_ms": 2, "max_batch_size": 4}},
        ),
        ({"config": '{"batching": {"policy": "fixed", "preferred_batch_sizes": [1, 4]}}'}, None),
        ({"config": json.dumps({k: v for k, v in CFG.model_dump(mode="json").items() if k != "batching"})}, None),
    ],
)
def test_load_parameters(params, override):
    want = override if override is not None or not params else json.loads(params["config"])
    assert parse_load_parameters("digits", params) == want


def test_the_override_schema_has_the_keys_of_config_json():
    """A key added to config.json's schema must be added to the override's (typed) as well."""
    assert set(ConfigOverride.model_fields) == set(ModelConfig.model_fields)


@pytest.mark.parametrize(
    "params, needle",
    [
        ({"config": "{"}, "not valid JSON"),
        ({"config": "[1]"}, "must hold a JSON object"),
        ({"config": 3}, "must be a string"),
        ({"config": '{"name": "other"}'}, "names model 'other', not 'digits'"),
        ({"file:1/model.onnx": "AAAA"}, "file overrides"),
        ({"colour": "red"}, "unknown load parameter 'colour'"),
        ([1], "must be an object"),
        ({"config": '{"colour": "red"}'}, "'colour': not a key of config.json"),
        ({"config": '{"max_batch_size": 0}'}, "'max_batch_size': Input should be greater than or equal to 1"),
        ({"config": '{"slo_ms": NaN}'}, "'config' is not valid JSON"),
        ({"config": '{"slo_ms": 1e400}'}, "'config' is not valid JSON"),
        ({"config": '{"inputs": [{"name": 3}]}'}, "'inputs.0.name'"),
        ({"config": '{"variants": [{"name": "../x", "accuracy": 1, "cost_flops": 1}]}'}, "'variants.0.name'"),
        # nothing a request sends names a file: the latency profile (a directory to glob and read) and
        # the rest of a policy's context come from the repository and the operator's config only
        ({"config": '{"batching": {"profile": "/"}}'}, "'batching.profile': cannot be set by a load"),
        ({"config": '{"batching": {"policy": "slo", "profile": "/etc"}}'}, "'batching.profile'"),
        ({"config": '{"batching": {"latency_fn": "os.system"}}'}, "'batching.latency_fn': cannot be set"),
        ({"config": '{"batching": {"variants": ["x"]}}'}, "'batching.variants': cannot be set"),
        ({"config": '{"batching": {"policy": "nope"}}'}, "'batching.policy': 'nope' is not a batching policy"),
        ({"config": '{"batching": {"policy": "timeout", "late_target": 1}}'}, "'batching.late_target': not a setting"),
        ({"config": '{"batching": {"max_wait_ms": {"a": [1]}}}'}, "'batching.max_wait_ms'"),
        ({"config": '{"batching": "slo"}'}, "'batching'"),
        # bounded before it is parsed: never a RecursionError (a 500)
        ({"config": "[" * 50_000 + "]" * 50_000}, "'config' is 100,000 characters, over the 65,536"),
        ({"config": "[" * 30_000}, "'config' nests arrays and objects more than 16 deep"),
        ({"config": '{"description": "' + "[" * 1000 + '", "batching": ' + '{"a": ' * 17 + "1" + "}" * 18}, "16 deep"),
    ],
)
def test_bad_load_parameters_are_400_saying_what_to_fix(params, needle):
    with pytest.raises(InvalidArgument, match=re.escape(needle)):
        parse_load_parameters("digits", params)


@pytest.mark.parametrize("depth", [16, 17, 1000, 5000])
def test_a_deep_config_is_a_400_at_any_depth(depth):
    doc = '{"batching": ' * depth + "1" + "}" * depth
    with pytest.raises(InvalidArgument, match="'config'"):
        parse_load_parameters("digits", {"config": doc})


@pytest.mark.parametrize(
    "path, scope, model",
    [
        ("/v2/repository/index", "models", None),
        ("/v2/repository/models/digits/load", "models", "digits"),
        ("/v2/repository/models/digits/unload", "models", "digits"),
        ("/v2/models/stats", "metrics", None),
        ("/v2/models/digits/stats", "infer", "digits"),
        ("/v2/models/digits/versions/1/config", "infer", "digits"),
        ("/metrics", "metrics", None),
    ],
)
def test_each_path_needs_its_scope_and_names_its_model(path, scope, model):
    assert _scope_of(path) == scope and _model_from_path(path) == model
