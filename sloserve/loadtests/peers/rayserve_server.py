"""Ray Serve 2.60 peer: Serve's own HTTP proxy + one deployment with ``@serve.batch`` running ONNX
Runtime, answering KServe-V2-compatible JSON on POST /v2/models/<model>/infer (so the same load
generator drives it as sloserve, Triton and MLServer).

    .venv/bin/python sloserve/loadtests/peers/rayserve_server.py --onnx model_repository/digits/small/model.onnx \
        --model digits --http-port 8300 --max-batch-size 32 --batch-wait-ms 2

Its best configuration is tuned by ``sloserve bench slo``'s tuning pass: the batch wait, the number of
replicas, and Ray Serve's documented high-throughput mode (``--throughput-optimized``:
``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``, which runs user code and the router on the replica's own loop, uses
gRPC between Serve's processes and freezes the garbage collector at start).

A private local Ray (``address="local"``, num_cpus=2, its own temp dir) so it never joins or
disturbs another Ray on the machine; the replica asks for a fractional CPU. Stop it with SIGTERM to
this process (or its process group): the driver shuts Serve and Ray down. Never ``ray stop``.
HTTP binds 127.0.0.1 (Ray's internal ports may still bind all interfaces, see peers.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def build_app(
    onnx: str,
    model: str,
    max_batch_size: int,
    batch_wait_s: float,
    num_cpus: float,
    intra_op_threads: int,
    replicas: int = 1,
):
    import numpy as np
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    loads: Callable[[bytes], Any]
    dumps: Callable[[Any], bytes]
    try:
        import orjson

        loads, dumps = orjson.loads, lambda o: orjson.dumps(o, option=orjson.OPT_SERIALIZE_NUMPY)
    except ImportError:  # pragma: no cover
        import json

        loads, dumps = json.loads, lambda o: json.dumps(o).encode()

    class OnnxV2:
        def __init__(self):
            sys.path.insert(0, str(HERE))
            from _ort import OrtModel

            self.m = OrtModel(onnx, intra_op_threads)

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_s)
        async def run(self, xs: list):
            sizes = [x.shape[0] for x in xs]
            out = self.m.run(np.concatenate(xs) if len(xs) > 1 else xs[0])
            res, start = [], 0
            for n in sizes:
                res.append({k: v[start : start + n] for k, v in out.items()})
                start += n
            return res

        async def __call__(self, request: Request):
            if request.method != "POST" or not request.url.path.rstrip("/").endswith("/infer"):
                return JSONResponse({"error": f"only POST /v2/models/{model}/infer"}, status_code=404)
            try:
                body = loads(await request.body())
                t = body["inputs"][0]
                x = np.asarray(t["data"], dtype=np.float32).reshape(t["shape"])
            except Exception as e:
                return JSONResponse({"error": f"bad request: {e}"}, status_code=400)
            out = await self.run(x)
            payload = {
                "model_name": model,
                "outputs": [
                    {
                        "name": "probs",
                        "datatype": "FP32",
                        "shape": list(out["probs"].shape),
                        "data": out["probs"].ravel(),
                    },
                    {
                        "name": "label",
                        "datatype": "INT64",
                        "shape": list(out["label"].shape),
                        "data": out["label"].ravel(),
                    },
                ],
            }
            if "id" in body:
                payload["id"] = body["id"]
            return Response(dumps(payload), media_type="application/json")

    # applied as a call, not as ``@serve.deployment(...)``: mypy keeps a decorated class's own type
    deployment = serve.deployment(
        ray_actor_options={"num_cpus": num_cpus},
        max_ongoing_requests=256,
        num_replicas=replicas,
        logging_config={"enable_access_log": False},
    )(OnnxV2)
    return deployment.bind()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onnx", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--http-port", type=int, default=8300)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-wait-ms", type=float, default=2.0)
    p.add_argument("--num-cpus", type=float, default=0.5, help="CPUs the replica asks Ray for (fractional)")
    p.add_argument("--ray-cpus", type=int, default=2)
    p.add_argument("--intra-op-threads", type=int, default=1)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument(
        "--throughput-optimized",
        action="store_true",
        help="RAY_SERVE_THROUGHPUT_OPTIMIZED=1: Ray Serve's high-throughput mode",
    )
    p.add_argument(
        "--haproxy",
        action="store_true",
        help="RAY_SERVE_ENABLE_HA_PROXY=1: HAProxy in front of the replicas' own HTTP servers (Debian's "
        "haproxy package), with the high-throughput mode",
    )
    args = p.parse_args()
    if args.throughput_optimized or args.haproxy:  # read by Ray Serve at import, here and in Ray's workers
        os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"
    if args.haproxy:
        import shutil

        os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
        os.environ.setdefault("RAY_SERVE_HAPROXY_BINARY_PATH", shutil.which("haproxy") or "/usr/sbin/haproxy")

    import ray
    from ray import serve

    # Ray's socket paths are length-limited (~107 bytes): use TMPDIR only while it is short
    base = tempfile.gettempdir()
    tmp = tempfile.mkdtemp(prefix="srb-", dir=base if len(base) <= 48 else "/tmp")
    ray.init(
        address="local",
        num_cpus=args.ray_cpus,
        include_dashboard=False,
        _temp_dir=tmp,
        log_to_driver=False,
        configure_logging=False,
    )
    stop = threading.Event()

    def _term(*_):
        stop.set()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.http_port})
        app = build_app(
            args.onnx,
            args.model,
            args.max_batch_size,
            args.batch_wait_ms / 1000.0,
            args.num_cpus,
            args.intra_op_threads,
            args.replicas,
        )
        serve.run(app, name=args.model, route_prefix=f"/v2/models/{args.model}")
        print(f"rayserve ready: http 127.0.0.1:{args.http_port} model {args.model} pid {os.getpid()}", flush=True)
        stop.wait()
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
