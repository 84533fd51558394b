"""Table of an ``ab_closed.sh`` run: per config and round, then medians and paired ratios."""

from __future__ import annotations

import collections
import glob
import json
import statistics as st
import sys


def main(tag: str, base: str | None = None) -> None:
    res: dict[str, dict[int, dict]] = collections.defaultdict(dict)
    for f in sorted(glob.glob(f"results/{tag}/*.json")):
        doc = json.load(open(f))
        r = doc["rounds"]["sloserve"][0]
        bound = (doc.get("saturation") or {}).get("bound_rows_per_s")
        if bound and "rows_per_s" in r:
            r["saturation"] = round(r["rows_per_s"] / bound, 3)
        cfg, rn = f.rsplit("/", 1)[-1][:-5].split("-r")
        if "error" in r:
            print(cfg, rn, r["error"][:200])
            continue
        res[cfg][int(rn)] = r
        print(f"{cfg:5s} r{rn} {r['rps']:7.0f} rps p50 {r['p50_ms']:6.2f} p99 {r['p99_ms']:6.2f} "
              f"srv {r['server_cores']:.2f} ({r['server_cpu_ms_per_req']:.3f} ms/req) wrk {r['wrk_cores']:.2f} "
              f"other {r['other_cores']:.2f} batch {r.get('avg_batch')} non-2xx {r['errors']['non_2xx']}"
              + (f" rows/s {r['rows_per_s']:.0f} sat {r.get('saturation')} busy {r.get('replica_busy')} "
                 f"ms/batch {r.get('compute_ms_per_batch')}" if "rows_per_s" in r else ""))
    key = "rows_per_s" if all("rows_per_s" in r for v in res.values() for r in v.values()) else "rps"
    for c, v in res.items():
        line = f"{c}: median {st.median(x[key] for x in v.values()):.0f} {key}"
        if key == "rows_per_s":
            line += f" (saturation {st.median(x.get('saturation') or 0 for x in v.values()):.3f})"
        if base and base in res and c != base:
            pr = [v[k][key] / res[base][k][key] for k in v if k in res[base]]
            line += f"  paired vs {base}: median {st.median(pr):.3f} {[round(x, 2) for x in pr]}"
        print(line)


if __name__ == "__main__":
    main(*sys.argv[1:3])
