"""Open-loop benchmark under a latency SLO: sloserve's policies against Triton, Ray Serve and MLServer.

One invocation starts each system in turn as a subprocess on the same ONNX file (the same launchers
as ``sloserve bench closed``), sweeps the offered rate upward with an open-loop generator
(``loadtests/bench/gen.py``: arrivals never wait for answers, latency counted from the scheduled
send time), stops it, and goes on to the next; systems are interleaved over rounds and medians are
reported. Arrivals: ``poisson``, ``gamma`` (bursty, coefficient of variation ``--cv``), ``trace``
(the per-minute shape of a column of an Azure Functions 2019 trace, time-compressed to
``--trace-bucket-s`` seconds per minute and scaled to the offered mean rate) or ``burst`` (Poisson
at the rate, ``--burst-factor`` times it for the middle third).

Per system and rate: SLO attainment (on-time 2xx / all sent), goodput (on-time per second), p50 /
p99 / p99.9 of answered requests, shed share (503/429), effective accuracy (sum of the accuracy of
on-time answers / all sent: the variant sloserve reports in its response parameters, the served
variant for peers), shed-answer latency, server CPU, the generator's own CPU. Per system: the
highest rate with attainment >= ``--target`` (0.99), and the tail at light load: after each sweep,
on the same server, ``--light-requests`` Poisson arrivals at ``--light-fraction`` (10%) of that
rate, with their p50, p99, p99.9 and sheds.

A peer named with configurations (``triton-5x1``, ``rayserve-2x1-ha``, ...) runs each of them in
the interleaved rounds, and the ratios are taken against its best one (the highest median rate). A
peer named without one is tuned first: each configuration of ``--triton-configs`` (queue delay x
model instances), ``--rayserve-configs`` (batch wait x replicas, with or without Ray Serve's
high-throughput mode and HAProxy) and ``--mlserver-configs`` (batch time x parallel workers) is swept
once, and the best goes into the rounds.

    sloserve bench slo --model heavy --variant large --slo-ms 20 --rounds 2 \\
        --out results/slo-heavy.json --plot docs/img/bench_slo_heavy.png

Systems: ``sloserve-default`` (exactly what ``make run`` starts: ``sloserve serve --repo REPO``, no
config; ``sloserve-default-inprocess`` adds ``--backend inprocess``), ``sloserve-<policy>`` (policy
slo|timeout|fixed|aimd|nexus, in-process, the model's batching set by the bench), each pinned to
``--variant`` by the ``x-variant`` header, or ``sloserve-<policy>@<variant>|@any`` (``@any``: no pin,
the policy may choose a cheaper variant); ``sloserve-shared-<policy>`` runs the model with
``shared_replicas`` (one set of replicas holding every variant, in-process backend); ``triton``,
``rayserve``, ``mlserver`` (tuned), or one configuration: ``triton-<delay ms>x<instances>``,
``rayserve-<wait ms>x<replicas>[-opt|-ha]``, ``mlserver-<batch time ms>x<workers>``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from array import array
from pathlib import Path
from typing import Any

from loadtests.bench.closed import machine
from loadtests.bench.gen import read_records
from loadtests.bench.procstat import CpuWindow, tree_memory_mb
from loadtests.bench.systems import (
    SYSTEMS,
    BatchingKnobs,
    Launch,
    binary_body,
    compute_bound,
    default_tmp,
    from_tree,
    make_launch,
    parse_trees,
    prioritise,
    prom_sum,
    request_body,
    split_tree,
)

POLICIES = ("slo", "timeout", "fixed", "aimd", "nexus")
PEERS_TUNED = ("triton", "rayserve", "mlserver")
PEER_CONFIG = re.compile(r"(triton|mlserver)-\d+(\.\d+)?x\d+|rayserve-\d+(\.\d+)?x\d+(-opt|-ha)?")
DEFAULT_SYSTEMS = "sloserve-default,sloserve-default-inprocess,triton,rayserve,mlserver"
DEFAULT_RATES = (
    "20,30,40,50,65,80,100,125,150,200,250,300,350,400,450,500,600,700,800,900,1000,1200,1400,1600,1800,2000,2400,2800"
)
TRACE_CSV = Path(__file__).resolve().parents[1] / "traces" / "azure_functions_2019_selected_per_minute.csv"


# ---- arrival schedules (offsets in seconds, sorted) ------------------------------------------------
def poisson(rate: float, dur: float, rng: random.Random, t0: float = 0.0) -> list[float]:
    out, t = [], t0
    while True:
        t += rng.expovariate(rate)
        if t >= t0 + dur:
            return out
        out.append(t)


def gamma_arrivals(rate: float, cv: float, dur: float, rng: random.Random) -> list[float]:
    """Renewal process with gamma inter-arrival times: mean 1/rate, coefficient of variation cv."""
    k = 1.0 / (cv * cv)
    theta = 1.0 / (rate * k)
    out, t = [], 0.0
    while True:
        t += rng.gammavariate(k, theta)
        if t >= dur:
            return out
        out.append(t)


def trace_shape(column: str | None, path: Path = TRACE_CSV) -> tuple[str, list[float]]:
    """Per-minute counts of one column of the trace CSV, normalised to mean 1."""
    with open(path) as f:
        rows = list(csv.reader(f))
    head, body = rows[0], rows[1:]
    cols = [c for c in head if c.lower() not in ("minute", "time", "t", "index")]
    col = column or cols[0]
    j = head.index(col)
    vals = [float(r[j]) for r in body if len(r) > j and r[j] != ""]
    m = sum(vals) / len(vals)
    return col, [v / m for v in vals]


def trace_arrivals(rate: float, dur: float, rng: random.Random, shape: list[float], bucket_s: float) -> list[float]:
    """Non-homogeneous Poisson: each trace minute becomes ``bucket_s`` seconds at ``rate * shape``."""
    out: list[float] = []
    n = max(1, math.ceil(dur / bucket_s))
    for b in range(n):
        r = rate * shape[b % len(shape)]
        d = min(bucket_s, dur - b * bucket_s)
        if r > 0 and d > 0:
            out += poisson(r, d, rng, b * bucket_s)
    return out


def burst_arrivals(rate: float, factor: float, dur: float, rng: random.Random) -> list[float]:
    third = dur / 3
    return (
        poisson(rate, third, rng)
        + poisson(rate * factor, third, rng, third)
        + poisson(rate, dur - 2 * third, rng, 2 * third)
    )


def step_duration(args: argparse.Namespace, rate: float) -> float:
    """Seconds of arrivals at ``rate``: ``--duration``, stretched so that a step carries at least
    ``--min-requests`` (99% attainment cannot be judged on 27 requests: one late one is 96%)."""
    return max(args.duration, args.min_requests / rate) if rate > 0 else args.duration


def schedule(args: argparse.Namespace, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    dur = step_duration(args, rate)
    if args.arrival == "poisson":
        return poisson(rate, dur, rng)
    if args.arrival == "gamma":
        return gamma_arrivals(rate, args.cv, dur, rng)
    if args.arrival == "trace":
        return trace_arrivals(rate, dur, rng, args._shape, args.trace_bucket_s)
    if args.arrival == "burst":
        return burst_arrivals(rate, args.burst_factor, dur, rng)
    raise ValueError(args.arrival)


# ---- systems --------------------------------------------------------------------------------------
def policy_batching(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    b: dict[str, Any] = {"policy": policy, "max_batch_size": args.max_batch_size}
    if policy == "timeout":
        b["max_wait_ms"] = args.max_wait_ms
    elif policy == "fixed":
        b["max_queue_delay_ms"] = args.max_wait_ms
    elif policy in ("aimd", "nexus"):
        b["slo_ms"] = args.slo_ms
    return b | json.loads(args.sloserve_batching or "{}")


def launch_for(system: str, args: argparse.Namespace, repo: Path, tmp: Path) -> tuple[Launch, dict[str, str], str]:
    """(launch, generator headers, variant served by a peer or pinned); ``<system>:LABEL`` runs a sloserve
    system from the checkout given as ``--tree LABEL=PATH``."""
    base, tree = split_tree(system, args._trees)
    launch, hdrs, pin = _launch_for(base, args, repo, tmp)
    launch = from_tree(launch, tree)
    launch.system = system
    return launch, hdrs, pin


def _launch_for(system: str, args: argparse.Namespace, repo: Path, tmp: Path) -> tuple[Launch, dict[str, str], str]:
    if system.startswith("sloserve"):
        name, _, pin = system.partition("@")
        hdrs = {"x-slo-ms": f"{args.slo_ms:g}"}
        pin = pin or args.variant
        if name in ("sloserve-default", "sloserve-default-inprocess"):  # `make run`: no config, every default
            launch = default_launch(repo, args.model, tmp, inprocess=name.endswith("inprocess"))
        else:
            parts = name.split("-")
            backend = "ray" if "ray" in parts[1:] else "inprocess"
            policy = parts[-1] if parts[-1] in POLICIES else "slo"
            cfg = tmp / f"{system.replace('@', '_')}.json"
            model_cfg = {"slo_ms": args.slo_ms, "batching": policy_batching(policy, args)}
            if "shared" in parts[1:]:  # sloserve-shared-<policy>: every replica holds every variant
                model_cfg["shared_replicas"] = True
            cfg.write_text(json.dumps({"models": {args.model: model_cfg}}))
            knobs = BatchingKnobs(sloserve_config=str(cfg), sloserve_backend=backend)
            launch = make_launch("sloserve", repo, args.model, args.variant, knobs, tmp)
        launch.system = system
        # the readiness probe carries the warm-up budget: at the benchmark's SLO a cold start can be refused
        launch.headers = {"x-slo-ms": f"{args.warmup_slo_ms:g}"}
        if pin != "any":
            launch.headers["x-variant"] = pin
            hdrs["x-variant"] = pin
        return launch, hdrs, pin
    peer, _, cfg = system.partition("-")
    knobs = BatchingKnobs(
        max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms, triton_metrics=args.triton_metrics
    )
    if cfg:  # <wait ms>x<instances | replicas | workers>[-opt]
        head, _, flag = cfg.partition("-")
        wait, _, count = head.partition("x")
        knobs.max_wait_ms = float(wait)
        if peer == "triton":
            knobs.triton_instances = int(count or 1)
        elif peer == "rayserve":
            knobs.rayserve_replicas = int(count or 1)
            knobs.rayserve_mode = flag
        elif peer == "mlserver":
            knobs.mlserver_workers = int(count or 1)
    launch = make_launch(peer, repo, args.model, args.variant, knobs, tmp)
    launch.system = system
    return launch, {}, args.variant


def default_launch(repo: Path, model: str, tmp: Path, inprocess: bool = False) -> Launch:
    """``sloserve serve --repo REPO`` on free ports: the Makefile's ``make run`` line, nothing else set
    (``inprocess``: with ``--backend inprocess``, replicas in the gateway's process)."""
    from loadtests.bench.systems import _with_tmp, free_ports

    http, grpc = free_ports(2)
    exe = Path(sys.executable).with_name("sloserve")
    argv = [str(exe), "serve", "--repo", str(repo), "--http-port", str(http), "--grpc-port", str(grpc)]
    argv += ["--backend", "inprocess"] if inprocess else []
    return _with_tmp(
        Launch(
            "sloserve-default",
            argv,
            f"http://127.0.0.1:{http}/v2/models/{model}/infer",
            f"http://127.0.0.1:{http}/metrics",
            grace_s=15.0,
        ),
        tmp,
    )


def generator_headers(hdrs: dict[str, str], body_headers: dict[str, str] | None) -> dict:
    """The generator spec's ``headers`` and ``content_type`` for a step: the system's headers plus, with
    ``--binary``, the body's own (its Content-Type replaces the generator's JSON default).

    >>> generator_headers({"x-slo-ms": "20"}, {"Content-Type": "application/octet-stream",
    ...                                        "Inference-Header-Content-Length": "90"})
    {'headers': {'x-slo-ms': '20', 'Inference-Header-Content-Length': '90'}, 'content_type': 'application/octet-stream'}
    >>> generator_headers({"x-slo-ms": "20"}, None)
    {'headers': {'x-slo-ms': '20'}}
    """
    extra = dict(body_headers or {})
    ctype = extra.pop("Content-Type", None)
    return {"headers": {**hdrs, **extra}, **({"content_type": ctype} if ctype else {})}


# ---- one measured step ----------------------------------------------------------------------------
def run_step(
    launch: Launch,
    hdrs: dict[str, str],
    body_path: Path,
    sched: list[float],
    args: argparse.Namespace,
    tmp: Path,
    tag: str,
) -> tuple[list[tuple], dict, float]:
    port = int(launch.infer_url.split(":")[2].split("/")[0])
    path = "/" + launch.infer_url.split("/", 3)[3]
    sf = tmp / f"sched-{tag}.bin"
    with open(sf, "wb") as f:
        array("d", sched).tofile(f)
    spec = {
        "port": port,
        "path": path,
        "body_file": str(body_path),
        "schedule_file": str(sf),
        **generator_headers(hdrs, getattr(args, "_body_headers", None)),
        "timeout_s": args.timeout,
        "max_conns": args.max_conns,
        "variants": args._variants,
    }
    spec_path = tmp / f"spec-{tag}.json"
    spec_path.write_text(json.dumps(spec))
    out = tmp / f"out-{tag}.bin"
    win = CpuWindow(launch.pid)
    win.start()
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtests.bench.gen", str(spec_path), str(out)],
        cwd=Path(__file__).resolve().parents[2],
        preexec_fn=prioritise(args.nice),
        start_new_session=bool(args.nice),
    )
    try:
        _, status, ru = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        raise
    server_s, busy_s, total_s = win.stop()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"generator failed (rc {os.waitstatus_to_exitcode(status)})")
    recs, trailer = read_records(str(out), len(sched))
    trailer["gen_cpu_s"] = ru.ru_utime + ru.ru_stime
    trailer["server_cpu_s"] = server_s
    trailer["other_cpu_s"] = max(0.0, busy_s - server_s - trailer["gen_cpu_s"])
    if not args.keep_tmp:  # with --keep-tmp the schedule and the per-request records stay for analysis
        for p in (sf, spec_path, out):
            p.unlink(missing_ok=True)
    return recs, trailer, total_s


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
) -> dict[str, Any]:
    slo = args.slo_ms / 1e3
    n = len(recs)
    dur = step_duration(args, rate)
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


