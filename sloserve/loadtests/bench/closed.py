"""Closed-loop benchmark: N requests in flight against each system, with ``wrk``.

One invocation starts each system in turn as a subprocess on the same ONNX file, waits until it
answers, warms it up, measures for a fixed duration, stops it, and goes on to the next; the
systems are interleaved over rounds (A B A B ...) so slow drifts of a shared machine hit all of
them alike, and medians over rounds are reported. Per system: throughput, p50/p90/p99 latency
(wrk --latency), the server's CPU per request (its whole process tree, from psutil), the load
generator's own CPU, the rest of the machine's CPU (other tenants), the average batch formed where
the system exports it, memory; and ratios against Triton.

    sloserve bench closed --model digits --variant small --concurrency 32 --duration 10 --rounds 3 \
        --systems sloserve,triton --out results/closed-digits-small.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from sloserve.loadtests.bench.procstat import CpuWindow, tree_memory_mb
from sloserve.loadtests.bench.systems import (
    BINARY_SYSTEMS,
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
    request_body,
    split_tree,
)
from sloserve.loadtests.results import write_result

LUA = r"""
wrk.method = "POST"
local f = assert(io.open("%(body)s", "rb"))
wrk.body = f:read("*a")
f:close()
%(headers)s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%%d,"duration_us":%%d,"bytes":%%d,"connect":%%d,"read":%%d,"write":%%d,' ..
    '"status":%%d,"timeout":%%d,"mean_us":%%.1f,"max_us":%%d,"p50_us":%%d,"p90_us":%%d,"p99_us":%%d,"p999_us":%%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.max, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency:percentile(99.9)))
end
"""


def write_lua(path: Path, body_path: Path, headers: dict[str, str]) -> None:
    headers = {"Content-Type": "application/json", **headers}
    h = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
    path.write_text(LUA % {"body": str(body_path), "headers": h})


def run_wrk(url: str, lua: Path, concurrency: int, duration_s: float, threads: int, nice: int = 0) -> dict[str, Any]:
    """Run wrk; return its summary plus its own CPU seconds (from wait4's rusage)."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise FileNotFoundError("wrk is not installed: run sloserve/loadtests/peers/setup.sh (apt-get install wrk)")
    argv = [
        wrk,
        f"-t{threads}",
        f"-c{concurrency}",
        f"-d{max(1, round(duration_s))}s",
        "--latency",
        "--timeout",
        "10s",
        "-s",
        str(lua),
        url,
    ]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=bool(nice),
        preexec_fn=prioritise(nice),
    )
    assert proc.stdout is not None  # stdout=PIPE
    out = proc.stdout.read().decode(errors="replace")
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    m = re.search(r"^WRKJSON (\{.*\})$", out, re.MULTILINE)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"wrk failed (rc {proc.returncode}):\n{out[-2000:]}")
    res = json.loads(m.group(1))
    res["wrk_cpu_s"] = ru.ru_utime + ru.ru_stime
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    res["non_2xx"] = int(non_2xx.group(1)) if non_2xx else 0
    return res


class RoundBound:
    """The compute bound measured right before and right after each round, with nothing else
    running: ``b / p50(b)`` for the batch size ``b`` at which the stored profile peaks (max batch
    capped), one ORT thread as the profile and the replicas use. This box's ORT speed moves by up
    to 1.5x within minutes, so a profile taken once per run
    makes the saturation ratio swing with the box; per round, the bound is the mean of the two
    bracketing measurements."""

    def __init__(self, repo: Path, model: str, variant: str, batch: int, warm_s: float = 2.0, measure_s: float = 2.0):
        import numpy as np

        from sloserve.models.repository import ModelRepository
        from sloserve.modeltools.profiler import profile_inputs
        from sloserve.replica.runtime import Replica, RuntimeOptions

        m = ModelRepository(repo).load().models[model]
        self.batch, self.warm_s, self.measure_s = batch, warm_s, measure_s
        self.replica = Replica(
            m.onnx_path(variant), RuntimeOptions(intra_op_threads=1), [o.name for o in m.config.outputs]
        )
        self.feeds = profile_inputs(m, batch, np.random.default_rng(0))  # what the profile measures

    def rows_per_s(self) -> float:
        """``warm_s`` of back-to-back batches first: on this VM a core that was idle computes up to 1.5x
        slower for its first second or two (every short measurement here rises run over run), and a
        replica under load is never cold. Then the p50 over ``measure_s``."""
        end = time.perf_counter() + self.warm_s
        while time.perf_counter() < end:
            self.replica.run(self.feeds)
        times: list[float] = []
        end = time.perf_counter() + self.measure_s
        while time.perf_counter() < end or len(times) < 5:
            t0 = time.perf_counter()
            self.replica.run(self.feeds)
            times.append(time.perf_counter() - t0)
        return self.batch / statistics.median(times)


