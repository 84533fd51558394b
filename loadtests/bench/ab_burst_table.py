"""Table of an ab_burst.sh run: per pair, each arm's effective accuracy, attainment, late answers and
requests on medium; then medians, the paired median difference and how often B beat A.

    python loadtests/bench/ab_burst_table.py results/ab-burst TAG
"""

from __future__ import annotations

import glob
import json
import os
import re
import statistics as st
import sys


def load(out: str, tag: str) -> dict[tuple[str, int], dict]:
    res = {}
    for f in glob.glob(f"{out}/{tag}-*.json"):
        m = re.fullmatch(re.escape(tag) + r"-(A|B)-(\d+)\.json", os.path.basename(f))
        if not m:  # another tag that starts with this one
            continue
        step = next(iter(json.load(open(f))["runs"].values()))[0]["steps"][0]
        res[(m.group(1), int(m.group(2)))] = {
            "effacc": step["effective_accuracy"], "attainment": step["attainment"],
            "late": sum(step["late_by_variant"].values()), "medium": step["variants"].get("medium", 0)}
    return res


def main(argv: list[str]) -> int:
    out, tag = argv[1], argv[2]
    res = load(out, tag)
    pairs = sorted(r for (arm, r) in res if arm == "A" and ("B", r) in res)
    if not pairs:
        print("no complete pairs")
        return 1
    print("| pair | A effacc | B effacc | B - A (points) | A / B attainment | A / B late | A / B on medium |")
    print("|---|---|---|---|---|---|---|")
    for r in pairs:
        a, b = res[("A", r)], res[("B", r)]
        print(f"| {r} | {a['effacc']:.4f} | {b['effacc']:.4f} | {100 * (b['effacc'] - a['effacc']):+.2f} | "
              f"{a['attainment']:.4f} / {b['attainment']:.4f} | {a['late']} / {b['late']} | {a['medium']} / {b['medium']} |")
    diff = [100 * (res[("B", r)]["effacc"] - res[("A", r)]["effacc"]) for r in pairs]
    med = {k: {arm: st.median(res[(arm, r)][k] for r in pairs) for arm in "AB"} for k in ("effacc", "attainment", "late")}
    print(f"\nmedians: effective accuracy A {med['effacc']['A']:.4f} B {med['effacc']['B']:.4f}; attainment "
          f"A {med['attainment']['A']:.4f} B {med['attainment']['B']:.4f}; late A {med['late']['A']:g} B {med['late']['B']:g}; "
          f"paired median B - A {st.median(diff):+.2f} points; B better in {sum(d > 0 for d in diff)} of {len(diff)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