def sweep(
    system: str,
    args: argparse.Namespace,
    repo: Path,
    tmp: Path,
    body: bytes,
    body_path: Path,
    rates: list[float],
    round_no: int,
    start_rate: float = 0.0,
    light: bool = True,
) -> dict[str, Any]:
    launch, hdrs, pinned = launch_for(system, args, repo, tmp)
    peer_acc = None if system.startswith("sloserve") else args._accuracy[pinned]
    acc = {i: args._accuracy[v] for i, v in enumerate(args._variants)}
    launch.start(tmp / "logs", args.nice)
    steps: list[dict[str, Any]] = []
    try:
        try:
            ready = launch.wait_ready(body)
        except (RuntimeError, TimeoutError) as e:
            raise StartFailed(str(e)) from None
        if args.warmup > 0:  # warm up at a modest rate; sloserve with a generous budget (see --warmup-slo-ms)
            warm_hdrs = dict(hdrs, **({"x-slo-ms": f"{args.warmup_slo_ms:g}"} if "x-slo-ms" in hdrs else {}))
            run_step(
                launch,
                warm_hdrs,
                body_path,
                poisson(args.warmup_rate, args.warmup, random.Random(7)),
                args,
                tmp,
                f"{system}-r{round_no}-warm",
            )
        fails = 0
        for k, rate in enumerate(rates):
            if rate < start_rate:
                continue
            m = measure_step(launch, hdrs, body_path, args, tmp, system, round_no, k, rate, acc, peer_acc)
            if (m["attainment"] or 0) < args.target and args.retry_failed_steps:
                # one noisy second of a shared 2-core box must not end a sweep: the rate gets one more try
                first = m
                time.sleep(args.gap)
                m = measure_step(
                    launch, hdrs, body_path, args, tmp, system, round_no, k, rate, acc, peer_acc, retry=True
                )
                m["first_try"] = {key: first[key] for key in ("attainment", "p50_ms", "p99_ms", "p999_ms", "shed")}
            steps.append(m)
            fails = fails + 1 if (m["attainment"] or 0) < args.target else 0
            if fails >= args.stop_after or (m["attainment"] or 0) < args.floor:
                break
            time.sleep(args.gap)
        best = max_rate(steps, args.target, start_rate, rates)
        light_load = None
        if light and args.light_fraction > 0 and best > 0:  # the tail a lightly loaded server shows, same server
            time.sleep(args.gap)
            light_load = light_step(
                launch,
                hdrs,
                body_path,
                best * args.light_fraction,
                args,
                tmp,
                f"{system}-r{round_no}-light",
                acc,
                peer_acc,
            )
        mem = tree_memory_mb(launch.pid)
    finally:
        launch.stop()
    return {
        "system": system,
        "round": round_no,
        "ready_s": round(ready, 2),
        "steps": steps,
        "max_rate_at_target": best,
        "light": light_load,
        "memory": mem,
    }


