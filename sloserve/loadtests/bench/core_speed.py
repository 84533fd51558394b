"""How steady this machine's cores are, with nothing of ours running: a fixed pure-Python loop's CPU
time (its own thread clock, so waiting for a core does not count), sampled for a while.

    .venv/bin/python -m sloserve.loadtests.bench.core_speed --seconds 120

On a dedicated core the loop costs the same every time. On a shared virtual machine it costs more
in spells, and more often the longer the core idled before it (``--gap-ms``); every process here then
runs slower by the same factor, so a server's tail at light load and its highest rate at an SLO move
with it. Prints the fastest sample, the median, the share of samples (≈ of time) at 1.5x the fastest
or more, and how long such slow spells lasted."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from sloserve.loadtests.bench.procstat import core_speed_ms


def spells(times: list[float], slow: list[bool]) -> list[float]:
    """Lengths (s) of the runs of consecutive slow samples, each from its first slow sample to the
    first fast one after it (a run still slow at the end counts to the last sample).

    >>> spells([0.0, 0.1, 0.2, 0.3, 0.4], [False, True, True, False, True])
    [0.2, 0.0]
    """
    out: list[float] = []
    start = None
    for t, s in zip(times, slow, strict=True):
        if s and start is None:
            start = t
        elif not s and start is not None:
            out.append(round(t - start, 3))
            start = None
    if start is not None:
        out.append(round(times[-1] - start, 3))
    return out


def sample(seconds: float, n: int, gap_s: float) -> tuple[list[float], list[float]]:
    """(time since start, ms) of one probe every ``gap_s`` for ``seconds``."""
    t0 = time.monotonic()
    times: list[float] = []
    ms: list[float] = []
    while time.monotonic() - t0 < seconds:
        ms.append(core_speed_ms(loops=1, n=n))
        times.append(time.monotonic() - t0)
        time.sleep(gap_s)
    return times, ms


def report(times: list[float], ms: list[float], factor: float = 1.5) -> dict:
    fastest = min(ms)
    slow = [x >= factor * fastest for x in ms]
    runs = spells(times, slow)
    return {
        "samples": len(ms),
        "seconds": round(times[-1], 1),
        "fastest_ms": fastest,
        "median_ms": round(statistics.median(ms), 3),
        "p90_ms": round(sorted(ms)[int(0.9 * (len(ms) - 1))], 3),
        "max_ms": max(ms),
        f"slow_share_{factor:g}x": round(sum(slow) / len(ms), 4),
        "slow_spells": len(runs),
        "slow_spell_median_s": round(statistics.median(runs), 3) if runs else None,
        "slow_spell_max_s": max(runs) if runs else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--n", type=int, default=25_000, help="additions per probe (about 0.5 ms on a fast core)")
    p.add_argument("--gap-ms", type=float, default=20.0, help="pause between probes")
    p.add_argument("--out", help="write every sample (time, ms) and the report as JSON here")
    args = p.parse_args(argv)
    if not 0 < args.seconds <= 3600 or args.n < 1 or args.gap_ms < 0:
        raise SystemExit("--seconds in (0, 3600], --n >= 1, --gap-ms >= 0")
    if args.out:  # before sampling: a bad path must not cost the run
        try:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SystemExit(f"--out: cannot create its folder: {e}") from None
    times, ms = sample(args.seconds, args.n, args.gap_ms / 1e3)
    rep = report(times, ms)
    print(json.dumps(rep, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"report": rep, "t_s": [round(t, 3) for t in times], "ms": ms}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
