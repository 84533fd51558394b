"""Triton's ``reshape``: clients send and receive a tensor in its config ``dims``; the model takes the
``reshape``. The model's own shape is accepted too (sloserve's layout names that one)."""

from types import SimpleNamespace

import numpy as np
import pytest

from sloserve.gateway.errors import InvalidArgument
from sloserve.gateway.requestcheck import to_wire, validate
from sloserve.gateway.types import InferRequest
from sloserve.models.schema import ModelConfig, TensorSpec


def state(wire_inputs=None, wire_outputs=None):
    cfg = ModelConfig(
        name="m",
        inputs=(TensorSpec(name="x", datatype="FP32", shape=(64,)),),
        outputs=(TensorSpec(name="label", datatype="INT64", shape=()),),
        max_batch_size=8,
        variants=({"name": "1", "accuracy": 0.5, "cost_flops": 0.0},),
    )
    return SimpleNamespace(
        config=cfg,
        inputs={t.name: t for t in cfg.inputs},
        outputs={t.name: t for t in cfg.outputs},
        wire_inputs=wire_inputs or {},
        wire_outputs=wire_outputs or {},
    )


def request(arr):
    return InferRequest(model="m", version=None, inputs={"x": ("FP32", arr)})


def test_an_input_in_the_config_dims_reaches_the_model_in_its_reshape():
    m = state(wire_inputs={"x": (8, 8)})
    arrays, rows = validate(m, request(np.arange(3 * 64, dtype=np.float32).reshape(3, 8, 8)))
    assert rows == 3 and arrays["x"].shape == (3, 64)
    assert arrays["x"][1, 9] == 64 + 9  # row-major, as Triton reshapes
    arrays, rows = validate(m, request(np.zeros((2, 64), np.float32)))  # the model's own shape still serves
    assert rows == 2 and arrays["x"].shape == (2, 64)


def test_a_wrong_shape_names_the_config_dims():
    m = state(wire_inputs={"x": (8, 8)})
    with pytest.raises(InvalidArgument, match=r"expects \[-1, 8, 8\]"):
        validate(m, request(np.zeros((2, 4, 16), np.float32)))
    with pytest.raises(InvalidArgument, match=r"expects \[-1, 64\]"):
        validate(state(), request(np.zeros((2, 8, 8), np.float32)))  # no reshape: only the model's shape


def test_an_output_goes_back_in_the_config_dims():
    m = state(wire_outputs={"label": (1,)})
    out = to_wire(m, {"label": np.array([3, 1, 4], np.int64)})
    assert out["label"].shape == (3, 1) and out["label"][:, 0].tolist() == [3, 1, 4]
    plain = {"label": np.array([3], np.int64)}
    assert to_wire(state(), plain) is plain
