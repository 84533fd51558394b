"""The repository API's pure parts: load parameters, Triton's config and statistics shapes (they
must parse into tritonclient's own protobuf messages), and the token scope each path needs."""

from __future__ import annotations

import doctest
import json

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb

import gateway.modelinfo as modelinfo
from gateway.errors import InvalidArgument
from gateway.modelinfo import ModelStats, triton_config
from gateway.repository import parse_load_parameters
from gateway.transports.auth import _model_from_path, _scope_of
from models.repository import ModelConfig

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
    ],
)
def test_load_parameters(params, override):
    assert parse_load_parameters("digits", params) == override


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
    ],
)
def test_bad_load_parameters_are_400_saying_what_to_fix(params, needle):
    with pytest.raises(InvalidArgument, match=needle):
        parse_load_parameters("digits", params)


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
