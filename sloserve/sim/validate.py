"""Fluid against request-level mode on a slice of a trace (docs/simulator.md, "Request level and fluid").

    python -m sloserve.sim.validate COLUMN START_MIN END_MIN BATCHING[,BATCHING...] PEAK_REPLICAS
    python -m sloserve.sim.validate diurnal_strong 600 620 slo 4
    python -m sloserve.sim.validate business_hours_bursty 440 540 slo 8 --scale-by-day --fallback-class distilgpt2-gen

``--scale-by-day`` scales the slice as the day-long runs scale the column (its whole-day peak at
``0.9 x`` what PEAK_REPLICAS serve), instead of the slice's own peak. Each line also lists the minutes
that missed the SLA and the share of requests the fallback variant answered.

Runs every autoscaler in both modes on minutes ``START_MIN .. END_MIN`` of a column of the Azure
Functions 2019 selection (gpt2-gen on a simulated T4, SLO 1 s, 10 s start-up and rounds) and prints
one line per (batching policy, mode, autoscaler).
"""

from __future__ import annotations

import argparse

import numpy as np

from sloserve.autoscaler.queueing import capacity_rps
from sloserve.sim.arrivals import AZURE_FUNCTIONS_2019, from_counts
from sloserve.sim.engine import SimConfig
from sloserve.sim.profiles import default_profiles, service_for
from sloserve.sim.run import make_spec, run_experiment

TRACE = str(AZURE_FUNCTIONS_2019)
AUTOSCALERS = ["swayam", "ray-default", "kpa", "oracle"]
KEYS = ["requests", "slo_attainment", "minutes_sla_met_fraction", "replica_seconds", "fallback_share"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sloserve.sim.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("column")
    p.add_argument("start_min", type=float)
    p.add_argument("end_min", type=float)
    p.add_argument("batching", help="batching policies, comma-separated")
    p.add_argument("peak_replicas", type=int)
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--fallback-class", default=None, help="a cheaper variant of gpt2-gen (e.g. distilgpt2-gen)")
    p.add_argument("--autoscalers", default=",".join(AUTOSCALERS))
    p.add_argument("--scale-by-day", action="store_true", help="scale as the day-long runs do (whole-day peak)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    svc = service_for(default_profiles(), "gpt2-gen", "t4", slo_ms=1000, fallback=a.fallback_class)
    day = from_counts(a.trace, a.column, 60)
    arr = day.sliced(a.start_min * 60, a.end_min * 60)
    if a.scale_by_day:
        scale = 0.9 * capacity_rps(svc, a.peak_replicas) / float(day.rates.max())
        spec = make_spec("m", arr, svc, "t4", scale=scale)
    else:
        spec = make_spec("m", arr, svc, "t4", peak_replicas=a.peak_replicas)
    for batching in a.batching.split(","):
        for mode in ("request", "fluid"):
            cfg = SimConfig(
                seed=a.seed, batching=batching, autoscaler_kwargs={"swayam": {"startup_s": 10, "interval_s": 10}}
            )
            runs = run_experiment([spec], a.autoscalers.split(","), cfg, mode, show_progress=False)
            for name, r in runs.items():
                s = r["summary"]
                rec = r["records"][0]
                att = rec.minute_good / np.maximum(rec.minute_total, 1)
                missed = [int(a.start_min + i) for i in np.nonzero((att < 0.99) & (rec.minute_total > 0.5))[0]]
                print(
                    batching,
                    mode,
                    name,
                    round(r["wall_s"], 1),
                    {k: round(s[k], 4) for k in KEYS},
                    "missed minutes:",
                    missed,
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
