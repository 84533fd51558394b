"""The open-loop benchmark's results: per-step metrics from the generator's records, each system's highest rate at the target, medians over rounds, each peer's best configuration, ratios, the plot."""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sloserve.loadtests.bench.arrivals import step_duration
from sloserve.loadtests.bench.closed import machine
from sloserve.loadtests.bench.slo_systems import PEERS_TUNED
from sloserve.loadtests.bench.systems import (
    compute_bound,
)


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1)]


def metrics(
    recs: list[tuple],
    trailer: dict,
    args: argparse.Namespace,
    acc: dict[int, float],
    peer_acc: float | None,
    rate: float,
    duration_s: float | None = None,
) -> dict[str, Any]:
    """A step's figures; ``duration_s``: its seconds of arrivals (default: a sweep step's, ``step_duration``)."""
    slo = args.slo_ms / 1e3
    n = len(recs)
    dur = duration_s if duration_s is not None else step_duration(args, rate)
    ok_lat, on_time, eff, shed, shed_send, errors, late_ok = [], 0, 0.0, 0, [], 0, 0
    variants: dict[str, int] = {}
    late_by_variant: dict[str, int] = {}
    for sched_t, sent_t, done_t, status, v in recs:
        if 200 <= status < 300:
            lat = done_t - sched_t
            ok_lat.append(lat)
            if lat <= slo:
                on_time += 1
                eff += peer_acc if peer_acc is not None else acc.get(v, 0.0)
            else:
                late_ok += 1
            if v >= 0:
                name = args._variants[v]
                variants[name] = variants.get(name, 0) + 1
                if lat > slo:
                    late_by_variant[name] = late_by_variant.get(name, 0) + 1
        elif status in (429, 503):
            shed += 1
            if sent_t >= 0:
                shed_send.append(done_t - sent_t)
        else:
            errors += 1

    def ms(x):
        return None if x is None else round(x * 1e3, 3)

    out = {
        "rate": rate,
        "sent": n,
        "offered_rps": round(n / dur, 1),
        "attainment": round(on_time / n, 5) if n else None,
        "goodput_rps": round(on_time / dur, 1),
        "ok_rps": round(len(ok_lat) / dur, 1),
        "p50_ms": ms(pct(ok_lat, 50)),
        "p99_ms": ms(pct(ok_lat, 99)),
        "p999_ms": ms(pct(ok_lat, 99.9)),
        "late_ok": late_ok,
        "shed": shed,
        "shed_share": round(shed / n, 5) if n else None,
        "errors": errors,
        "effective_accuracy": round(eff / n, 5) if n else None,
        "shed_answer_p50_ms": ms(pct(shed_send, 50)),
        "shed_answer_p99_ms": ms(pct(shed_send, 99)),
        "shed_answer_max_ms": ms(max(shed_send, default=None)),
        "shed_answer_under_1ms": round(sum(1 for x in shed_send if x <= 1e-3) / len(shed_send), 4)
        if shed_send
        else None,
        "server_cores": round(trailer["server_cpu_s"] / dur, 3),
        # the generator's CPU while sending and receiving (its start-up, imports, excluded: gen_total_cpu_s)
        "gen_cores": round(trailer.get("run_cpu_s", trailer["gen_cpu_s"]) / dur, 3),
        "gen_cpu_ms_per_req": round(trailer.get("run_cpu_s", trailer["gen_cpu_s"]) * 1e3 / max(n, 1), 4),
        "gen_total_cpu_s": round(trailer["gen_cpu_s"], 3),
        "gen_mean_lag_ms": round(trailer.get("mean_lag_ms", 0.0), 3),
        "other_cores": round(trailer["other_cpu_s"] / dur, 3),
        "gen_max_lag_ms": round(trailer.get("max_lag_ms", 0.0), 2),
        "connections": trailer.get("opened"),
    }
    if variants:
        out["variants"] = variants  # 2xx answers by the variant that served them
        out["late_by_variant"] = late_by_variant  # of those, answered after the SLO (client clock)
    out["timeline"] = timeline(recs, slo, dur, args._variants)
    return out


def timeline(recs: list[tuple], slo: float, dur: float, names: list[str], bin_s: float = 0.5) -> dict[str, Any]:
    """Per ``bin_s`` of scheduled send time: requests sent, answered on time, late, and shed,
    and 2xx answers per variant: how a burst's third played out, not only its total."""
    n = max(1, math.ceil(dur / bin_s))
    sent, on_time, late, shed = [0] * n, [0] * n, [0] * n, [0] * n
    by_variant: dict[str, list[int]] = {}
    for sched_t, _sent_t, done_t, status, v in recs:
        k = min(n - 1, max(0, int(sched_t / bin_s)))
        sent[k] += 1
        if 200 <= status < 300:
            if done_t - sched_t <= slo:
                on_time[k] += 1
            else:
                late[k] += 1
            if 0 <= v < len(names):
                by_variant.setdefault(names[v], [0] * n)[k] += 1
        elif status in (429, 503):
            shed[k] += 1
    return {"bin_s": bin_s, "sent": sent, "on_time": on_time, "late": late, "shed": shed, "variants": by_variant}


def max_rate(
    steps: list[dict[str, Any]], target: float, start_rate: float = 0.0, rates: list[float] | None = None
) -> float:
    """Highest swept rate at which attainment >= target with every lower swept rate also passing
    (rates below start_rate were skipped as passing, by the previous round's result)."""
    best = max((r for r in (rates or []) if r < start_rate), default=0.0)
    for s in steps:
        if (s["attainment"] or 0) >= target:
            best = s["rate"]
        else:
            break
    return best


