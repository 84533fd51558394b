"""Per-round effective accuracy of a burst run, from `sloserve bench slo`'s log lines: for each offered rate,
each system's rounds and median, and each `@any` system against the best single variant of its own family
(the same system pinned: `sloserve-slo@any` against `sloserve-slo@large` and `@medium`), on medians and paired
per round; a `sloserve-...-types@any` system (variants across device types) also against
the best single (variant, device type) pair (`@VARIANT+TYPE`, or a one-type `@VARIANT` system).

    python sloserve/loadtests/bench/burst_log_table.py docs/data/burst/burst8-250-r6.log [more logs: rounds pooled]
"""

import re
import statistics as st
import sys

by_rate: dict[float, dict] = {}
for path in sys.argv[1:]:
    with open(path) as f:
        lines = f.readlines()
    for line in lines:
        m = re.search(r"\[(\S+) r(\d+)\]\s+([\d.]+)/s att ([\d.]+) .* effacc ([\d.]+)", line)
        if m:
            rows = by_rate.setdefault(float(m.group(3)), {})
            rows.setdefault(m.group(1), {})[(path, int(m.group(2)))] = (float(m.group(4)), float(m.group(5)))
if not by_rate:
    raise SystemExit("no step lines ('[system rN] RATE/s att ... effacc ...') in these logs")
for rate, rows in sorted(by_rate.items()):
    if len(by_rate) > 1:
        print(f"-- base rate {rate:g}/s")
    keys = sorted({k for v in rows.values() for k in v})

    def med(system: str, rows: dict = rows) -> float:
        """The system's median effective accuracy over its rounds at this rate."""
        return st.median(r[1] for r in rows[system].values())

    for s, v in rows.items():
        e = [v[k][1] for k in keys if k in v]
        print(f"{s:28s} effacc " + " ".join(f"{x:.3f}" for x in e) + f"  median {st.median(e):.4f}")
    # runs with variants across device types (`sloserve-...-types` systems): the pair choice against the
    # best single (variant, device type) pair, i.e. a pinned `@VARIANT+TYPE` or a one-type `@VARIANT` system
    pairs_in = [
        s for s in rows if "+" in s.rpartition("@")[2] or ("-types@" not in s and "@" in s and not s.endswith("@any"))
    ]
    typed = [s for s in rows if "-types@" in s and s.endswith("@any")]
    if typed and pairs_in:
        bp = max(pairs_in, key=med)
        for s in typed:
            print(f"{s}: median - best single pair ({bp}) median = {100 * (med(s) - med(bp)):+.2f} points")
    for s, v in rows.items():
        if not s.endswith("@any"):
            continue
        # its family's pinned variants: the same system and replicas, one variant each
        # (`sloserve-slo@any` against `sloserve-slo@large` and `@medium`; `-types@any` against `-types@V`)
        family = s.rpartition("@")[0]
        singles_in = [x for x in rows if x.rpartition("@")[0] == family and x.endswith(("@large", "@medium"))]
        if not singles_in:
            print(f"{s}: no {family}@large or @medium rounds at this rate: nothing to compare it with")
            continue
        # a round's best single variant: the better of the pinned ones in that round
        best = {
            k: max(rows[x][k][1] for x in singles_in if k in rows[x])
            for k in keys
            if any(k in rows[x] for x in singles_in)
        }
        bs = max(med(x) for x in singles_in)
        paired = [v[k][1] - best[k] for k in keys if k in v and k in best]
        if not paired:
            print(f"{s}: no round in common with a pinned variant's")
            continue
        print(
            f"{s}: median - best single ({'/'.join(x.rpartition('@')[2] for x in singles_in)}) median = "
            f"{100 * (med(s) - bs):+.2f} points; paired per round "
            + " ".join(f"{100 * p:+.1f}" for p in paired)
            + f" (median {100 * st.median(paired):+.2f})"
        )
