"""How close to the clairvoyant oracle can a causal autoscaler get? A hindsight-tuned bound .

    python -m sloserve.sim.bound [--column C[,C...]] [--seasonal-period-s 300] [--out results.json]

The question: can swayam meet the SLA in >= 99 % of minutes at <= 1.1x the oracle's replica-seconds?
This module measures what that asks of *any* policy that does not see the future. It runs the
oracle's own sizing (``sloserve.autoscaler.queueing.replicas_needed``, no margin of its own, scale-in at
once) in the fluid simulator, but feeds it, instead of the future peak, a **hindsight-reactive**
rate: the true rate of the trace (no Poisson noise, no report lag, no gateway shares to
aggregate) at its highest over the last ``K`` seconds, times ``1 + m``. With
``--seasonal-period-s P`` it also gets, for free, the rise the trace made at this phase one period
earlier, on top of the current rate (a replay of one period: not every seasonal term, since a trace can
recur at several periods).

That policy measures better than any real one, and ``K`` and ``m`` are then **chosen per trace in
hindsight**: for each ``K`` the smallest ``m`` whose run meets the SLA in >= 99 % of minutes, and of
those the cheapest. The result is optimistic for the whole family of "react to the recent peak
plus a margin" policies: a trace on which even it costs more than 1.1x the oracle cannot meet
that goal with such a policy. Only knowledge of rises before they happen (seasonality)
can, and ``--seasonal-period-s`` says how far a replay of one period would take it.

The setup is the one of docs/benchmarks.md "Simulator: autoscaling" (``--peak-replicas 8``,
``gpt2-gen`` on ``t4``, SLO 1 s, 10 s start-up and rounds, 2 gateways, seed 0), with the same
flags to change it.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sloserve.sim.arrivals import AZURE_FUNCTIONS_2019, from_counts
from sloserve.sim.control import Controller, ModelSpec
from sloserve.sim.engine import SimConfig
from sloserve.sim.fluid import simulate_fluid
from sloserve.sim.profiles import default_profiles, service_for
from sloserve.sim.run import make_spec

TRACE = str(AZURE_FUNCTIONS_2019)
COLUMNS = ["aggregate_1350fn", "diurnal_strong", "diurnal_onoff", "steady_mild_diurnal", "business_hours_bursty"]
LOOKBACKS_S = (10.0, 60.0, 120.0, 180.0, 300.0)
MARGINS = tuple(round(0.02 * i, 2) for i in range(31))  # 0 .. 0.60


def hindsight_rate(
    rates: np.ndarray,
    interval_s: float,
    now: float,
    lookback_s: float,
    seasonal_period_s: float | None = None,
    horizon_s: float = 20.0,
) -> float:
    """The true rate at its highest over ``(now - lookback_s, now]`` (whole trace intervals), raised,
    with a seasonal period, by the relative rise the trace made over ``horizon_s`` one period earlier.

    >>> r = np.array([10.0, 10.0, 30.0, 10.0, 10.0, 30.0])
    >>> hindsight_rate(r, 60.0, 130.0, 60.0), hindsight_rate(r, 60.0, 170.0, 60.0)
    (30.0, 30.0)
    >>> hindsight_rate(r, 60.0, 110.0, 10.0), hindsight_rate(r, 60.0, 230.0, 10.0)
    (10.0, 10.0)
    >>> hindsight_rate(r, 60.0, 290.0, 10.0, seasonal_period_s=180.0)  # 3x at this phase, a period ago
    30.0
    """
    if seasonal_period_s is not None and seasonal_period_s <= horizon_s:
        raise ValueError(
            f"seasonal_period_s ({seasonal_period_s:g} s) must exceed the look-ahead ({horizon_s:g} s): "
            "a shorter period would read the rate after now"
        )
    n = len(rates)
    i1 = min(int(now // interval_s), n - 1)
    i0 = min(max(int((now - lookback_s + 1e-9) // interval_s), 0), i1)  # intervals meeting (now - lookback_s, now]
    peak = float(rates[i0 : i1 + 1].max())
    if seasonal_period_s:
        j0 = int((now - seasonal_period_s) // interval_s)
        j1 = int((now - seasonal_period_s + horizon_s) // interval_s)
        if j0 >= 0 and rates[j0] > 0:
            rise = float(rates[j0 : min(j1, n - 1) + 1].max()) / float(rates[j0])
            peak = max(peak, float(rates[i1]) * max(rise, 1.0))
    return peak


class HindsightController(Controller):
    """The ``oracle`` policy, fed ``peak_at(now)`` (:func:`hindsight_rate` with a margin) instead of the
    future peak. One model: the rate is one trace's."""

    def __init__(self, *args, peak_at: Callable[[float], float]):
        super().__init__(*args)
        self.peak_at = peak_at

    def round_snapshots(self, now: float, snaps: list) -> list[int]:
        if len(snaps) != 1:
            raise ValueError("the hindsight bound drives one model at a time (one trace's rates)")
        peak = self.peak_at(now)
        return super().round_snapshots(now, [dataclasses.replace(s, future_peak_rps=peak) for s in snaps])


