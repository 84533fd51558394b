"""Swayam live under clumped arrivals: a Locust run replaying a timestamp trace second by second
against ``sloserve serve`` (Ray replicas, autoscaling on), with and without the burst term.

    python -m sloserve.loadtests.burst_live --out docs/data/burst_live          # both runs, ~14 minutes
    python -m sloserve.loadtests.burst_live --burst-z 2.5 --minutes 1 --calm-minutes 1 --out /tmp/b  # one short run

Each run starts a fresh server on a repository holding digits/small whose replicas take
``--delay-ms`` a batch of at most ``--max-batch`` rows (``fault_delay_ms``; the profile says so),
standing in for a GPU-bound model: on a 2-core box a real CPU model gains nothing from a second
replica, an emulated batch time does. The model scales with the swayam policy at its defaults
(``models.digits.autoscaling``: only the replica bounds set, and ``burst_z`` per run). The load is
``--calm-minutes`` at ``--mean-rps`` with Poisson arrivals, then ``--minutes`` of the Azure LLM
2023 conversation trace at its own pace (one test second a trace second), scaled to the same mean:
the same rate, now in clumps. A sampler reads the running replica count from /metrics every second.
Per minute: requests, the share within ``--slo-ms``, whether the minute met the SLA (99%), the
replicas; ``result.json`` and ``burst_live.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from sloserve.autoscaler.swayam import SwayamConfig
from sloserve.loadtests.bench.systems import Launch, free_ports, request_body
from sloserve.loadtests.emulated import slow_variant_repo
from sloserve.loadtests.promtext import prom_sum

ROOT = Path(__file__).resolve().parents[2]
TRACE = Path(__file__).resolve().parent / "traces" / "azure_llm_2023_conv.csv"
SLA = 0.99


def running_replicas(http: str, model: str) -> int | None:
    """The model's running replicas as the gateway exports them (None if /metrics does not answer)."""
    try:
        with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    return int(prom_sum(text, "sloserve_replicas", model, state="running"))


def start_server(repo: Path, settings: Path, log_dir: Path) -> tuple[Launch, str]:
    """``sloserve serve`` on free loopback ports, answering (the benchmarks' launcher)."""
    http, grpc = free_ports(2)
    argv = [sys.executable, "-m", "sloserve.cli", "serve", "--repo", str(repo), "--config", str(settings)]
    argv += ["--http-port", str(http), "--grpc-port", str(grpc), "--log-level", "warning"]
    url = f"127.0.0.1:{http}"
    server = Launch("sloserve", argv, f"http://{url}/v2/models/digits/infer", f"http://{url}/metrics", grace_s=60)
    server.start(log_dir)
    try:
        server.wait_ready(request_body(repo, "digits"), timeout_s=300)
    except BaseException:
        server.stop()
        raise
    return server, url


def calm_then_clumps(trace: Path, start_minute: int, minutes: int, calm_minutes: int, dst: Path) -> tuple[int, int]:
    """``dst``: a timestamp trace of ``calm_minutes`` at the slice's mean rate, evenly spread (sent
    open loop, that is Poisson arrivals), then the slice's own timestamps. Returns the calm
    per-second count and the slice's busiest second, in trace requests."""
    with open(trace, newline="") as f:
        times = [float(r["t_s"]) for r in csv.DictReader(f)]
    t0, t1 = 60.0 * start_minute, 60.0 * (start_minute + minutes)
    part = sorted(t - t0 for t in times if t0 <= t < t1)
    per_second = [0] * (60 * minutes)
    for t in part:
        per_second[int(t)] += 1
    calm = max(1, round(len(part) / (60 * minutes)))
    lead = 60 * calm_minutes
    stamps = [i + j / calm for i in range(lead) for j in range(calm)] + [lead + t for t in part]
    dst.write_text("t_s\n" + "".join(f"{t:.6f}\n" for t in stamps))
    return calm, max(per_second)


def one_run(a: argparse.Namespace, burst_z: float, out: Path) -> dict:
    """A fresh server, the Locust replay, the replica samples; the run's per-minute table."""
    work = Path(tempfile.mkdtemp(prefix="sloserve-burst-"))
    try:
        trace = work / "trace.csv"
        calm, busiest = calm_then_clumps(a.trace, a.start_minute, a.minutes, a.calm_minutes, trace)
        peak_rps = a.mean_rps * busiest / calm  # the calm rate is the mean: the busiest second scales alike
        repo = slow_variant_repo(ROOT / a.repo, work / "repo", "digits", "small", a.delay_ms, a.max_batch)
        settings = work / "settings.json"
        auto = {"min_replicas": 1, "max_replicas": a.max_replicas, "burst_z": burst_z}
        settings.write_text(
            json.dumps({"models": {"digits": {"slo_ms": a.slo_ms, "fault_delay_ms": a.delay_ms, "autoscaling": auto}}})
        )
        server, http = start_server(repo, settings, out)
        samples: list[tuple[float, int | None]] = []
        stop = threading.Event()
        t0 = time.time()

        def sample() -> None:
            while not stop.is_set():
                samples.append((time.time() - t0, running_replicas(http, "digits")))
                stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        results = out / f"locust_z{burst_z:g}.json"
        cmd = [sys.executable, str(Path(__file__).resolve().parent / "run.py"), "--host", f"http://{http}"]
        cmd += ["--transport", "http", "--shape", "trace", "--trace-file", str(trace), "--trace-kind", "timestamps"]
        cmd += ["--trace-column", "t_s", "--trace-start-minute", "0", "--seconds-per-minute", "60"]
        cmd += ["--duration", str(60 * (a.calm_minutes + a.minutes)), "--peak-rps", f"{peak_rps:.1f}"]
        cmd += ["--rps-per-user", str(a.rps_per_user)]
        cmd += ["--slo-ms", str(a.slo_ms), "--min-attainment", "0", "--max-error-rate", "1", "-q"]
        cmd += ["--results-json", str(results)]
        try:
            subprocess.run(cmd, cwd=ROOT, check=False, timeout=60 * (a.calm_minutes + a.minutes) + 120)
        finally:
            stop.set()
            sampler.join(5)
            server.stop()
        timeline = json.loads(results.read_text())["timeline"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "burst_z": burst_z,
        "calm_s": 60 * a.calm_minutes,
        "peak_rps": peak_rps,
        "per_second": timeline,
        "replicas": samples,
        "minutes": per_minute(timeline, samples),
    }


