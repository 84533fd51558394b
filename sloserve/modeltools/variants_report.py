"""The table, the JSON record and the plot of ``sloserve models variants``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from sloserve.modeltools.variants_types import Plan, Variant


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def table(variants: Sequence[Variant], batches: Sequence[int] = (1, 8)) -> str:
    """One row a variant: accuracy, agreement, file size, and p50 per device type at ``batches``."""
    devices = sorted({d for v in variants for d in v.p50_ms})
    head = ["variant", "accuracy", "agreement", "size"] + [f"p50 b={b} {d} (ms)" for d in devices for b in batches]
    rows = [head]
    for v in variants:
        lat = [v.p50_ms.get(d, {}).get(b) for d in devices for b in batches]
        rows.append(
            [v.name, f"{v.accuracy:.4f}", f"{v.agreement:.4f}", _size(v.size_bytes)]
            + ["-" if t is None else f"{t:.3f}" for t in lat]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def report(plan: Plan, variants: Sequence[Variant], devices: Sequence[str]) -> str:
    """``variants.json``: what was measured and on what, beside config.json."""
    doc = {
        "source": plan.source.name,
        "output": plan.output.name,
        "calibration_rows": len(plan.calib),
        "held_out_rows": len(plan.held),
        "devices": list(devices),
        "variants": [
            {
                "name": v.name,
                "kind": v.kind,
                "accuracy": v.accuracy,
                "agreement": v.agreement,
                "size_bytes": v.size_bytes,
                "params": v.params,
                "cost_flops": v.cost_flops,
                "p50_ms": {d: {str(b): t for b, t in c.items()} for d, c in v.p50_ms.items()},
            }
            for v in variants
        ],
    }
    return json.dumps(doc, indent=2)


def plot(path: Path, name: str, variants: Sequence[Variant], batches: Sequence[int] = (1, 8)) -> Path:
    """Accuracy against p50 latency, one panel per device type, a line per variant across ``batches``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = sorted({d for v in variants for d in v.p50_ms})
    fig, axes = plt.subplots(1, max(1, len(devices)), figsize=(5.5 * max(1, len(devices)), 4), squeeze=False)
    markers = "osD^v<>"
    for ax, dev in zip(axes[0], devices, strict=False):
        for i, v in enumerate(variants):
            pts = [(v.p50_ms[dev][b], b) for b in batches if b in v.p50_ms.get(dev, {})]
            if not pts:
                continue
            color = f"C{i % 10}"
            ax.plot([p[0] for p in pts], [v.accuracy] * len(pts), "-", color=color, alpha=0.5)
            for k, (t, b) in enumerate(pts):
                ax.plot(t, v.accuracy, markers[k % len(markers)], color=color, label=f"batch {b}" if i == 0 else None)
            ax.annotate(v.name, (pts[0][0], v.accuracy), textcoords="offset points", xytext=(0, 6), fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("p50 latency per batch (ms, log)")
        ax.set_ylabel("held-out accuracy")
        ax.set_title(dev, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{name}: accuracy against latency per variant and device type")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