def measure_step(
    launch: Launch,
    hdrs: dict[str, str],
    body_path: Path,
    args: argparse.Namespace,
    tmp: Path,
    system: str,
    round_no: int,
    k: int,
    rate: float,
    acc: dict[int, float],
    peer_acc: float | None,
    retry: bool = False,
) -> dict[str, Any]:
    """One step of a sweep at ``rate``: its metrics (and, for sloserve, the server's own counts)."""
    seed = 1000 * round_no + k + (500 if retry else 0)
    sched = schedule(args, rate, seed)
    before = launch.scrape() if system.startswith("sloserve") else None  # the gateway's own counts
    tag = f"{system}-r{round_no}-{k}" + ("-retry" if retry else "")
    recs, trailer, _ = run_step(launch, hdrs, body_path, sched, args, tmp, tag)
    m = metrics(recs, trailer, args, acc, peer_acc, rate)
    if before is not None:
        after = launch.scrape()
        m.update(shed_server_side(shed_histogram(before), shed_histogram(after)))
        m.update(server_on_time(slo_counts(before), slo_counts(after)))
        m["shed_by_reason"] = shed_by_reason(before, after)
        m["batches"] = batch_stats(before, after)
    print(
        f"  [{system} r{round_no}{' retry' if retry else ''}] {rate:>6.0f}/s att {m['attainment']:.4f} "
        f"good {m['goodput_rps']:.0f}/s p50 {m['p50_ms']} p99 {m['p99_ms']} shed {m['shed_share']:.3f} "
        f"effacc {m['effective_accuracy']:.4f} srv {m['server_cores']:.2f} gen {m['gen_cores']:.2f} "
        f"other {m['other_cores']:.2f}"
        + (f" {m['variants']} late {m['late_by_variant']}" if "variants" in m else "")
        + (f" server-on-time {m['server_on_time']}" if m.get("server_on_time") is not None else "")
        + (f" sheds {m['shed_by_reason']}" if m.get("shed_by_reason") else ""),
        file=sys.stderr,
        flush=True,
    )
    return m