def measure_once(
    launch: Launch, body: bytes, lua: Path, args: argparse.Namespace, log_dir: Path, bound: RoundBound | None = None
) -> dict[str, Any]:
    before = bound.rows_per_s() if bound is not None else None
    launch.start(log_dir, args.nice)
    try:
        ready_s = launch.wait_ready(body)
        if args.warmup > 0:
            run_wrk(launch.infer_url, lua, args.concurrency, args.warmup, args.threads, args.nice)
        time.sleep(0.3)
        b0 = launch.batch_counters(args.model)
        c0 = launch.compute_seconds(args.model)
        win = CpuWindow(launch.pid)
        win.start()
        w = run_wrk(launch.infer_url, lua, args.concurrency, args.duration, args.threads, args.nice)
        server_s, busy_s, total_s = win.stop()
        b1 = launch.batch_counters(args.model)
        c1 = launch.compute_seconds(args.model)
        mem = tree_memory_mb(launch.pid)
    finally:
        launch.stop()
    after = bound.rows_per_s() if bound is not None else None
    secs = w["duration_us"] / 1e6
    n = w["requests"]
    ok = n - w["non_2xx"]
    ncpu = total_s / secs if secs else float(os.cpu_count() or 1)
    rec: dict[str, Any] = {
        "requests": n,
        "errors": {k: w[k] for k in ("connect", "read", "write", "timeout")} | {"non_2xx": w["non_2xx"]},
        "seconds": round(secs, 3),
        "rps": round(ok / secs, 1),
        "rows_per_s": round(ok * args.rows_per_request / secs, 1),
        "p50_ms": w["p50_us"] / 1e3,
        "p90_ms": w["p90_us"] / 1e3,
        "p99_ms": w["p99_us"] / 1e3,
        "p999_ms": w["p999_us"] / 1e3,
        "mean_ms": round(w["mean_us"] / 1e3, 3),
        "server_cpu_ms_per_req": round(server_s * 1e3 / max(ok, 1), 4),
        "server_cores": round(server_s / secs, 3),
        "wrk_cpu_ms_per_req": round(w["wrk_cpu_s"] * 1e3 / max(n, 1), 4),
        "wrk_cores": round(w["wrk_cpu_s"] / secs, 3),
        # busy CPU that is neither the server nor wrk: other tenants of the box (and this harness)
        "other_cores": round(max(0.0, busy_s - server_s - w["wrk_cpu_s"]) / secs, 3),
        "machine_cores": round(ncpu, 2),
        "ready_s": round(ready_s, 2),
        "memory_after": mem,
        "pss_mb": mem["pss_mb"],
        "processes": mem["processes"],
    }
    if bound is not None and before is not None and after is not None:
        rec["round_bound_rows_per_s"] = {"before": round(before, 1), "after": round(after, 1), "batch": bound.batch}
        rec["round_saturation"] = round(rec["rows_per_s"] / ((before + after) / 2), 3)
    if b0 is not None and b1 is not None and b1[1] > b0[1]:
        per_item = args.rows_per_request if launch.system == "triton" else 1  # Triton counts requests
        rec["avg_batch"] = round((b1[0] - b0[0]) * per_item / (b1[1] - b0[1]), 2)  # rows per batch
        if c0 is not None and c1 is not None:
            # How busy the replica was, and what a batch cost it, under this load (against the
            # profile's figure for the same batch measured alone: the saturation gap's two parts)
            rec["replica_busy"] = round((c1 - c0) / secs, 3)
            rec["compute_ms_per_batch"] = round((c1 - c0) * 1e3 / (b1[1] - b0[1]), 3)
    return rec