def summarise(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for system, runs in results.items():
        good = [r for r in runs if "error" not in r]
        if not good:
            out[system] = {"error": runs[0].get("error") if runs else "not run"}
            continue
        rates = [r["max_rate_at_target"] for r in good]
        by_rate: dict[float, list[dict]] = {}
        for r in good:
            for s in r["steps"]:
                by_rate.setdefault(s["rate"], []).append(s)
        curve = []
        for rate in sorted(by_rate):
            ss = by_rate[rate]
            row = {"rate": rate, "n": len(ss)}
            for k in (
                "attainment",
                "goodput_rps",
                "ok_rps",
                "p50_ms",
                "p99_ms",
                "p999_ms",
                "shed_share",
                "effective_accuracy",
                "server_cores",
                "gen_cores",
                "gen_cpu_ms_per_req",
                "other_cores",
                "shed_answer_p50_ms",
                "shed_answer_p99_ms",
                "shed_answer_under_1ms",
                "shed_server_under_1ms",
                "shed_server_p50_le_ms",
                "shed_server_p99_le_ms",
                "server_on_time",
                "core_ms",
            ):
                vals = [s[k] for s in ss if s.get(k) is not None]
                if vals:
                    row[k] = round(statistics.median(vals), 5)
            curve.append(row)
        at = [c for c in curve if c["rate"] <= statistics.median(rates)]
        lights = [r["light"] for r in good if r.get("light")]
        light = None
        if lights:
            light = {
                k: statistics.median(x[k] for x in lights if x.get(k) is not None)
                for k in ("rate", "p50_ms", "p99_ms", "p999_ms", "max_ms", "p999_over_p50", "attainment", "core_ms")
                if any(x.get(k) is not None for x in lights)
            }
            light |= {
                "sent": sum(x["sent"] for x in lights),
                "shed": sum(x["shed"] for x in lights),
                "errors": sum(x["errors"] for x in lights),
                "rounds": len(lights),
            }
        out[system] = {
            "max_rate_at_target_median": statistics.median(rates),
            "max_rate_at_target_rounds": rates,
            "light_load": light,
            "at_max_rate": at[-1] if at else None,
            "saturation_ok_rps": max((c.get("ok_rps", 0) for c in curve), default=0),
            "saturation_goodput_rps": max((c.get("goodput_rps", 0) for c in curve), default=0),
            "curve": curve,
            "ready_s": statistics.median(r["ready_s"] for r in good),
            "pss_mb": statistics.median(r["memory"]["pss_mb"] for r in good),
            # the most batches one replica held at once over every round (sloserve: at most its depth)
            "replica_peak_batches": max(
                (r["replica_peak_batches"] for r in good if r.get("replica_peak_batches")), default=None
            ),
        }
    return out


def best_configs(summary: dict[str, Any]) -> dict[str, str]:
    """Per peer, its configuration with the highest median rate at target (goodput breaks ties): when the
    rounds measure several configurations of a peer, the ratios are taken against its best one.

    >>> best_configs({"triton-0x1": {"max_rate_at_target_median": 900, "saturation_goodput_rps": 1},
    ...               "triton-5x1": {"max_rate_at_target_median": 1000, "saturation_goodput_rps": 1},
    ...               "sloserve-default": {"max_rate_at_target_median": 2000}})
    {'triton': 'triton-5x1'}
    """
    out: dict[str, str] = {}
    for peer in PEERS_TUNED:
        ok = [s for s, v in summary.items() if s.partition("-")[0] == peer and v.get("max_rate_at_target_median")]
        if ok:
            out[peer] = max(
                ok, key=lambda s: (summary[s]["max_rate_at_target_median"], summary[s].get("saturation_goodput_rps", 0))
            )
    return out


def plot(summary: dict[str, Any], args: argparse.Namespace, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for system, s in summary.items():
        if "curve" not in s:
            continue
        xs = [c["rate"] for c in s["curve"] if "attainment" in c]
        ys = [c["attainment"] * 100 for c in s["curve"] if "attainment" in c]
        ax.plot(xs, ys, marker="o", ms=3, label=f"{system} ({s['max_rate_at_target_median']:.0f}/s)")
    ax.axhline(args.target * 100, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(f"offered rate (requests/s, {args.arrival} arrivals)")
    ax.set_ylabel(f"SLO attainment (% on time within {args.slo_ms:g} ms)")
    ax.set_ylim(max(0, min(50, ax.get_ylim()[0])), 100.5)
    ax.set_title(
        f"{args.model}/{args.variant}, {args.slo_ms:g} ms SLO: attainment vs offered rate "
        f"(median of {args.rounds} rounds)",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def result_doc(
    args: argparse.Namespace, repo: Path, t_start: float, summary: dict, tuning: dict, results: dict
) -> dict[str, Any]:
    """The run's JSON: the command, machine and commit, the summary, the ratios against each peer's best
    configuration, and every round."""
    ratios = {}
    best = best_configs(summary)
    for base in best.values():
        b = summary[base]["max_rate_at_target_median"]
        if b:
            ratios[base] = {
                s: round(v["max_rate_at_target_median"] / b, 3)
                for s, v in summary.items()
                if "max_rate_at_target_median" in v and s != base
            }
    return {
        "benchmark": "slo",
        "command": "sloserve bench " + " ".join(sys.argv[sys.argv.index("slo") :]) if "slo" in sys.argv else None,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_start)),
        "wall_s": round(time.time() - t_start, 1),
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[3],
        ).stdout.strip(),
        "machine": machine(),
        "setup": {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "func"}
        | ({"trace_column": args._trace_column} if args.arrival == "trace" else {}),
        "accuracy": args._accuracy,
        "compute_bound": compute_bound(repo, args.model, args.variant, args.max_batch_size),
        "summary": summary,
        "best_configs": best,
        "ratios_of_max_rate": ratios,
        "tuning": tuning,
        "runs": results,
    }
