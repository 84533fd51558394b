"""Latency p50 of each variant of one model at batch 1 and 8, through ONNX Runtime's CUDA provider
where it runs (else the CPU provider), and the ratio of the most accurate variant to the least.

Run it from the repository's root on the GPU host, after ``sloserve models build --repo REPO``:

    python deploy/gpu/variant_ratio.py REPO [--model cnn] [--iters 300] [--device auto|cuda|cpu]

It prints one line per variant (provider, nodes in ONNX Runtime's optimized graph, p50 and p99 at
each batch size) and the ratios; the sessions are the served ones (``sloserve.replica.runtime.Replica``:
ORT_ENABLE_ALL, one intra-op thread). Inputs are random rows in the model's value range (0..16).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's packages, not an older install

from sloserve.models.repository import ModelRepository
from sloserve.modeltools.profiler import profile_inputs
from sloserve.replica.runtime import Replica, RuntimeOptions, ort, session_device


def optimized_nodes(path: Path, providers: list[str]) -> int:
    """Nodes in the graph ONNX Runtime runs on ``providers`` after ORT_ENABLE_ALL."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        so.log_severity_level = 3
        ort.InferenceSession(str(path), sess_options=so, providers=providers)
        return len(onnx.load(so.optimized_model_filepath, load_external_data=False).graph.node)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", help="a built model repository")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    ap.add_argument("--iters", type=int, default=300, help="timed runs per batch size")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    m = ModelRepository(args.repo).load().models[args.model]
    outs = [o.name for o in m.config.outputs]
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__}, providers offered: {ort.get_available_providers()}")
    p50: dict[str, dict[int, float]] = {}
    for v in m.config.variants:  # most accurate first
        rep = Replica(m.onnx_path(v.name), RuntimeOptions(device=args.device), outs)
        device, provider = session_device(rep.session)
        nodes = optimized_nodes(m.onnx_path(v.name), rep.session.get_providers())
        cells = []
        for b in batches:
            feeds = profile_inputs(m, b, rng)
            for _ in range(args.warmup):
                rep.run(feeds)
            times = np.empty(args.iters)
            for i in range(args.iters):
                t0 = time.perf_counter()
                rep.run(feeds)
                times[i] = time.perf_counter() - t0
            lo, hi = np.percentile(times, [50, 99]) * 1e3
            p50.setdefault(v.name, {})[b] = float(lo)
            cells.append(f"b={b}: p50 {lo:.4f} ms, p99 {hi:.4f} ms")
        print(
            f"{args.model}/{v.name:<11} accuracy {v.accuracy:.4f}  {provider} ({device})  nodes {nodes:>3}  "
            + "  ".join(cells)
        )
    ranked = sorted(m.config.variants, key=lambda v: (-v.accuracy, v.cost_flops))
    best, worst = ranked[0].name, ranked[-1].name
    ratios = "  ".join(f"b={b}: {p50[best][b] / p50[worst][b]:.2f}x" for b in batches)
    print(f"{best} / {worst} p50 ratio  {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
