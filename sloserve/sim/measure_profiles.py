"""Measure the simulator's model classes on this device with ONNX Runtime (``python -m sloserve.sim.measure_profiles``).

The simulator's default curves (:mod:`sloserve.sim.profiles`) are linear fits to published figures. This
tool replaces them with measurements where a GPU is at hand: it builds the standard networks the
simulator names (torchvision ResNet-50 and EfficientNet-B0 at 224x224, Hugging Face BERT-base at
sequence length 128), with random weights (latency does not depend on the weights' values),
exports each to ONNX, and times ``session.run`` on numpy inputs for every batch size, as a replica
runs it: host-to-device and device-to-host copies included.

It needs ``torch``, ``torchvision`` and ``transformers`` (not sloserve's own dependencies; the GPU
images we profile on carry them) and writes one JSON per device type::

    {"device_type": "nvidia-h100-80gb-hbm3", "alias": "h100", "created": ..., "runtime": {...},
     "models": {"resnet50": {"batch_sizes": [...], "p50_ms": [...], "p99_ms": [...]}, ...}}

:func:`sloserve.sim.profiles.default_profiles` loads every such file from ``sloserve/sim/measured/`` under its alias,
beside the published-figure curves.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
SEQ_LEN = 128


def _export(name: str, path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Export one network to ``path``; returns its inputs as name -> (shape without batch, numpy dtype)."""
    import torch

    args: tuple[Any, ...]
    inputs: dict[str, tuple[tuple[int, ...], str]]
    if name in ("resnet50", "efficientnet-b0"):
        import torchvision

        net = torchvision.models.resnet50() if name == "resnet50" else torchvision.models.efficientnet_b0()
        args = (torch.randn(1, 3, 224, 224),)
        inputs = {"input": ((3, 224, 224), "float32")}
    elif name == "bert-base":
        from transformers import BertConfig, BertModel

        cfg = BertConfig()
        try:
            net = BertModel(cfg, add_pooling_layer=True)
            net.config._attn_implementation = "eager"
        except TypeError:
            net = BertModel(cfg)
        ids = torch.randint(0, cfg.vocab_size, (1, SEQ_LEN))
        args = (ids, torch.ones_like(ids))
        inputs = {"input_ids": ((SEQ_LEN,), "int64"), "attention_mask": ((SEQ_LEN,), "int64")}
    else:
        raise ValueError(f"unknown model class {name!r}")
    net.eval()
    names = list(inputs)
    dyn = {n: {0: "batch"} for n in names}
    with torch.no_grad():
        try:  # the TorchScript exporter: stable for these networks
            torch.onnx.export(
                net,
                args,
                str(path),
                input_names=names,
                output_names=["out"],
                dynamic_axes=dyn | {"out": {0: "batch"}},
                opset_version=17,
                dynamo=False,
            )
        except TypeError:  # torch without the dynamo switch
            torch.onnx.export(
                net,
                args,
                str(path),
                input_names=names,
                output_names=["out"],
                dynamic_axes=dyn | {"out": {0: "batch"}},
                opset_version=17,
            )
    return inputs


def _feeds(inputs: dict, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for n, (shape, dtype) in inputs.items():
        if dtype == "int64":
            out[n] = (rng.integers(0, 30000, (rows, *shape)) if n == "input_ids" else np.ones((rows, *shape))).astype(
                np.int64
            )
        else:
            out[n] = rng.standard_normal((rows, *shape)).astype(np.float32)
    return out


def measure(
    models: list[str], device: str, iters: int, warmup: int, workdir: Path, batch_sizes: tuple[int, ...] = BATCH_SIZES
) -> dict:
    from sloserve.replica.runtime import RuntimeOptions, make_session, ort

    workdir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    results, errors, providers = {}, {}, None
    for name in models:
        try:
            path = workdir / f"{name}.onnx"
            t0 = time.perf_counter()
            inputs = _export(name, path)
            print(
                f"{name}: exported in {time.perf_counter() - t0:.1f} s ({path.stat().st_size / 2**20:.0f} MiB)",
                flush=True,
            )
            sess = make_session(path, RuntimeOptions(intra_op_threads=0 if device == "cpu" else 1, device=device))
            providers = sess.get_providers()
            doc: dict[str, list[float]] = {"batch_sizes": [], "p50_ms": [], "p99_ms": [], "throughput_rps": []}
            for b in batch_sizes:
                # several input sets, rotated, so repeated runs do not measure a cache of one buffer
                sets = [_feeds(inputs, b, rng) for _ in range(4)]
                for i in range(warmup):
                    sess.run(None, sets[i % 4])
                times = np.empty(iters)
                for i in range(iters):
                    t = time.perf_counter()
                    sess.run(None, sets[i % 4])
                    times[i] = time.perf_counter() - t
                p50, p99 = np.percentile(times, [50, 99]) * 1e3
                doc["batch_sizes"].append(b)
                doc["p50_ms"].append(round(float(p50), 4))
                doc["p99_ms"].append(round(float(max(p99, p50)), 4))
                doc["throughput_rps"].append(round(b / (p50 / 1e3), 1))
                print(
                    f"  {name} b={b:4d} p50={p50:8.3f} ms p99={p99:8.3f} ms {b / (p50 / 1e3):10.1f} rows/s", flush=True
                )
            results[name] = doc
        except Exception as e:
            traceback.print_exc()
            errors[name] = f"{type(e).__name__}: {e}"
    return {
        "models": results,
        "errors": errors,
        "runtime": {
            "providers": providers,
            "onnxruntime": ort.__version__,
            "iters": iters,
            "warmup": warmup,
            "precision": "float32",
            "inputs": "numpy on the host (copies included)",
        },
    }


def main(argv: list[str] | None = None) -> int:
    from sloserve.replica.runtime import device_type

    p = argparse.ArgumentParser(prog="python -m sloserve.sim.measure_profiles", description=__doc__.split("\n")[0])
    p.add_argument("--models", default="resnet50,efficientnet-b0,bert-base")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cuda")
    p.add_argument("--alias", required=True, help="the short name the simulator uses, e.g. h100")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    p.add_argument("--workdir", default="/tmp/sloserve-zoo")
    p.add_argument("--out", default=str(Path(__file__).parent / "measured"))
    a = p.parse_args(argv)
    doc = measure(
        a.models.split(","),
        a.device,
        a.iters,
        a.warmup,
        Path(a.workdir),
        tuple(int(x) for x in a.batch_sizes.split(",")),
    )
    doc = {
        "device_type": device_type(a.device),
        "alias": a.alias,
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python -m sloserve.sim.measure_profiles " + " ".join(sys.argv[1:] if argv is None else argv),
        **doc,
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{a.alias}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}; errors: {doc['errors'] or 'none'}")
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
