"""ONNX Runtime session shared by the peer servers, with the same settings sloserve uses:
one intra-op and one inter-op thread, sequential execution, no spinning (steady on a shared
2-core box). Imports only numpy and onnxruntime so that every peer's venv can load it."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort


class OrtModel:
    def __init__(self, path: str, intra_op_threads: int = 1):
        so = ort.SessionOptions()
        so.intra_op_num_threads = intra_op_threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        self.session = ort.InferenceSession(path, sess_options=so, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        self.output_names = [o.name for o in self.session.get_outputs()]
        shape = self.session.get_inputs()[0].shape
        self.features = int(shape[1])

    def run(self, x: np.ndarray) -> dict[str, np.ndarray]:
        outs = self.session.run(self.output_names, {self.input_name: np.ascontiguousarray(x, dtype=np.float32)})
        return dict(zip(self.output_names, outs, strict=False))
