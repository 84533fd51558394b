"""Does Python's garbage collector make sloserve's latency tail? Runs sloserve's CLI under a
wrapper that times every collection (``gc.callbacks``) and can ``gc.freeze()`` the start-up heap
after N seconds, drives it closed-loop with wrk, and prints throughput, latency and the pauses.

    .venv/bin/python -m sloserve.loadtests.bench.gc_probe --freeze-after 0    # as shipped
    .venv/bin/python -m sloserve.loadtests.bench.gc_probe --freeze-after 5    # gc.freeze() once serving

Exploratory: it changes nothing in sloserve/gateway/; it shows what a gc.freeze() at start-up would buy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sloserve.loadtests.bench.closed import run_wrk, write_lua
from sloserve.loadtests.bench.systems import (
    BatchingKnobs,
    default_tmp,
    make_launch,
    request_body,
)

WRAPPER = r"""
import atexit, gc, os, sys, threading, time
stats, t0 = {}, [0.0]
def cb(phase, info):
    if phase == "start":
        t0[0] = time.perf_counter()
    else:
        stats.setdefault(info["generation"], []).append(time.perf_counter() - t0[0])
gc.callbacks.append(cb)
def dump():
    with open(os.environ["GC_PROBE_OUT"], "w") as f:
        for g, v in sorted(stats.items()):
            v = sorted(v)
            f.write(f"gen{g}: n={len(v)} total={sum(v)*1e3:.1f} ms p50={v[len(v)//2]*1e3:.3f} ms "
                    f"max={v[-1]*1e3:.2f} ms\n")
        f.write(f"tracked objects at exit: {len(gc.get_objects())}, frozen: {gc.get_freeze_count()}\n")
atexit.register(dump)
after = float(os.environ.get("GC_PROBE_FREEZE_AFTER", "0"))
if after > 0:
    def later():
        time.sleep(after); gc.collect(); gc.freeze()
    threading.Thread(target=later, daemon=True).start()
from sloserve.cli import main
sys.exit(main(sys.argv[1:]))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="digits")
    p.add_argument("--variant", default="small")
    p.add_argument("--repo", default="model_repository")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--duration", type=float, default=10)
    p.add_argument("--freeze-after", type=float, default=0.0, help="gc.freeze() this many seconds after start")
    p.add_argument("--nice", type=int, default=0)
    args = p.parse_args(argv)
    tmp = default_tmp()
    repo = Path(args.repo)
    launch = make_launch("sloserve", repo, args.model, args.variant, BatchingKnobs(), tmp)
    wrapper = tmp / "gcwrap.py"
    wrapper.write_text(WRAPPER)
    out = tmp / "gcstats.txt"
    launch.argv = [sys.executable, str(wrapper), *launch.argv[3:]]  # drop "-m sloserve.cli"
    launch.env = {"GC_PROBE_OUT": str(out), "GC_PROBE_FREEZE_AFTER": str(args.freeze_after)}
    body = request_body(repo, args.model)
    (tmp / "body.json").write_bytes(body)
    write_lua(tmp / "p.lua", tmp / "body.json", launch.headers)
    launch.start(tmp / "logs", args.nice)
    try:
        launch.wait_ready(body)
        run_wrk(launch.infer_url, tmp / "p.lua", args.concurrency, 3, 1, args.nice)
        w = run_wrk(launch.infer_url, tmp / "p.lua", args.concurrency, args.duration, 1, args.nice)
    finally:
        launch.stop()
    secs = w["duration_us"] / 1e6
    print(
        f"freeze_after={args.freeze_after}: {w['requests'] / secs:.0f} rps  p50 {w['p50_us'] / 1e3:.2f} ms  "
        f"p90 {w['p90_us'] / 1e3:.2f} ms  p99 {w['p99_us'] / 1e3:.2f} ms  max {w['max_us'] / 1e3:.1f} ms"
    )
    print(out.read_text() if out.exists() else "(no GC statistics written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
