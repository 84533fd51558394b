"""Table of an ``ab_slo.sh`` run: per file and system, each step (rate: attainment / goodput / p99 / server cores)."""

from __future__ import annotations

import glob
import json
import sys


def main(folder: str = "results/sloab") -> None:
    for f in sorted(glob.glob(f"{folder}/*.json")):
        d = json.load(open(f))
        for name, runs in d["runs"].items():
            for r in runs:
                steps = " | ".join(f"{s['rate']:.0f}: {s['attainment']:.3f} / {s['goodput_rps']:.0f} / p99 {s['p99_ms']:.1f}"
                                   f" / srv {s['server_cores']:.2f}" for s in r["steps"])
                print(f.rsplit("/", 1)[-1][:-5], name, "max@99%", r.get("max_rate_at_target"), "|", steps)


if __name__ == "__main__":
    main(*sys.argv[1:2])