SUMMARY_KEYS = (
    "rps",
    "rows_per_s",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "p999_ms",
    "server_cpu_ms_per_req",
    "server_cores",
    "wrk_cpu_ms_per_req",
    "wrk_cores",
    "other_cores",
    "avg_batch",
    "replica_busy",
    "compute_ms_per_batch",
    "round_saturation",
    "pss_mb",
    "processes",
)


def summarise(rounds: dict[str, list[dict[str, Any]]], baseline: str = "triton") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for system, recs in rounds.items():
        good = [r for r in recs if "error" not in r]
        med = {}
        for k in SUMMARY_KEYS:
            vals = [r[k] for r in good if k in r]
            if vals:
                med[k] = round(statistics.median(vals), 4)
        med["rounds_ok"] = len(good)
        med["errors_total"] = sum(sum(r["errors"].values()) for r in good)
        out[system] = med
    if baseline in out and out[baseline].get("rps"):
        base = out[baseline]
        b_rounds = rounds[baseline]
        for system, med in out.items():
            if system == baseline or "rps" not in med:
                continue
            med[f"rps_ratio_vs_{baseline}"] = round(med["rps"] / base["rps"], 3)
            med[f"p99_ratio_vs_{baseline}"] = round(med["p99_ms"] / base["p99_ms"], 3)
            med[f"cpu_per_req_ratio_vs_{baseline}"] = round(
                med["server_cpu_ms_per_req"] / base["server_cpu_ms_per_req"], 3
            )
            paired = [
                a["rps"] / b["rps"]
                for a, b in zip(rounds[system], b_rounds, strict=False)
                if "rps" in a and "rps" in b and b["rps"]
            ]
            if paired:
                med[f"rps_ratio_vs_{baseline}_paired_median"] = round(statistics.median(paired), 3)
    return out


def saturation(summary: dict[str, Any], bound: dict[str, Any]) -> dict[str, Any]:
    """Each system's rows per second as a fraction of this machine's compute bound (the
    saturation the benchmarks check: >= 0.9), from the profile of this machine's device type when there is one."""
    from sloserve.replica.runtime import device_type

    here = device_type()
    b = bound.get(here)
    if b is None:
        return {"device_type": here, "error": f"no profile for {here}: run sloserve profile first"}
    out: dict[str, Any] = {"device_type": here, "bound_rows_per_s": b["bound_rps_capped"]}
    for system, med in summary.items():
        if med.get("rows_per_s"):
            out[system] = round(med["rows_per_s"] / b["bound_rps_capped"], 3)
        if med.get("round_saturation"):  # --bound-each-round: against the bound measured around each round
            out[f"{system}_per_round_median"] = med["round_saturation"]
    return out


def machine() -> dict[str, Any]:
    from sloserve.replica.runtime import cpu_model_name

    cpu = cpu_model_name()
    mem_gb = round(psutil.virtual_memory().total / 2**30, 1)
    try:
        wrk_v = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0].strip()
    except OSError:
        wrk_v = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": mem_gb,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "wrk": wrk_v,
    }


