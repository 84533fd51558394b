"""Open-loop benchmark under a latency SLO: sloserve's policies against Triton, Ray Serve and MLServer.

One invocation starts each system in turn as a subprocess on the same ONNX file (the same launchers
as ``sloserve bench closed``), sweeps the offered rate upward with an open-loop generator
(``sloserve/loadtests/bench/gen.py``: arrivals never wait for answers, latency counted from the scheduled
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
config; ``sloserve-default-inprocess`` adds ``--backend inprocess``; a ``-wN`` suffix adds ``--workers N``, a ``-traceP`` suffix traces P% of the requests (the standard
``OTEL_*`` variables, exporting to a stand-in OTLP/HTTP collector in the benchmark's process),
N gateway processes sharing the ports), ``sloserve-<policy>`` (policy
slo|timeout|fixed|aimd|nexus, in-process, the model's batching set by the bench), each pinned to
``--variant`` by the ``x-variant`` header, or ``sloserve-<policy>@<variant>|@any`` (``@any``: no pin,
the policy may choose a cheaper variant); ``sloserve-shared-<policy>`` runs the model with
``shared_replicas`` (one set of replicas holding every variant, in-process backend); ``triton``,
``rayserve``, ``mlserver`` (tuned), or one configuration: ``triton-<delay ms>x<instances>``,
``rayserve-<wait ms>x<replicas>[-opt|-ha|-ha0]``, ``mlserver-<batch time ms>x<workers>``.

Variants across device types: ``sloserve-<policy>-types@...`` serves the model on every type of
``--device-types`` (``models.<model>.device_types``); ``@any`` lets the policy pick a (variant, device
type) pair per batch, ``@<variant>`` pins the variant (on any type), ``@<variant>+<type>`` pins one pair
(the ``x-device-type`` header). ``--emulate TYPE=SCALE`` serves from a copy of the model with a profile
for TYPE derived from this host's CPU profile (every latency times SCALE >= 1): in-process, such a
replica runs the real CPU session, then waits out that profile (docs/batching.md, "Variants across
device types"). The log's per-round lines (``[system rN] RATE/s att ... effacc ...``) compare a
``-types@any`` system with the best single variant and the best single pair::

    sloserve bench slo --model heavy --slo-ms 20 --arrival burst --burst-factor 3 --emulate emul-slow=2 \
        --device-types cpu,emul-slow --systems sloserve-slo-types@any,sloserve-slo-types@large,\
    sloserve-slo-types@medium,sloserve-slo@large,sloserve-slo@medium,sloserve-slo-types@large+emul-slow \
        --rates 200,300,400,500,600,800 --duration 6 --rounds 3 --out results/types.json 2> results/types.log
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from array import array
from pathlib import Path
from typing import Any

from sloserve.loadtests.bench.arrivals import (
    poisson,
    schedule,
    trace_shape,
)
from sloserve.loadtests.bench.gen import read_records
from sloserve.loadtests.bench.procstat import CpuWindow, core_speed_ms, tree_memory_mb
from sloserve.loadtests.bench.scrape import (
    batch_stats,
    server_on_time,
    shed_by_reason,
    shed_histogram,
    shed_server_side,
    slo_counts,
)
from sloserve.loadtests.bench.slo_args import add_arguments
from sloserve.loadtests.bench.slo_report import max_rate, metrics, plot, result_doc, summarise
from sloserve.loadtests.bench.slo_systems import (
    PEER_CONFIG,
    PEERS_TUNED,
    POLICIES,
    launch_for,
    policy_batching,
    tune_peers,
)
from sloserve.loadtests.bench.systems import (
    SYSTEMS,
    Launch,
    binary_body,
    default_tmp,
    parse_trees,
    prioritise,
    request_body,
    split_tree,
)
from sloserve.loadtests.promtext import prom_max, prom_sum
from sloserve.loadtests.results import write_result


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
        [sys.executable, "-m", "sloserve.loadtests.bench.gen", str(spec_path), str(out)],
        cwd=Path(__file__).resolve().parents[3],
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
        # the most batches one replica held at once, from every gateway (at most the pipeline depth)
        peak = prom_max(launch.scrape(), "sloserve_replica_peak_batches") if system.startswith("sloserve") else None
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
        "replica_peak_batches": peak,
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
    core_ms = core_speed_ms()  # how fast this machine's cores run just before the step (server idle)
    before = launch.scrape() if system.startswith("sloserve") else None  # the gateway's own counts
    tag = f"{system}-r{round_no}-{k}" + ("-retry" if retry else "")
    recs, trailer, _ = run_step(launch, hdrs, body_path, sched, args, tmp, tag)
    m = metrics(recs, trailer, args, acc, peer_acc, rate)
    m["core_ms"] = core_ms
    if before is not None:
        after = launch.scrape()
        m.update(shed_server_side(shed_histogram(before), shed_histogram(after)))
        m.update(server_on_time(slo_counts(before), slo_counts(after)))
        m["shed_by_reason"] = shed_by_reason(before, after)
        m["batches"] = batch_stats(before, after)
        dropped = prom_sum(after, "sloserve_trace_spans_dropped_total") - prom_sum(
            before, "sloserve_trace_spans_dropped_total"
        )
        if dropped > 0:  # a traced gateway's spans that never reached the collector (queue full, export failed)
            m["spans_dropped"] = int(dropped)
    print(
        f"  [{system} r{round_no}{' retry' if retry else ''}] {rate:>6.0f}/s att {m['attainment']:.4f} "
        f"good {m['goodput_rps']:.0f}/s p50 {m['p50_ms']} p99 {m['p99_ms']} shed {m['shed_share']:.3f} "
        f"effacc {m['effective_accuracy']:.4f} srv {m['server_cores']:.2f} gen {m['gen_cores']:.2f} "
        f"other {m['other_cores']:.2f} core {core_ms:.2f} ms"
        + (f" {m['variants']} late {m['late_by_variant']}" if "variants" in m else "")
        + (f" server-on-time {m['server_on_time']}" if m.get("server_on_time") is not None else "")
        + (f" sheds {m['shed_by_reason']}" if m.get("shed_by_reason") else "")
        + (f" spans-dropped {m['spans_dropped']}" if m.get("spans_dropped") else ""),
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
    core_ms = core_speed_ms()
    recs, trailer, _ = run_step(launch, hdrs, body_path, sched, args, tmp, tag)
    m = metrics(recs, trailer, args, acc, peer_acc, rate, duration_s=dur)
    m.pop("timeline", None)
    m["core_ms"] = core_ms
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(args.repo).resolve()  # absolute: a system from another tree (--tree) starts in that tree
    if args.emulate:  # a copy of the model with the emulated types' derived profiles beside its own
        from sloserve.loadtests.emulated import add_emulated_profiles, emulated_type_repo

        copy = default_tmp() / "emulated-repo"
        shutil.rmtree(copy, ignore_errors=True)
        for k, item in enumerate(args.emulate.split(",")):
            name, _, scale = item.partition("=")
            if k == 0:
                emulated_type_repo(repo, copy, args.model, name.strip().lower(), float(scale or 1.0))
            else:
                add_emulated_profiles(copy, args.model, name.strip().lower(), float(scale or 1.0))
        repo = copy
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
            f"configuration: triton-<delay ms>x<instances>, rayserve-<wait ms>x<replicas>[-opt|-ha|-ha0], "
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
                f"--{peer}-configs: {bad} are not <ms>x<count>" + ("[-opt|-ha|-ha0]" if peer == "rayserve" else "")
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
        from sloserve.batching.policy import make_policy

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
    write_result(result, args.out)
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
        prog="python -m sloserve.loadtests.bench.slo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return main_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
