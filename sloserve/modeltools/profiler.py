"""``sloserve profile``: measure every (model, variant) on this device and write its profile.

For each batch size (powers of two up to ``max_batch_size``, plus the max itself) the session runs
``warmup`` untimed and ``iters`` timed batches of random inputs; p50/p99 latency and throughput go
to ``<repo>/<model>/<variant>/profiles/<device_type>.json``, the file :class:`ProfileTable`
reads. The device type is the GPU name (nvidia-smi) or the CPU model, slugged, so profiles from
several machines live side by side in one repository.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from sloserve.batching.profile import write_profile
from sloserve.models.datatypes import V2_TO_NUMPY
from sloserve.models.repository import ModelRepository
from sloserve.replica.runtime import Replica, RuntimeOptions, device_type, ort


def batch_sizes(max_batch: int) -> list[int]:
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


def profile_inputs(model, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The random batch a profile point is measured on (images' value range 0..16)."""
    feeds = {}
    for t in model.config.inputs:
        shape = (rows, *[d if d > 0 else 1 for d in t.shape])
        dtype = V2_TO_NUMPY[t.datatype]
        feeds[t.name] = (rng.random(shape) * 16).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
    return feeds


def profile_repo(
    repo: str | Path,
    opts: RuntimeOptions,
    iters: int = 100,
    warmup: int = 10,
    models: Iterable[str] | None = None,
    quiet: bool = False,
) -> list[Path]:
    r = ModelRepository(repo).load()
    dev = device_type(opts.device)
    rng = np.random.default_rng(0)
    jobs = [
        (name, m, v.name, b)
        for name, m in sorted(r.models.items())
        if models is None or name in models
        for v in m.config.variants
        for b in batch_sizes(m.config.max_batch_size)
    ]
    written: list[Path] = []
    bar = tqdm(total=len(jobs), desc=f"profiling on {dev}", unit="point", disable=quiet)
    results: dict[tuple[str, str], dict] = {}
    replicas: dict[tuple[str, str], Replica] = {}
    for name, m, variant, b in jobs:
        key = (name, variant)
        if key not in replicas:
            replicas[key] = Replica(m.onnx_path(variant), opts, [o.name for o in m.config.outputs])
        rep = replicas[key]
        feeds = profile_inputs(m, b, rng)
        for _ in range(warmup):
            rep.run(feeds)
        times = np.empty(iters)
        for i in range(iters):
            t0 = time.perf_counter()
            rep.run(feeds)
            times[i] = time.perf_counter() - t0
        doc = results.setdefault(
            key,
            {
                "model": name,
                "variant": variant,
                "device_type": dev,
                "batch_sizes": [],
                "p50_ms": [],
                "p99_ms": [],
                "throughput_rps": [],
                "accuracy": m.config.variant(variant).accuracy,
                "iters": iters,
                "runtime": {
                    "intra_op_threads": opts.intra_op_threads,
                    "allow_spinning": opts.allow_spinning,
                    "providers": rep.session.get_providers(),
                    "onnxruntime": ort.__version__,
                },
                "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        )
        p50, p99 = np.percentile(times, [50, 99]) * 1e3
        doc["batch_sizes"].append(b)
        doc["p50_ms"].append(round(float(p50), 4))
        doc["p99_ms"].append(round(float(max(p99, p50)), 4))
        doc["throughput_rps"].append(round(b / (p50 / 1e3), 1))
        bar.update()
        bar.set_postfix_str(f"{name}/{variant} b={b} p50={p50:.3f}ms")
    bar.close()
    for (name, variant), doc in results.items():
        path = r.models[name].profile_dir(variant) / f"{dev}.json"
        write_profile(path, doc)
        written.append(path)
    return written