def _one_round(
    s: str,
    r: int,
    args: argparse.Namespace,
    repo: Path,
    knobs: BatchingKnobs,
    tmp: Path,
    body: bytes,
    body_path: Path,
    body_headers: dict[str, str],
    log_dir: Path,
    round_bound,
) -> dict[str, Any]:
    """One system, started, measured under wrk and stopped; a failure is recorded, the run goes on."""
    print(f"[round {r + 1}/{args.rounds}] {s}: starting", file=sys.stderr, flush=True)
    try:
        base, tree = split_tree(s, args._trees)
        launch = from_tree(make_launch(base, repo, args.model, args.variant, knobs, tmp), tree)
        launch.system = s
        lua = tmp / f"{s.replace(':', '_')}.lua"
        write_lua(lua, body_path, {**launch.headers, **body_headers})
        rec = measure_once(launch, body, lua, args, log_dir, round_bound)
    except Exception as e:
        rec = {"error": f"{type(e).__name__}: {e}"[:4000]}
        print(f"[round {r + 1}] {s}: FAILED {rec['error'][:400]}", file=sys.stderr, flush=True)
    else:
        print(
            f"[round {r + 1}/{args.rounds}] {s}: {rec['rps']:.0f} rps  p50 {rec['p50_ms']:.2f} ms  "
            f"p99 {rec['p99_ms']:.2f} ms  server {rec['server_cpu_ms_per_req']:.3f} ms CPU/req  "
            f"wrk {rec['wrk_cores']:.2f} cores  other {rec['other_cores']:.2f} cores"
            + (f"  batch {rec['avg_batch']}" if "avg_batch" in rec else ""),
            file=sys.stderr,
            flush=True,
        )
    rec["round"] = r + 1
    return rec


