"""Triton Inference Server (2.51, bundled by nvidia-pytriton) serving one ONNX file through its
dynamic batcher; the model runs in ONNX Runtime inside pytriton's Python callable.

    .peers/triton/bin/python sloserve/loadtests/peers/triton_server.py --onnx model_repository/digits/small/model.onnx \
        --model digits --http-port 8100 --grpc-port 8101 --max-queue-delay-us 2000 --instances 1

Its best configuration on a 2-core box (each choice measured with ``sloserve bench slo``'s Triton tuning
pass, docs/benchmarks.md): a plain inference callable that concatenates Triton's batch itself
(pytriton's ``@batch`` decorator adds a validation pass and per-request spans), Triton's metrics off
(``--metrics`` turns them on, for batch statistics: their collection costs CPU), 2 model instances
and a short queue delay (``--instances``, ``--max-queue-delay-us``: tuned per model and SLO).

Pitfalls handled (see ../shared/design/peers.md): the backend stub loads libpython, so the process
re-executes itself with LD_LIBRARY_PATH=<interpreter's lib dir>; the workspace folder must not exist
yet (a fresh temp path is used); Triton is stopped with SIGKILL after a short grace (the harness kills
the whole process group). Binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _ensure_libpython() -> None:
    libdir = sysconfig.get_config_var("LIBDIR") or os.path.join(sys.base_prefix, "lib")
    cur = os.environ.get("LD_LIBRARY_PATH", "")
    if libdir not in cur.split(":"):
        os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{cur}" if cur else libdir
        os.execv(sys.executable, [sys.executable, *sys.argv])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onnx", required=True, help="ONNX file to serve")
    p.add_argument("--model", required=True, help="model name in the URL (/v2/models/<model>/infer)")
    p.add_argument("--http-port", type=int, default=8100)
    p.add_argument("--grpc-port", type=int, default=8101)
    p.add_argument("--metrics-port", type=int, default=0, help="0: next free port after --grpc-port")
    p.add_argument("--max-queue-delay-us", type=int, default=2000)
    p.add_argument("--instances", type=int, default=1, help="model instances (one ORT session each)")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--preferred-batch-size", type=int, nargs="*", default=None)
    p.add_argument("--intra-op-threads", type=int, default=1)
    p.add_argument("--metrics", action="store_true", help="serve Triton's Prometheus metrics (off: faster)")
    p.add_argument("--decorator", action="store_true", help="pytriton's @batch decorator, not the plain callable")
    p.add_argument("--http-threads", type=int, default=0, help="Triton's HTTP threads (0: Triton's default)")
    p.add_argument(
        "--unrestricted",
        action="store_true",
        help="no access token on Triton's statistics, model-repository, shared-memory, trace and logging "
        "endpoints (tritonserver's own default; pytriton restricts them): perf_analyzer reads the statistics",
    )
    p.add_argument("--log-level", default="warning")
    args = p.parse_args()
    _ensure_libpython()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import numpy as np
    from _ort import OrtModel
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    def make_infer(m: OrtModel):
        if args.decorator:

            @batch
            def infer(**inputs):
                x = next(iter(inputs.values()))
                out = m.run(x)
                # Triton needs a non-empty per-row shape: label goes out as [N, 1].
                return {"probs": out["probs"], "label": out["label"].reshape(-1, 1).astype(np.int64)}

            return infer

        def infer_plain(requests):
            xs = [r["input"] for r in requests]
            out = m.run(xs[0] if len(xs) == 1 else np.concatenate(xs))
            probs, label = out["probs"], out["label"].reshape(-1, 1).astype(np.int64)
            answers, start = [], 0
            for x in xs:
                n = x.shape[0]
                answers.append({"probs": probs[start : start + n], "label": label[start : start + n]})
                start += n
            return answers

        return infer_plain

    models = [OrtModel(args.onnx, args.intra_op_threads) for _ in range(args.instances)]
    feats = models[0].features
    metrics_port = args.metrics_port or args.grpc_port + 1
    cfg = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.http_port,
        grpc_address="127.0.0.1",
        grpc_port=args.grpc_port,
        metrics_address="127.0.0.1",
        metrics_port=metrics_port,
        log_verbose=0,
        allow_metrics=args.metrics,
        allow_cpu_metrics=args.metrics,
        allow_gpu_metrics=False,
        **({"http_thread_count": args.http_threads} if args.http_threads else {}),
    )
    workspace = Path(tempfile.mkdtemp(prefix="sloserve-triton-")) / "ws"  # must not exist yet
    batcher = DynamicBatcher(
        max_queue_delay_microseconds=args.max_queue_delay_us, preferred_batch_size=args.preferred_batch_size or None
    )
    security: dict = {}
    if args.unrestricted:
        from pytriton.triton import TritonSecurityConfig

        security["security_config"] = TritonSecurityConfig(restricted_endpoints=[])
    with Triton(config=cfg, workspace=workspace, **security) as triton:
        triton.bind(
            model_name=args.model,
            infer_func=[make_infer(m) for m in models],
            inputs=[Tensor(name="input", dtype=np.float32, shape=(feats,))],
            outputs=[
                Tensor(name="probs", dtype=np.float32, shape=(-1,)),
                Tensor(name="label", dtype=np.int64, shape=(1,)),
            ],
            config=ModelConfig(max_batch_size=args.max_batch_size, batcher=batcher),
            strict=False,
        )
        print(
            f"triton ready: http 127.0.0.1:{args.http_port} grpc {args.grpc_port} model {args.model} "
            f"delay {args.max_queue_delay_us}us instances {args.instances} metrics {args.metrics} "
            f"{'@batch' if args.decorator else 'plain callable'}",
            flush=True,
        )
        triton.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