def per_minute(timeline: list[dict], samples: list[tuple[float, int | None]]) -> list[dict]:
    """Requests, attainment, SLA met and mean running replicas for each whole minute of the run."""
    rows = []
    last = max((p["t_s"] for p in timeline), default=-1)
    for m in range((last + 1) // 60):
        secs = [p for p in timeline if 60 * m <= p["t_s"] < 60 * (m + 1)]
        n = sum(p["requests"] for p in secs)
        hit = sum(p["requests"] * (p["attainment"] or 0) for p in secs)
        reps = [r for t, r in samples if 60 * m <= t < 60 * (m + 1) and r is not None]
        rows.append(
            {
                "minute": m,
                "requests": n,
                "attainment": hit / n if n else None,
                "sla_met": bool(n) and hit / n >= SLA,
                "replicas_mean": sum(reps) / len(reps) if reps else None,
                "replicas_max": max(reps, default=None),
            }
        )
    return rows


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs)), sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        ts = [p["t_s"] for p in run["per_second"]]
        ax.bar(ts, [p["requests"] for p in run["per_second"]], width=1.0, color="0.75", label="requests/s (sent)")
        ax.set_ylabel("requests/s")
        ax2 = ax.twinx()
        ax2.step(
            [t for t, r in run["replicas"] if r is not None],
            [r for _, r in run["replicas"] if r is not None],
            where="post",
            color="tab:blue",
            label="running replicas",
        )
        ax2.set_ylabel("replicas")
        ax2.set_ylim(0, max((r or 0) for _, r in run["replicas"]) + 1)
        for row in run["minutes"]:
            colour = "tab:green" if row["sla_met"] else "tab:red"
            att = row["attainment"]
            ax.axvspan(60 * row["minute"], 60 * (row["minute"] + 1), color=colour, alpha=0.08)
            ax.text(
                60 * row["minute"] + 3, ax.get_ylim()[1] * 0.9, f"{100 * (att or 0):.2f}%", color=colour, fontsize=8
            )
        ax.axvline(run["calm_s"], color="black", lw=0.8, ls="--")
        met = sum(r["sla_met"] for r in run["minutes"])
        ax.set_title(
            f"burst_z = {run['burst_z']:g}: {met} of {len(run['minutes'])} minutes within the SLA", fontsize=10
        )
        ax.legend(loc="lower left", fontsize=8)
        ax2.legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sloserve.loadtests.burst_live", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--burst-z",
        default=f"{SwayamConfig().burst_z:g},0",
        help="burst_z of each run, comma-separated (default: the policy's default, then 0: the term off)",
    )
    p.add_argument("--trace", type=Path, default=TRACE, help="timestamp trace CSV with a t_s column")
    p.add_argument("--start-minute", type=int, default=18, help="first trace minute replayed")
    p.add_argument("--minutes", type=int, default=4, help="minutes of the trace replayed (real time)")
    p.add_argument("--calm-minutes", type=int, default=2, help="minutes at the slice's mean rate, unclumped, first")
    p.add_argument("--mean-rps", type=float, default=100.0, help="the slice's mean rate (and the calm minutes')")
    p.add_argument("--rps-per-user", type=float, default=10.0, help="each Locust user's share of the peak rate")
    p.add_argument("--slo-ms", type=float, default=200.0)
    p.add_argument("--delay-ms", type=float, default=20.0, help="emulated batch time of a replica")
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--max-replicas", type=int, default=4)
    p.add_argument("--repo", default="model_repository", help="the built demo repository (make models)")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for z in (float(x) for x in a.burst_z.split(",")):
        run = one_run(a, z, a.out)
        runs.append(run)
        for row in run["minutes"]:
            print(
                f"burst_z={z:g} minute {row['minute']}: {row['requests']} requests, "
                f"attainment {row['attainment']}, replicas mean {row['replicas_mean']} max {row['replicas_max']}",
                flush=True,
            )
    args = {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}
    (a.out / "result.json").write_text(json.dumps({"args": args, "runs": runs}, indent=1))
    plot(runs, a.out / "burst_live.png")
    print(f"wrote {a.out / 'result.json'} and {a.out / 'burst_live.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
