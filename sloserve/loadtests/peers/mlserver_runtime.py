"""MLServer 1.7.1 peer: a small custom ONNX runtime with MLServer's adaptive batching.

MLServer has no ONNX runtime of its own, so ``OnnxRuntime`` below runs the file in ONNX Runtime
(same session settings as sloserve: 1 thread, no spinning). Run as a script, this module writes the
server and model settings into a fresh folder and starts ``mlserver start`` on it:

    .peers/mlserver/bin/python sloserve/loadtests/peers/mlserver_runtime.py --onnx model_repository/digits/small/model.onnx \
        --model digits --http-port 8200 --grpc-port 8201 --max-batch-size 32 --max-batch-time-ms 2

settings.json:        {"host": "127.0.0.1", "http_port": ..., "grpc_port": ..., "metrics_port": ...,
                       "parallel_workers": 1, "debug": false, "metrics_endpoint": null}
model-settings.json:  {"name": "digits", "implementation": "mlserver_runtime.OnnxRuntime",
                       "max_batch_size": 32, "max_batch_time": 0.002,
                       "parameters": {"uri": "<onnx file>", "extra": {"intra_op_threads": 1}}}
Tuned by ``sloserve bench slo``'s tuning pass: ``max_batch_time`` and ``parallel_workers`` (MLServer's
docs: match the workers to the cores; 0 runs inference in the server process, with no IPC), metrics off.
Pitfall: workers crash with uvloop 0.23 (``There is no current event loop``); setup.sh pins uvloop<0.22.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

try:
    from mlserver import MLModel
    from mlserver.codecs import NumpyCodec
    from mlserver.types import InferenceRequest, InferenceResponse
except ImportError:  # imported outside the MLServer venv (e.g. by a linter)
    MLModel = object


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        sys.path.insert(0, str(HERE))
        from _ort import OrtModel

        extra = (self.settings.parameters.extra or {}) if self.settings.parameters else {}
        self._m = OrtModel(self.settings.parameters.uri, int(extra.get("intra_op_threads", 1)))
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        out = self._m.run(x.reshape(x.shape[0], -1))
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[NumpyCodec.encode_output(name, arr) for name, arr in out.items()],
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onnx", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--http-port", type=int, default=8200)
    p.add_argument("--grpc-port", type=int, default=8201)
    p.add_argument("--metrics-port", type=int, default=0, help="0: --grpc-port + 1")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-batch-time-ms", type=float, default=2.0)
    p.add_argument("--parallel-workers", type=int, default=1, help="MLServer's default is 1 worker process")
    p.add_argument("--intra-op-threads", type=int, default=1)
    p.add_argument("--metrics", action="store_true", help="MLServer's metrics server (off: less CPU per request)")
    args = p.parse_args()

    root = Path(tempfile.mkdtemp(prefix="sloserve-mlserver-"))
    model_dir = root / args.model
    model_dir.mkdir()
    (root / "settings.json").write_text(
        json.dumps(
            {
                "host": "127.0.0.1",
                "http_port": args.http_port,
                "grpc_port": args.grpc_port,
                "metrics_port": args.metrics_port or args.grpc_port + 1,
                "parallel_workers": args.parallel_workers,
                "debug": False,
                **({} if args.metrics else {"metrics_endpoint": None}),
            },
            indent=1,
        )
    )
    (model_dir / "model-settings.json").write_text(
        json.dumps(
            {
                "name": args.model,
                "implementation": "mlserver_runtime.OnnxRuntime",
                "max_batch_size": args.max_batch_size,
                "max_batch_time": args.max_batch_time_ms / 1000.0,
                "parameters": {
                    "uri": str(Path(args.onnx).resolve()),
                    "extra": {"intra_op_threads": args.intra_op_threads},
                },
            },
            indent=1,
        )
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{HERE}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(HERE)
    exe = Path(sys.executable).with_name("mlserver")
    print(f"mlserver settings in {root}", flush=True)
    os.execve(str(exe), [str(exe), "start", str(root)], env)


if __name__ == "__main__":
    sys.exit(main())
