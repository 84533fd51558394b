"""The default latency profiles of simulated GPU types (a ProfileTable, like measured ones).

Two sources. **Measured**: every ``sloserve/sim/measured/<alias>.json`` written by
``python -m sloserve.sim.measure_profiles`` on a real GPU (ONNX Runtime's CUDA provider, the real network
with random weights) gives curves under the device type ``<alias>`` (e.g. ``h100``); measured
curves win over published-figure ones of the same name. **Published figures** (the rest): each curve is a linear fit ``latency(b) = alpha + beta * b`` (ms) whose
slope matches the order of magnitude of NVIDIA's published TensorRT/Triton inference throughput
for that network and GPU (data-center deep-learning product performance tables: ResNet-50 about
2-3k images/s on a T4 and 8-12k on an A100 at large batch; BERT-base seq-128 about 0.8-1k/s on a
T4 and 4-5k on an A100) and whose intercept is the usual ~1-2 ms launch cost. ``gpt2-gen`` is a
slow generative-style model (tens of ms per batch) that keeps request-level runs small.
p99 = 1.15 x p50 + 0.3 ms, the spread seen in profiles of batched GPU inference.

>>> t = default_profiles(); round(t.latency_s("resnet50", "default", "a100", 1, "p50") * 1e3, 3)
0.95
"""

from __future__ import annotations

import json
from pathlib import Path

from sloserve.autoscaler.types import ServiceModel
from sloserve.batching.profile import Curve, ProfileTable

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
VARIANT = "default"

# (model, device type) -> (alpha_ms, beta_ms_per_row)
LINEAR_MS: dict[tuple[str, str], tuple[float, float]] = {
    ("resnet50", "t4"): (1.5, 0.40),
    ("resnet50", "a10g"): (1.2, 0.22),
    ("resnet50", "a100"): (0.85, 0.10),
    ("bert-base", "t4"): (2.0, 1.10),
    ("bert-base", "a10g"): (1.6, 0.55),
    ("bert-base", "a100"): (1.0, 0.22),
    ("efficientnet-b0", "t4"): (1.2, 0.25),
    ("efficientnet-b0", "a10g"): (1.0, 0.14),
    ("efficientnet-b0", "a100"): (0.7, 0.06),
    ("gpt2-gen", "t4"): (40.0, 9.0),
    ("gpt2-gen", "a10g"): (30.0, 5.0),
    ("gpt2-gen", "a100"): (20.0, 2.5),
    # its fallback variant: DistilGPT2 keeps GPT-2's width and vocabulary (and so its LM head, tied to the
    # 38.6 M-parameter embedding) with 6 of its 12 blocks: 82 M parameters against 124 M, and per generated
    # token 6 x 7.1 M + 38.6 M = 81 M multiply-adds against 124 M. Both the per-batch and the per-row cost
    # are taken as 0.66 of gpt2-gen's (an estimate from those counts, not a measurement; docs/simulator.md,
    # "A fallback variant", has the results for ratios from 0.5 to 0.8)
    ("distilgpt2-gen", "t4"): (26.4, 5.94),
    ("distilgpt2-gen", "a10g"): (19.8, 3.3),
    ("distilgpt2-gen", "a100"): (13.2, 1.65),
}


MEASURED_DIR = Path(__file__).parent / "measured"


def measured_curves(directory: Path = MEASURED_DIR) -> dict[tuple[str, str, str], Curve]:
    """Curves from ``sloserve.sim.measure_profiles`` output files, keyed (model, "default", alias)."""
    curves = {}
    for path in sorted(directory.glob("*.json")):
        doc = json.loads(path.read_text())
        alias = doc.get("alias") or path.stem
        for model, c in doc.get("models", {}).items():
            curves[(model, VARIANT, alias)] = Curve(
                tuple(c["batch_sizes"]), tuple(x / 1e3 for x in c["p50_ms"]), tuple(x / 1e3 for x in c["p99_ms"])
            )
    return curves


def default_profiles(measured_dir: Path = MEASURED_DIR) -> ProfileTable:
    curves = {}
    for (model, dev), (a, b) in LINEAR_MS.items():
        p50 = tuple((a + b * n) / 1e3 for n in BATCH_SIZES)
        p99 = tuple((1.15 * (a + b * n) + 0.3) / 1e3 for n in BATCH_SIZES)
        curves[(model, VARIANT, dev)] = Curve(BATCH_SIZES, p50, p99)
    curves.update(measured_curves(measured_dir))
    return ProfileTable(curves, {})


def service_for(
    table: ProfileTable,
    model: str,
    device_type: str,
    slo_ms: float,
    max_batch_size: int = 64,
    slo_percentile: float = 0.99,
    fallback: str | None = None,
) -> ServiceModel:
    """``model``'s service on ``device_type``; with ``fallback``, that profile is its cheaper variant,
    which the batcher may serve while the primary is short of capacity."""
    curve = table.curves.get((model, VARIANT, device_type))  # no foreign fallback: a typo must not pass
    if curve is None:
        known = sorted(f"{m}@{d}" for (m, _, d) in table.curves)
        raise KeyError(f"no profile for {model} on {device_type}; known: {', '.join(known)}")
    fb = service_for(table, fallback, device_type, slo_ms, max_batch_size, slo_percentile) if fallback else None
    if fb is not None and fb.curve.at(max_batch_size, "p50") >= curve.at(max_batch_size, "p50"):
        raise KeyError(f"fallback {fallback} is not faster than {model} on {device_type}: a fallback must be cheaper")
    return ServiceModel(curve, slo_ms / 1e3, max_batch_size, slo_percentile, fb)
