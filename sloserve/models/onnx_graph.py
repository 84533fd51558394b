"""The demo models' common ONNX tail: softmax probabilities and the argmax label of a graph's logits."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper


def classifier_model(
    nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], logits: str, name: str, n_in: int, opset: int
) -> onnx.ModelProto:
    """A demo model's graph from its ``nodes`` up to ``logits``: ``input[-1, n_in]`` in,
    ``probs[-1, 10]`` (softmax) and ``label[-1]`` (argmax) out, checked."""
    nodes = [
        *nodes,
        helper.make_node("Softmax", [logits], ["probs"], axis=-1),
        helper.make_node("ArgMax", [logits], ["label"], axis=1, keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", n_in])],
        [
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="sloserve")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