class StartFailed(RuntimeError):
    """The system under test did not come up (it is started once more)."""


def light_step(
    launch: Launch,
    hdrs: dict[str, str],
    body_path: Path,
    rate: float,
    args: argparse.Namespace,
    tmp: Path,
    tag: str,
    acc: dict[int, float],
    peer_acc: float | None,
) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` (a fraction of the system's highest rate) for at least
    ``--light-requests`` requests: p50, p99, p99.9 and max of the answers, and what was shed."""
    dur = max(args.duration, args.light_requests / rate)
    sched = poisson(rate, dur, random.Random(4242))
    recs, trailer, _ = run_step(launch, hdrs, body_path, sched, args, tmp, tag)
    m = metrics(recs, trailer, args, acc, peer_acc, rate)
    m.pop("timeline", None)
    lat = sorted(done - t for t, _sent, done, status, _v in recs if 200 <= status < 300)
    m.update(
        {
            "duration_s": round(dur, 1),
            "max_ms": round(lat[-1] * 1e3, 3) if lat else None,
            "p999_over_p50": round(m["p999_ms"] / m["p50_ms"], 2) if m.get("p50_ms") else None,
        }
    )
    print(
        f"  [{tag}] {rate:.0f}/s x {len(recs)}: p50 {m['p50_ms']} p99 {m['p99_ms']} p99.9 {m['p999_ms']} "
        f"max {m['max_ms']} shed {m['shed']} errors {m['errors']} (p99.9/p50 {m['p999_over_p50']})",
        file=sys.stderr,
        flush=True,
    )
    return m


def shed_by_reason(before: str | None, after: str | None) -> dict[str, int]:
    r"""Requests the server shed over one step, by ``reason`` (``sloserve_shed_total``: ``admission``,
    ``deadline``, ``overload`` for the lagging loop's door, ...), summed over models.

    >>> shed_by_reason('sloserve_shed_total{model="m",reason="deadline"} 2.0',
    ...                'sloserve_shed_total{model="m",reason="deadline"} 5.0\nsloserve_shed_total{model="m",reason="overload"} 4.0')
    {'deadline': 3, 'overload': 4}
    """
    before, after = before or "", after or ""
    out = {}
    for r in sorted(set(re.findall(r'^sloserve_shed_total\{[^}]*reason="([^"]+)"', after, re.MULTILINE))):
        n = int(prom_sum(after, "sloserve_shed_total", reason=r) - prom_sum(before, "sloserve_shed_total", reason=r))
        if n > 0:
            out[r] = n
    return out


def shed_histogram(text: str | None) -> dict[float, float]:
    """Cumulative bucket counts of ``sloserve_shed_answer_seconds`` (all models and reasons) in a
    scrape: the server's own time from a shed decision to its 503 being written."""
    out: dict[float, float] = {}
    for line in (text or "").splitlines():
        if line.startswith("sloserve_shed_answer_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            key = float("inf") if le == "+Inf" else float(le)
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def batch_stats(before: str | None, after: str | None) -> dict[str, dict[str, float]]:
    """Per variant, over one step: batches dispatched, their mean rows, and the share of batches of
    at most 2 rows (the small batches a backlogged deadline queue can collapse into)."""
    before, after = before or "", after or ""

    def delta(name: str, variant: str, **labels: str) -> float:
        return prom_sum(after, name, variant=variant, **labels) - prom_sum(before, name, variant=variant, **labels)

    out = {}
    for v in sorted(set(re.findall(r'^sloserve_batch_rows_count\{[^}]*variant="([^"]+)"', after, re.MULTILINE))):
        n = delta("sloserve_batch_rows_count", v)
        if n <= 0:
            continue
        out[v] = {
            "batches": int(n),
            "mean_rows": round(delta("sloserve_batch_rows_sum", v) / n, 2),
            "share_le_2_rows": round(delta("sloserve_batch_rows_bucket", v, le="2.0") / n, 3),
        }
    return out


def slo_counts(text: str | None) -> dict[str, float]:
    """``sloserve_slo_requests`` summed over models: answered requests by whether they met their
    deadline as the gateway measures it (from its own arrival stamp)."""
    return {met: prom_sum(text or "", "sloserve_slo_requests_total", met=met) for met in ("true", "false")}


def server_on_time(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The share of a step's answers the gateway itself counted on time. Against the client's
    attainment it shows how much lateness the server never sees (socket and event-loop waits
    before the arrival stamp, the answer's way back)."""
    met = after.get("true", 0.0) - before.get("true", 0.0)
    late = after.get("false", 0.0) - before.get("false", 0.0)
    n = met + late
    return {"server_answered": int(n), "server_on_time": round(met / n, 4) if n > 0 else None}


def shed_server_side(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """Per step: how many sheds the server timed, the share answered within 1 ms of the decision,
    and the p50 / p99 as the upper bound of the bucket that holds them."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return {"shed_server_n": 0}

    def q(p: float) -> float | None:
        for le in sorted(delta):
            if delta[le] >= p * total:
                return None if le == float("inf") else round(le * 1e3, 3)
        return None

    return {
        "shed_server_n": int(total),
        "shed_server_under_1ms": round(delta.get(0.001, 0.0) / total, 4),
        "shed_server_p50_le_ms": q(0.5),
        "shed_server_p99_le_ms": q(0.99),
    }


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
                for k in ("rate", "p50_ms", "p99_ms", "p999_ms", "max_ms", "p999_over_p50", "attainment")
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(args.repo)
    cfg = json.loads((repo / args.model / "config.json").read_text())
    args._variants = [v["name"] for v in cfg["variants"]]
    args._accuracy = {v["name"]: float(v["accuracy"]) for v in cfg["variants"]}
    if args.arrival == "trace":
        args._trace_column, args._shape = trace_shape(args.trace_column)
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    tmp = default_tmp()
    (tmp / "logs").mkdir(parents=True, exist_ok=True)
    body = request_body(repo, args.model, rows=args.rows_per_request)
    body_path = tmp / "body.json"
    args._body_headers = {}
    if args.binary:  # the generator sends the binary form; readiness probes keep the JSON one
        wire, args._body_headers = binary_body(body)
        body_path.write_bytes(wire)
    else:
        body_path.write_bytes(body)
    t_start = time.time()
    results: dict[str, list[dict[str, Any]]] = {}

    def one(system: str, r: int, start_rate: float = 0.0, light: bool = True) -> dict[str, Any]:
        for attempt in (1, 2):  # a system that fails to start is started once more (pytriton's start is flaky)
            print(f"[round {r}] {system}: starting", file=sys.stderr, flush=True)
            try:
                return sweep(system, args, repo, tmp, body, body_path, rates, r, start_rate, light)
            except Exception as e:
                err = f"{type(e).__name__}: {e}"[:4000]
                print(f"[round {r}] {system}: FAILED {err[:600]}", file=sys.stderr, flush=True)
                if attempt == 2 or not isinstance(e, StartFailed):
                    return {"system": system, "round": r, "error": err}
        raise AssertionError("unreachable")

    systems, tuning = tune_peers(systems, args, one, results)
    for s in systems:
        results.setdefault(s, [])
    for r in range(1, args.rounds + 1):
        order = systems if r % 2 == 1 else systems[::-1]
        for s in order:
            prev = [x["max_rate_at_target"] for x in results[s] if "error" not in x]
            start = args.skip_below * min(prev) if (prev and args.skip_below) else 0.0
            start = max((x for x in rates if x <= start), default=0.0)
            results[s].append(one(s, r, start))
            time.sleep(args.pause)
    summary = summarise(results, args)
    result = result_doc(args, repo, t_start, summary, tuning, results)
    if args.keep_tmp or any("error" in x for v in results.values() for x in v):
        print(f"server logs kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.plot:
        plot(summary, args, args.plot)
    return result


def tune_peers(systems: list[str], args: argparse.Namespace, one, results: dict) -> tuple[list[str], dict]:
    """The tuning pass of each peer named without a configuration: every configuration of
    ``--<peer>-configs`` once (no light-load step); the one with the highest rate at target takes the
    peer's place in the rounds. Returns the systems of the rounds and what the pass found."""
    tuning: dict[str, Any] = {}
    for peer in PEERS_TUNED:
        if peer not in systems:
            continue
        configs = [c.strip() for c in getattr(args, f"{peer}_configs").split(",") if c.strip()]
        tres = {f"{peer}-{c}": one(f"{peer}-{c}", 0, light=False) for c in configs}
        ok = {k: v for k, v in tres.items() if "error" not in v}
        best = (
            max(
                ok,
                key=lambda k: (ok[k]["max_rate_at_target"], max((s["goodput_rps"] for s in ok[k]["steps"]), default=0)),
            )
            if ok
            else None
        )
        tuning[peer] = {
            "runs": tres,
            "best": best,
            "max_rate_at_target": {k: v.get("max_rate_at_target") for k, v in tres.items()},
            "errors": {k: v["error"] for k, v in tres.items() if "error" in v},
        }
        print(f"{peer} tuning: {tuning[peer]['max_rate_at_target']} -> {best}", file=sys.stderr, flush=True)
        systems = [best if s == peer else s for s in systems if s != peer or best]
        if best is None:
            results[peer] = [
                {
                    "system": peer,
                    "error": f"every {peer} configuration failed: " + json.dumps(tuning[peer]["errors"])[:3000],
                }
            ]
    return systems, tuning


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
            cwd=Path(__file__).resolve().parents[2],
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="heavy")
    p.add_argument("--variant", default="large", help="variant every peer serves and sloserve is pinned to")
    p.add_argument("--repo", default="model_repository")
    p.add_argument("--slo-ms", type=float, default=20.0)
    p.add_argument("--systems", default=DEFAULT_SYSTEMS, help="comma list (see above)")
    p.add_argument(
        "--tree",
        action="append",
        metavar="LABEL=PATH",
        help="another sloserve checkout; a sloserve system ending in :LABEL runs from it "
        "(before/after comparisons in one interleaved run)",
    )
    p.add_argument(
        "--triton-configs",
        default="0x1,0.1x1,1x1,5x1,0x2,0.1x2,1x2,5x2",
        help="Triton tuning pass: max_queue_delay_ms x model instances (plain callable, metrics off)",
    )
    p.add_argument(
        "--triton-metrics",
        action="store_true",
        help="turn Triton's metrics on (its batch statistics in the results; they cost it CPU)",
    )
    p.add_argument(
        "--rayserve-configs",
        default="1x1-ha,2x1-ha,5x1-ha,1x2-ha,2x2-ha,2x1",
        help="Ray Serve tuning pass: @serve.batch batch_wait_timeout ms x replicas; '-opt': "
        "RAY_SERVE_THROUGHPUT_OPTIMIZED=1; '-ha': that plus HAProxy in front of the replicas' own "
        "HTTP servers (Ray Serve's documented high-throughput mode)",
    )
    p.add_argument(
        "--mlserver-configs",
        default="1x0,2x0,5x0,1x1,2x1,5x1,2x2",
        help="MLServer tuning pass: max_batch_time ms x parallel_workers (0: inference in the server process)",
    )
    p.add_argument(
        "--light-fraction",
        type=float,
        default=0.1,
        help="after each sweep, a light-load step at this fraction of the system's highest rate (0: none)",
    )
    p.add_argument(
        "--light-requests",
        type=int,
        default=2000,
        help="requests in the light-load step (its p99.9 is its 2nd-worst answer at 2000)",
    )
    p.add_argument("--arrival", choices=("poisson", "gamma", "trace", "burst"), default="poisson")
    p.add_argument("--cv", type=float, default=4.0, help="gamma arrivals: coefficient of variation (2..8)")
    p.add_argument("--trace-column", help="trace arrivals: column of the CSV (default: the first)")
    p.add_argument("--trace-bucket-s", type=float, default=1.0, help="seconds per trace minute")
    p.add_argument("--burst-factor", type=float, default=3.0)
    p.add_argument("--rates", default=DEFAULT_RATES, help="offered rates swept upward (requests/s)")
    p.add_argument("--duration", type=float, default=4.0, help="seconds of arrivals per rate")
    p.add_argument(
        "--min-requests",
        type=int,
        default=200,
        help="stretch a low rate's step to carry at least this many requests (0: never)",
    )
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up traffic after start")
    p.add_argument("--warmup-rate", type=float, default=100.0)
    p.add_argument(
        "--warmup-slo-ms",
        type=float,
        default=1000.0,
        help="sloserve's budget during warm-up: its slo policy calibrates on admitted batches, and a "
        "cold first batch can make it refuse everything at the benchmark's SLO (then nothing is "
        "admitted and the calibration never learns otherwise)",
    )
    p.add_argument("--gap", type=float, default=0.5, help="seconds between rates")
    p.add_argument("--target", type=float, default=0.99)
    p.add_argument("--stop-after", type=int, default=2, help="stop a sweep after this many rates under target")
    p.add_argument(
        "--retry-failed-steps",
        type=int,
        choices=(0, 1),
        default=1,
        help="measure a rate under target once more before counting it as failed (1: the default; every system alike)",
    )
    p.add_argument("--floor", type=float, default=0.5, help="stop a sweep at once under this attainment")
    p.add_argument(
        "--skip-below",
        type=float,
        default=0.6,
        help="rounds after the first start at this fraction of the system's lowest earlier max rate",
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="timeout/fixed/MLServer/@serve.batch wait")
    p.add_argument(
        "--rows-per-request",
        type=int,
        default=1,
        help="rows in every request (a client that batches its own inputs); rates stay in requests/s, "
        "and effective accuracy counts requests",
    )
    p.add_argument("--timeout", type=float, default=3.0, help="client timeout per request (s)")
    p.add_argument("--max-conns", type=int, default=512)
    p.add_argument(
        "--sloserve-batching",
        default="",
        help="JSON merged into every sloserve system's batching config (e.g. '{\"safety_ms\": 2}'), "
        "for A/B runs of a policy setting",
    )
    p.add_argument(
        "--binary",
        action="store_true",
        help="send the tensor in KServe's binary extension (as tritonclient.http does) instead of JSON "
        "numbers; only sloserve and Triton take it",
    )
    p.add_argument("--nice", type=int, default=0)
    p.add_argument("--pause", type=float, default=1.0)
    p.add_argument(
        "--keep-tmp",
        action="store_true",
        help="keep the temporary folder: server logs, and each step's schedule, spec and per-request "
        "records (out-*.bin, loadtests/bench/gen.py's format)",
    )
    p.add_argument("--out")
    p.add_argument("--plot", help="PNG: attainment against rate, one line per system")


def main_args(args: argparse.Namespace) -> int:
    if args.duration > 120 or args.rounds > 10:
        raise SystemExit("--duration <= 120 s and --rounds <= 10")
    if not 1 <= args.rows_per_request <= args.max_batch_size:
        raise SystemExit(
            f"sloserve bench slo: --rows-per-request {args.rows_per_request} must be 1 to "
            f"--max-batch-size ({args.max_batch_size}): a request is never split across batches"
        )
    if args.min_requests < 0:
        raise SystemExit(f"--min-requests must be >= 0 (got {args.min_requests}; 0 never stretches a step)")
    args._trees = parse_trees(args.tree)
    bases = [split_tree(x.strip(), args._trees)[0] for x in args.systems.split(",") if x.strip()]
    unknown = [
        s
        for s in bases
        if s.partition("@")[0] not in SYSTEMS and not s.startswith("sloserve-") and not PEER_CONFIG.fullmatch(s)
    ]
    if unknown:
        raise SystemExit(
            f"unknown system(s) {unknown} in --systems; choose from {', '.join(SYSTEMS)}, "
            f"sloserve-default (exactly `make run`), sloserve-default-inprocess, "
            f"sloserve-<policy>[@variant], or a peer's "
            f"configuration: triton-<delay ms>x<instances>, rayserve-<wait ms>x<replicas>[-opt|-ha], "
            f"mlserver-<batch time ms>x<workers>"
        )
    for peer in PEERS_TUNED:
        bad = [
            c
            for c in getattr(args, f"{peer}_configs").split(",")
            if c.strip() and not PEER_CONFIG.fullmatch(f"{peer}-{c.strip()}")
        ]
        if bad:
            raise SystemExit(
                f"--{peer}-configs: {bad} are not <ms>x<count>" + ("[-opt|-ha]" if peer == "rayserve" else "")
            )
    if not 0 <= args.light_fraction <= 1 or args.light_requests < 100:
        raise SystemExit(
            f"--light-fraction must be in [0, 1] (got {args.light_fraction}) and --light-requests "
            f">= 100 (got {args.light_requests})"
        )
    try:
        extra = json.loads(args.sloserve_batching or "{}")
    except ValueError as e:
        raise SystemExit(f"--sloserve-batching: not JSON ({e})") from None
    if not isinstance(extra, dict):
        raise SystemExit("--sloserve-batching: give a JSON object of batching settings")
    if "policy" in extra:
        raise SystemExit("--sloserve-batching: name the policy in --systems (sloserve-<policy>), not here")
    if extra:  # each sloserve system's policy must take every setting: refuse a typo before anything starts
        from batching.policy import make_policy

        names = {x.strip().partition("@")[0] for x in args.systems.split(",")}
        for sys_name in sorted(n for n in names if n.startswith("sloserve")):
            parts = sys_name.split("-")
            policy = parts[-1] if parts[-1] in POLICIES else "slo"
            kw = policy_batching(policy, args)
            kw.pop("policy")
            try:
                make_policy(policy, **kw)
            except (TypeError, ValueError) as e:
                raise SystemExit(f"--sloserve-batching: {sys_name}: {e}") from None
    if args.binary:
        bad = [
            s for s in (x.strip() for x in args.systems.split(",")) if s and not s.startswith(("sloserve", "triton"))
        ]
        if bad:
            raise SystemExit(
                f"sloserve bench slo: --binary: {', '.join(bad)} do not take KServe's binary tensor "
                "extension (only sloserve and Triton); drop them or --binary"
            )
    import signal

    # SIGTERM unwinds like Ctrl-C, so the system under test is stopped by its launcher's finally
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    brief = {
        s: {
            k: v.get(k)
            for k in ("max_rate_at_target_median", "max_rate_at_target_rounds", "saturation_ok_rps", "error")
        }
        for s, v in result["summary"].items()
    }
    print(
        json.dumps(
            {"summary": brief, "ratios": result["ratios_of_max_rate"], "compute_bound": result["compute_bound"]},
            indent=1,
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.bench.slo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(p)
    return main_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
