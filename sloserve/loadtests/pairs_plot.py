"""Draw a ``sloserve sim --device-types`` run (docs/img/variant_device_pairs.png): what the pair-choosing
``slo`` policy served over time, by (variant, device type), and the effective accuracy and attainment
of every system of the run (the pair choice, each variant on all types, each single pair).

    sloserve sim --repo model_repository --pair-model heavy --device-types cpu:1,emul-slow:1 \\
        --emulate emul-slow=2 --rate 3000 --burst-factor 3 --duration-s 3 --slo-ms 20 \\
        --out out/pairs --pairs-plot docs/img/variant_device_pairs.png
    python -m sloserve.loadtests.pairs_plot out/pairs/pairs.json docs/img/variant_device_pairs.png   # again, from the JSON
"""

from __future__ import annotations

import json
import sys
from typing import Any


def draw(doc: dict[str, Any], path: str, rate: float | None = None, factor: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    systems = doc["systems"]
    pairs = systems["pairs"]
    keys = list(pairs["rows"])
    tl = pairs["timeline"]
    w = (tl[1]["t"] - tl[0]["t"]) if len(tl) > 1 else 1.0
    t = np.array([b["t"] for b in tl])
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 7.5), gridspec_kw={"height_ratios": [3, 2]})
    stack = np.array([[b["on_time"][k] / w for b in tl] for k in keys])
    ax1.stackplot(t, stack, labels=keys, step="post", alpha=0.85)
    ax1.step(t, [b["requests"] / w for b in tl], where="post", color="k", lw=1.2, label="offered (requests/s)")
    ax1.set_xlabel("time (s)")
    ax1.set_ylabel("answered on time (requests/s)")
    load = f", {rate:g}/s with a x{factor:g} burst" if rate and factor else ""
    ax1.set_title(f"{doc['model']}: the slo policy's pair per batch (SLO {doc['slo_ms']:g} ms{load})")
    ax1.legend(loc="upper left", fontsize=8, ncol=2)
    names = list(systems)
    eff = [systems[n]["effective_accuracy"] for n in names]
    att = [systems[n]["attainment"] for n in names]
    x = np.arange(len(names))
    ax2.bar(x - 0.2, eff, 0.4, label="effective accuracy")
    ax2.bar(x + 0.2, att, 0.4, label="SLO attainment")
    ax2.set_xticks(
        x,
        [n.replace("pair:", "").replace("variant:", "all types: ") for n in names],
        rotation=30,
        ha="right",
        fontsize=8,
    )
    ax2.set_ylim(0, 1.05)
    ax2.legend(loc="lower left", fontsize=8)
    ax2.set_title("every system on the same arrivals", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    from pathlib import Path

    draw(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2])
