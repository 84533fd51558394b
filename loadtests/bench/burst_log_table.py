"""Per-round effective accuracy of a burst run, from `sloserve bench slo`'s log lines: each system's rounds and
median, and each `@any` system against the best single variant (`@large`, `@medium`), on medians and paired per
round.

    python loadtests/bench/burst_log_table.py docs/data/s10/burst-shared2.log [more logs: rounds pooled]
"""
import re
import statistics as st
import sys

rows = {}
for path in sys.argv[1:]:
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        m = re.search(r"\[(\S+) r(\d+)\]\s+\S+ att ([\d.]+) .* effacc ([\d.]+)", line)
        if m:
            rows.setdefault(m.group(1), {})[(path, int(m.group(2)))] = (float(m.group(3)), float(m.group(4)))
keys = sorted({k for v in rows.values() for k in v})
for s, v in rows.items():
    e = [v[k][1] for k in keys if k in v]
    print(f"{s:28s} effacc " + " ".join(f"{x:.3f}" for x in e) + f"  median {st.median(e):.4f}")
if not any(s.endswith(('@large', '@medium')) for s in rows):
    raise SystemExit("no @large or @medium rounds in these logs: nothing to compare @any with")
best = {k: max(rows[s][k][1] for s in rows if s.endswith(('@large', '@medium')) and k in rows[s]) for k in keys}
# (a round's best single variant: the better of the pinned ones in that round)
singles = {s: st.median(x[1] for x in rows[s].values()) for s in rows if s.endswith(('@large', '@medium'))}
bs = max(singles.values())
for s, v in rows.items():
    if s.endswith('@any'):
        paired = [v[k][1] - best[k] for k in keys if k in v]
        print(f"{s}: median - best single median = {100*(st.median(x[1] for x in v.values()) - bs):+.2f} points; "
              f"paired per round " + " ".join(f"{100*p:+.1f}" for p in paired) + f" (median {100*st.median(paired):+.2f})")