def bound(
    spec: ModelSpec,
    cfg: SimConfig,
    lookbacks_s=LOOKBACKS_S,
    margins=MARGINS,
    sla_minutes: float = 0.99,
    seasonal_period_s: float | None = None,
) -> dict[str, Any]:
    """The hindsight-tuned bound for one model (see the module text): the oracle's run, and per
    look-back the smallest margin meeting ``sla_minutes`` (``met``), or, when none does, the margin that came
    closest, with its cost against the oracle's; ``best`` is the cheapest that met it (None: none did)."""
    oracle = simulate_fluid([spec], "oracle", cfg)["summary"]
    horizon = cfg.startup_s + cfg.tick_s
    rates, interval = spec.arrivals.rates, spec.arrivals.interval_s
    rows: list[dict[str, Any]] = []
    for k in lookbacks_s:
        row: dict[str, Any] | None = None
        for m in margins:

            def peak_at(now: float, k: float = k, m: float = m) -> float:
                return hindsight_rate(rates, interval, now, k, seasonal_period_s, horizon) * (1.0 + m)

            ctl = functools.partial(HindsightController, peak_at=peak_at)
            s = simulate_fluid([spec], "oracle", cfg, controller_cls=ctl)["summary"]
            met = s["minutes_sla_met_fraction"] >= sla_minutes
            if row is None or met or s["minutes_sla_met_fraction"] > row["minutes_sla_met_fraction"]:
                row = {
                    "lookback_s": k,
                    "margin": m,
                    "met": met,
                    "minutes_sla_met_fraction": s["minutes_sla_met_fraction"],
                    "replica_seconds": s["replica_seconds"],
                    "vs_oracle": s["replica_seconds"] / oracle["replica_seconds"],
                }
            if met:
                break
        if row is None:
            raise ValueError("the hindsight bound needs at least one margin")
        rows.append(row)  # the smallest margin that met the SLA minutes, else the margin that came closest
    met_rows = [r for r in rows if r["met"]]
    best = min(met_rows, key=lambda r: r["vs_oracle"]) if met_rows else None
    return {
        "oracle": {
            "minutes_sla_met_fraction": oracle["minutes_sla_met_fraction"],
            "replica_seconds": oracle["replica_seconds"],
        },
        "seasonal_period_s": seasonal_period_s,
        "per_lookback": rows,
        "best": best,
    }


def _positive(text: str) -> float:
    x = float(text)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be > 0")
    return x


def _positive_int(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return n


def _lookbacks(text: str) -> tuple[float, ...]:
    """``--lookbacks-s``: a comma list of positive seconds."""
    try:
        ks = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive seconds, comma-separated (e.g. 60,120)") from None
    if not ks or any(not k > 0 for k in ks):
        raise argparse.ArgumentTypeError(f"{text!r}: every look-back must be > 0 s")
    return ks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sloserve.sim.bound", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default=TRACE)
    p.add_argument("--column", default=",".join(COLUMNS))
    p.add_argument("--interval-s", type=_positive, default=60.0)
    p.add_argument("--peak-replicas", type=_positive_int, default=8)
    p.add_argument("--model-class", default="gpt2-gen")
    p.add_argument("--device", default="t4")
    p.add_argument("--slo-ms", type=_positive, default=1000.0)
    p.add_argument("--max-batch", type=_positive_int, default=64)
    p.add_argument("--startup-s", type=float, default=10.0)
    p.add_argument("--tick-s", type=_positive, default=10.0)
    p.add_argument("--gateways", type=_positive_int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seasonal-period-s",
        type=float,
        default=None,
        help="replay the rise the trace made one period earlier (must exceed start-up + round)",
    )
    p.add_argument(
        "--lookbacks-s",
        type=_lookbacks,
        default=LOOKBACKS_S,
        help="look-backs tried, seconds (comma list of positive numbers)",
    )
    p.add_argument("--out", default=None, help="write the JSON here too")
    a = p.parse_args(argv)
    if a.startup_s < 0:
        p.error(f"--startup-s {a.startup_s:g} must be >= 0")
    horizon = a.startup_s + a.tick_s
    if a.seasonal_period_s is not None and a.seasonal_period_s <= horizon:
        p.error(
            f"--seasonal-period-s {a.seasonal_period_s:g} must exceed start-up + round ({horizon:g} s): "
            "a shorter period would read the rate after now"
        )
    try:  # bad input is a one-line error before any simulation runs
        svc = service_for(default_profiles(), a.model_class, a.device, a.slo_ms, a.max_batch)
        series = [from_counts(a.trace, col, a.interval_s) for col in a.column.split(",")]
    except (KeyError, ValueError, OSError) as e:
        p.error(str(e.args[0] if isinstance(e, KeyError) else e))
    cfg = SimConfig(startup_s=a.startup_s, tick_s=a.tick_s, gateways=a.gateways, seed=a.seed)
    out: dict[str, Any] = {"argv": sys.argv[1:] if argv is None else argv, "columns": {}}
    for col, arrivals in zip(a.column.split(","), series, strict=True):
        spec = make_spec(col, arrivals, svc, a.device, peak_replicas=a.peak_replicas)
        res = out["columns"][col] = bound(spec, cfg, a.lookbacks_s, seasonal_period_s=a.seasonal_period_s)
        b = res["best"]
        print(
            f"{col:22s} oracle {res['oracle']['replica_seconds']:>10,.0f} replica-s; best hindsight-reactive: "
            + (
                f"{b['vs_oracle']:.3f}x oracle (look-back {b['lookback_s']:.0f} s, margin {b['margin']:.2f}, "
                f"{b['minutes_sla_met_fraction'] * 100:.2f}% of minutes)"
                if b
                else "none meets the SLA minutes; closest: "
                + ", ".join(
                    f"{r['minutes_sla_met_fraction'] * 100:.2f}% (look-back {r['lookback_s']:.0f} s, margin "
                    f"{r['margin']:.2f}, {r['vs_oracle']:.2f}x)"
                    for r in res["per_lookback"]
                )
            ),
            flush=True,
        )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
