"""The variants of ``sloserve models variants``: INT8 by ONNX Runtime's static quantization, FP16 by
its float16 conversion; the class a variant gives each row; a graph's FLOPs and weights."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx

from sloserve.models.repository import TensorSpec
from sloserve.replica.runtime import CUDA, RuntimeOptions, gpu_present, make_session, ort

logger = logging.getLogger(__name__)


def quantize_int8(src: Path, dst: Path, input_name: str, calib_x: np.ndarray, batch: int = 32) -> None:
    """Static INT8 quantization (QDQ, per-channel weights), activation ranges from ``calib_x``, after
    ONNX Runtime's pre-processing (shape inference and graph optimization) where it succeeds."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    pre = dst.with_name("preprocessed.onnx")
    try:  # symbolic shape inference would need sympy; ONNX's own shape inference is enough for static shapes
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        src = pre
    except Exception as e:  # an op the optimizer cannot take: quantize the graph as given
        logger.info("int8: pre-processing %s failed (%s: %s); quantizing it as given", src, type(e).__name__, e)

    class Calibration(CalibrationDataReader):
        """The calibration rows, ``batch`` at a time."""

        def __init__(self) -> None:
            self.batches = iter([{input_name: calib_x[i : i + batch]} for i in range(0, len(calib_x), batch)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantize_static(
        str(src),
        str(dst),
        Calibration(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    pre.unlink(missing_ok=True)


def convert_fp16(src: Path, dst: Path) -> None:
    """The graph in FP16 with its inputs and outputs kept FP32 (the served signature is unchanged)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(dst))


def cuda_available() -> bool:
    """ONNX Runtime offers CUDA and a GPU is visible: where FP16 pays and a CUDA profile is taken."""
    return CUDA in ort.get_available_providers() and gpu_present()


def predict(path: Path, x: np.ndarray, input_name: str, output: TensorSpec, device: str = "cpu") -> np.ndarray:
    """The class each row gets: the argmax of ``output`` (or the output itself if it is a label)."""
    sess = make_session(path, RuntimeOptions(device=device))  # the serving session's providers and options
    outs = [sess.run([output.name], {input_name: x[i : i + 256]})[0] for i in range(0, len(x), 256)]
    out = np.concatenate(outs)
    return out.astype(np.int64) if out.ndim == 1 else out.argmax(axis=1)


def flops_per_row(model: onnx.ModelProto) -> float:
    """Multiply-adds x2 per row of MatMul, Gemm and Conv nodes, from ONNX shape inference at batch 1
    (nodes whose shapes it cannot infer count 0)."""
    from onnx import numpy_helper, shape_inference

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.input:
        dims = t.type.tensor_type.shape.dim
        for i, d in enumerate(dims):
            if not d.HasField("dim_value"):
                d.dim_value = 1 if i == 0 else d.dim_value
    try:
        m = shape_inference.infer_shapes(m)
    except Exception:
        return 0.0
    shapes: dict[str, list[int]] = {}
    for vi in [*m.graph.input, *m.graph.value_info, *m.graph.output]:
        shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
    for t in m.graph.initializer:
        shapes[t.name] = list(numpy_helper.to_array(t).shape) if t.data_location == 0 else list(t.dims)
    total = 0.0
    for n in m.graph.node:
        out = shapes.get(n.output[0], [])
        a = shapes.get(n.input[0], []) if n.input else []
        w = shapes.get(n.input[1], []) if len(n.input) > 1 else []
        if not out or 0 in out or not a:
            continue
        if n.op_type in ("MatMul", "Gemm"):
            k = a[0] if n.op_type == "Gemm" and any(x.name == "transA" and x.i for x in n.attribute) else a[-1]
            total += 2.0 * float(np.prod(out)) * k
        elif n.op_type == "Conv" and len(w) >= 3:
            total += 2.0 * float(np.prod(out)) * float(np.prod(w[1:]))
    return total


def param_count(model: onnx.ModelProto) -> int:
    return int(sum(np.prod(t.dims) for t in model.graph.initializer if len(t.dims) >= 1))