def run(args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(args.repo).resolve()  # absolute: a system from another tree (--tree) starts in that tree
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args._trees = parse_trees(args.tree)
    for s in systems:
        if split_tree(s, args._trees)[0] not in SYSTEMS:
            raise SystemExit(f"sloserve bench closed: unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    knobs = BatchingKnobs(
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        triton_instances=args.triton_instances,
        sloserve_config=args.sloserve_config,
        sloserve_policy=args.sloserve_policy,
    )
    bad = [s for s in systems if split_tree(s, args._trees)[0] not in BINARY_SYSTEMS] if args.binary else []
    if bad:
        raise SystemExit(
            f"sloserve bench closed: --binary: {', '.join(bad)} do not take KServe's binary tensor "
            f"extension (only {', '.join(BINARY_SYSTEMS)})"
        )
    if not 1 <= args.rows_per_request <= args.max_batch_size:
        raise SystemExit(
            f"sloserve bench closed: --rows-per-request {args.rows_per_request} must be 1 to "
            f"--max-batch-size ({args.max_batch_size})"
        )
    body = request_body(repo, args.model, rows=args.rows_per_request)
    wire, body_headers = body, dict[str, str]()
    if args.binary:
        wire, body_headers = binary_body(body)
    tmp = default_tmp()
    log_dir = Path(args.log_dir) if args.log_dir else tmp / "logs"
    body_path = tmp / "body.json"
    body_path.write_bytes(wire)
    rounds: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    round_bound = None
    if args.bound_each_round:
        from sloserve.replica.runtime import device_type

        prof = compute_bound(repo, args.model, args.variant, args.max_batch_size).get(device_type())
        if prof is None:
            raise SystemExit(
                "sloserve bench closed: --bound-each-round needs this machine's profile: run sloserve profile first"
            )
        round_bound = RoundBound(repo, args.model, args.variant, prof["batch"])
    t_start = time.time()
    for r in range(args.rounds):
        order = systems if (r % 2 == 0 or not args.alternate) else systems[::-1]
        for s in order:
            rec = _one_round(s, r, args, repo, knobs, tmp, body, body_path, body_headers, log_dir, round_bound)
            rounds[s].append(rec)
            time.sleep(args.pause)
    failed = any("error" in r for recs in rounds.values() for r in recs)
    if args.keep_tmp or failed:
        print(f"server logs and temp files kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = summarise(rounds, args.baseline)
    bound = compute_bound(repo, args.model, args.variant, args.max_batch_size)
    result = {
        "benchmark": "closed",
        "command": "sloserve bench " + " ".join(sys.argv[sys.argv.index("closed") :]) if "closed" in sys.argv else None,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_start)),
        "wall_s": round(time.time() - t_start, 1),
        "machine": machine(),
        "setup": {
            "model": args.model,
            "variant": args.variant,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "rounds": args.rounds,
            "wrk_threads": args.threads,
            "max_batch_size": args.max_batch_size,
            "max_wait_ms": args.max_wait_ms,
            "triton_instances": args.triton_instances,
            "sloserve_policy": args.sloserve_policy,
            "ort_threads": 1,
            "nice": args.nice,
            "body_bytes": len(body),
            "rows_per_request": args.rows_per_request,
        },
        "summary": summary,
        "compute_bound": bound,
        "saturation": saturation(summary, bound),
        "rounds": rounds,
    }
    result["ratios_of_rps"] = {
        base: {s: round(v["rps"] / summary[base]["rps"], 3) for s, v in summary.items() if s != base and v.get("rps")}
        for base in ("triton", "rayserve", "mlserver", "sloserve")
        if summary.get(base, {}).get("rps")
    }
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="digits", help="model in the repository (default digits)")
    p.add_argument("--variant", default="small", help="variant whose ONNX file every system serves")
    p.add_argument("--repo", default="model_repository")
    p.add_argument("--concurrency", "-c", type=int, default=32, help="requests in flight (wrk connections)")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per system per round")
    p.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds before each measurement")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (A B A B ...); medians reported")
    p.add_argument(
        "--systems",
        default="sloserve,triton",
        help=f"comma list of {', '.join(SYSTEMS)}; a sloserve system may end in :LABEL (see --tree)",
    )
    p.add_argument("--baseline", default="triton", help="the system the ratios are taken against")
    p.add_argument(
        "--tree",
        action="append",
        metavar="LABEL=PATH",
        help="another sloserve checkout; `sloserve:LABEL` runs from it (before/after comparisons)",
    )
    p.add_argument("--threads", type=int, default=1, help="wrk threads (1 is the cheapest)")
    p.add_argument(
        "--binary",
        action="store_true",
        help="send the tensor in KServe's binary extension (as tritonclient.http does) instead of "
        "JSON numbers; only for sloserve, sloserve-ray and triton",
    )
    p.add_argument("--max-batch-size", type=int, default=32, help="every system's max batch size")
    p.add_argument(
        "--bound-each-round",
        action="store_true",
        help="measure the compute bound (ORT alone, the profile's best batch) right before and after "
        "every round and report each round's rows/s against it (round_saturation): the box's "
        "speed drifts between a profile and a run",
    )
    p.add_argument(
        "--rows-per-request",
        type=int,
        default=1,
        help="rows (images) in each request's tensor; throughput is also reported in rows/s and as a "
        "fraction of the profile's compute bound",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=2.0,
        help="every system's batching wait (Triton max_queue_delay, MLServer max_batch_time, "
        "@serve.batch batch_wait_timeout_s, sloserve's max_wait_ms)",
    )
    p.add_argument("--triton-instances", type=int, default=1)
    p.add_argument("--sloserve-policy", default="timeout")
    p.add_argument("--sloserve-config", help="sloserve settings file instead of the generated one")
    p.add_argument("--alternate", action="store_true", help="reverse the system order every other round")
    p.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run servers and wrk at this nice value (e.g. -10 as root) so other tenants of a shared "
        "box disturb the measurement less; every system gets the same",
    )
    p.add_argument("--pause", type=float, default=1.0, help="seconds between runs")
    p.add_argument("--log-dir", help="where server logs go (default: a temp dir)")
    p.add_argument("--keep-tmp", action="store_true", help="keep the temp dir (logs, bodies) even when all runs worked")
    p.add_argument("--out", help="write the JSON result here (default: stdout only)")


def main_args(args: argparse.Namespace) -> int:
    result = run(args)
    write_result(result, args.out)
    print(json.dumps({"summary": result["summary"], "ratios_of_rps": result.get("ratios_of_rps")}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sloserve.loadtests.bench.closed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return main_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
