"""How cheap must the fallback variant be? A sweep of its cost ratio over the day-long trace runs.

    python -m sloserve.sim.fallback_sweep --ratios 0.5,0.6,0.66,0.7,0.75,0.8
    python -m sloserve.sim.fallback_sweep --ratios 0.66 --seeds 1,2
    python -m sloserve.sim.fallback_sweep --ratios 0.66 --peak-replicas 32 --columns aggregate_1350fn,diurnal_onoff,...

Replays the Azure Functions 2019 columns as the day-long runs do (gpt2-gen on a simulated T4, SLO 1 s, the
peak at 0.9 x what ``--peak-replicas`` serve, fluid mode), with every replica also holding a fallback whose
per-batch and per-row cost are ``ratio`` x gpt2-gen's (the profile's ``distilgpt2-gen`` is 0.66), and prints,
per (ratio, seed, column), swayam's minutes meeting the SLA, its replica-seconds / the oracle's, and the share
of requests on the fallback.
"""

from __future__ import annotations

import argparse
import dataclasses

from sloserve.batching.profile import Curve
from sloserve.sim.arrivals import AZURE_FUNCTIONS_2019, from_counts
from sloserve.sim.engine import SimConfig
from sloserve.sim.profiles import BATCH_SIZES, LINEAR_MS, default_profiles, service_for
from sloserve.sim.run import make_spec, run_experiment

TRACE = str(AZURE_FUNCTIONS_2019)
COLUMNS = "aggregate_1350fn,diurnal_strong,diurnal_onoff,steady_mild_diurnal,business_hours_bursty"


def with_fallback(ratio: float):
    """gpt2-gen on a T4 with a fallback at ``ratio`` of its cost (the profiles' p99 rule)."""
    base = service_for(default_profiles(), "gpt2-gen", "t4", 1000.0)
    a, b = (ratio * x for x in LINEAR_MS[("gpt2-gen", "t4")])
    curve = Curve(
        BATCH_SIZES,
        tuple((a + b * n) / 1e3 for n in BATCH_SIZES),
        tuple((1.15 * (a + b * n) + 0.3) / 1e3 for n in BATCH_SIZES),
    )
    return base, dataclasses.replace(base, fallback=dataclasses.replace(base, curve=curve))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sloserve.sim.fallback_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--ratios", default="0.66", help="fallback cost / primary cost, comma-separated")
    p.add_argument("--seeds", default="0")
    p.add_argument("--columns", default=COLUMNS)
    p.add_argument("--peak-replicas", type=int, default=8)
    p.add_argument("--trace", default=TRACE)
    a = p.parse_args(argv)
    for ratio in (float(x) for x in a.ratios.split(",")):
        base, svc = with_fallback(ratio)
        for seed in (int(x) for x in a.seeds.split(",")):
            for col in a.columns.split(","):
                spec = make_spec(col, from_counts(a.trace, col, 60.0), base, "t4", peak_replicas=a.peak_replicas)
                spec = dataclasses.replace(spec, service=svc)
                cfg = SimConfig(seed=seed, autoscaler_kwargs={"swayam": {"startup_s": 10.0, "interval_s": 10.0}})
                runs = run_experiment([spec], ["swayam", "oracle"], cfg, "fluid", None, False)
                s, o = runs["swayam"]["summary"], runs["oracle"]["summary"]
                print(
                    f"ratio {ratio:g} seed {seed} {col:22s} minutes_met {100 * s['minutes_sla_met_fraction']:.2f}% "
                    f"x_oracle {s['replica_seconds'] / o['replica_seconds']:.3f} "
                    f"on_fallback {100 * s['fallback_share']:.2f}%",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
