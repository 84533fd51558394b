"""Closed loop with Triton's own load tool, ``perf_analyzer``: the same ONNX file served by sloserve from a
Triton model repository, by sloserve from its own layout, and by Triton.

Systems (``--systems``):

- ``sloserve-triton``: ``sloserve serve`` as ``make run`` starts it (no config; ``--backend`` from
  ``--sloserve-backend``, the Ray backend by default) on a temporary Triton repository generated from the
  ONNX file: ``<model>/config.pbtxt`` (``platform: "onnxruntime_onnx"``, the native layout's
  ``max_batch_size``, ``dynamic_batching { }``, inputs and outputs completed from the graph) and
  ``<model>/1/model.onnx``;
- ``sloserve-native``: the same server on a temporary sloserve repository, ``<model>/config.json`` (the
  ONNX file's own ``config.json`` restricted to its variant when it sits in a sloserve repository, else
  the config sloserve reads from the Triton layout) and ``<model>/<variant>/model.onnx``;
- ``triton``: Triton (tritonserver through nvidia-pytriton, ``.peers/triton``) as
  ``sloserve/loadtests/bench/systems.py`` starts it at its best: the plain callable, metrics off,
  ``--triton-max-wait-ms`` (0, Triton's default queue delay, by default) and ``--triton-instances``;
  ``triton-<wait ms>x<instances>`` names another configuration, and the ratios take the best one.
  pytriton guards Triton's statistics endpoint with a random access token, which perf_analyzer cannot
  send: the peer runs with ``--unrestricted``, tritonserver's own default.

The ONNX file is copied into each repository (sloserve refuses a model file that resolves outside its
repository); its latency profiles, where it has some, go with it under each layout's variant name.

Each round starts one system at a time, in turn (reversed every other round), and measures every
protocol and concurrency with one perf_analyzer run each: ``--concurrency-range C:C``, its default
random input data, its own windows and stability rule (``--measurement-interval``,
``--stability-percentage``, ``--max-trials``; unset: perf_analyzer's 5 s windows until three agree within
10%), its CSV report (``-f``, ``--verbose-csv``). Per run: throughput, p50/p90/p95/p99 and average
latency, the server's queue and compute times where it reports statistics, perf_analyzer's own CPU
(user + system from ``wait4``, over its wall time), the server's process tree CPU and the rest of the
machine's. (sloserve answers Triton's statistics requests but does not list the ``statistics`` extension
in its server metadata, so perf_analyzer reports server queue and compute times for Triton only.) The
JSON result has every run; the printed tables have the medians over rounds and the ratios
of medians: each sloserve system against Triton and the Triton layout against the native one.

    sloserve bench perf --rounds 2 --out results/perf-digits-small.json
    sloserve bench perf --quick --concurrency 1,2          # a smoke test: one round, 1 s windows
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sloserve.loadtests import perf_analyzer
from sloserve.loadtests.bench.perf_report import (
    markdown,
    native_config,
    parse_csv,
    ratios,
    readiness_body,
    relabel_profile,
    summarise,
    triton_config,
)
from sloserve.loadtests.bench.procstat import CpuWindow
from sloserve.loadtests.bench.slo_systems import default_launch
from sloserve.loadtests.bench.systems import BatchingKnobs, Launch, default_tmp, make_launch
from sloserve.loadtests.results import write_result

SYSTEMS = ("sloserve-triton", "sloserve-native", "triton")
TRITON_SYSTEM = re.compile(r"triton(?:-(\d+(?:\.\d+)?)x(\d+))?")
PROTOCOLS = ("http", "grpc")
DEFAULT_ONNX = "model_repository/digits/small/model.onnx"
QUICK = {"rounds": 1, "measurement_interval": 1000, "max_trials": 6, "stability_percentage": 50.0}


@dataclass(frozen=True)
class Repos:
    """The two temporary repositories serving one ONNX file."""

    triton: Path  # <model>/config.pbtxt + <model>/1/model.onnx
    native: Path  # <model>/config.json + <model>/<variant>/model.onnx
    model: str
    variant: str
    config: dict[str, Any]  # the native layout's config.json
    sha256: str
    profiles: tuple[str, ...]


def prepare_repos(onnx: Path, model: str, root: Path, max_batch_size: int | None = None) -> Repos:
    """Write both layouts under ``root`` and load each with sloserve's own loader (a problem stops the
    benchmark here, named, rather than at a server's start)."""
    from sloserve.models.repository import ModelRepository

    onnx = onnx.resolve()
    if not onnx.is_file():
        raise SystemExit(f"sloserve bench perf: {onnx} is not a file")
    src_cfg_path = onnx.parent.parent / "config.json"
    source: dict[str, Any] | None = json.loads(src_cfg_path.read_text()) if src_cfg_path.is_file() else None
    variant = onnx.parent.name
    if source is None or not any(v.get("name") == variant for v in source.get("variants", [])):
        source, variant = None, "1"
    mbs = int(max_batch_size or (source or {}).get("max_batch_size") or BatchingKnobs.max_batch_size)
    slo = source.get("slo_ms") if source else None

    tdir, ndir = root / "triton" / model, root / "native" / model
    for d in (tdir / "1", ndir / variant):
        d.mkdir(parents=True, exist_ok=False)
        shutil.copyfile(onnx, d / "model.onnx")
    (tdir / "config.pbtxt").write_text(triton_config(model, mbs, slo))
    if source is None:  # a lone ONNX file: the config.json is what sloserve reads from the Triton layout
        loaded = ModelRepository(root / "triton").load().models[model]
        source = loaded.config.model_dump(mode="json")
    cfg = native_config(source, model, variant) | {"max_batch_size": mbs}
    (ndir / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")

    profiles = []
    for path in sorted((onnx.parent / "profiles").glob("*.json")):
        doc = json.loads(path.read_text())
        for d, v in ((tdir / "1", "1"), (ndir / variant, variant)):
            (d / "profiles").mkdir(exist_ok=True)
            (d / "profiles" / path.name).write_text(json.dumps(relabel_profile(doc, model, v)) + "\n")
        profiles.append(path.name)
    for r in (root / "triton", root / "native"):
        try:
            ModelRepository(r).load()
        except (ValueError, FileNotFoundError) as e:
            raise SystemExit(f"sloserve bench perf: the generated repository {r} does not load: {e}") from None
    digest = hashlib.sha256(onnx.read_bytes()).hexdigest()
    return Repos(root / "triton", root / "native", model, variant, cfg, digest, tuple(profiles))


# ---- perf_analyzer ------------------------------------------------------------------------------------


def perf_argv(
    model: str, url: str, protocol: str, concurrency: int, csv_path: Path, args: argparse.Namespace
) -> list[str]:
    """perf_analyzer's arguments for one run: one concurrency, its CSV report, its own windows unless set."""
    argv = ["-m", model, "-u", url, "-i", protocol, "--concurrency-range", f"{concurrency}:{concurrency}"]
    argv += ["-f", str(csv_path), "--verbose-csv"]
    if args.measurement_interval:
        argv += ["--measurement-interval", str(int(args.measurement_interval))]
    if args.stability_percentage:
        argv += ["--stability-percentage", f"{args.stability_percentage:g}"]
    if args.max_trials:
        argv += ["--max-trials", str(args.max_trials)]
    return argv + shlex.split(args.perf_args or "")


def run_tool(tool: perf_analyzer.Tool, argv: list[str], timeout_s: float) -> tuple[int, str, float, float]:
    """Run perf_analyzer in its own process group; (exit code, output, its CPU seconds from ``wait4``'s
    rusage, wall seconds). Past ``timeout_s`` its group is killed."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        tool.command(*argv),
        env=tool.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )

    def _kill() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    timer = threading.Timer(timeout_s, _kill)
    timer.start()
    try:
        assert proc.stdout is not None  # stdout=PIPE
        out = proc.stdout.read().decode(errors="replace")
        proc.stdout.close()
        _, status, ru = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out, ru.ru_utime + ru.ru_stime, time.monotonic() - t0


def _port(launch: Launch, flag: str) -> int:
    return int(launch.argv[launch.argv.index(flag) + 1])


def measure(
    launch: Launch,
    tool: perf_analyzer.Tool,
    model: str,
    protocol: str,
    concurrency: int,
    args: argparse.Namespace,
    work: Path,
) -> dict[str, Any]:
    """One perf_analyzer run against the running system (once more when it fails, ``--retries`` times)."""
    port = _port(launch, "--http-port" if protocol == "http" else "--grpc-port")
    csv_path = work / f"{launch.system}-{protocol}-c{concurrency}-{int(time.time() * 1000)}.csv"
    argv = perf_argv(model, f"127.0.0.1:{port}", protocol, concurrency, csv_path, args)
    window_s = (args.measurement_interval or 5000) / 1e3
    timeout_s = 60 + 2 * window_s * ((args.max_trials or 10) + 2)
    for attempt in range(1, args.retries + 2):
        csv_path.unlink(missing_ok=True)
        win = CpuWindow(launch.pid)
        win.start()
        rc, out, gen_s, wall_s = run_tool(tool, argv, timeout_s)
        server_s, busy_s, total_s = win.stop()
        if launch.proc is None or launch.proc.poll() is not None:
            raise RuntimeError(
                f"{launch.system} exited during perf_analyzer; log: {launch.log_path}\n{launch.log_tail()}"
            )
        rows = parse_csv(csv_path.read_text()) if rc == 0 and csv_path.is_file() else []
        if rows:
            break
        print(
            f"    perf_analyzer failed (rc {rc}, attempt {attempt}): {out.strip()[-300:]}", file=sys.stderr, flush=True
        )
    else:
        return {"error": f"perf_analyzer failed (rc {rc}) {args.retries + 1} times", "output_tail": out[-2000:]}
    row = next((r for r in rows if r.get("concurrency") == concurrency), rows[0])
    rec: dict[str, Any] = {k: v for k, v in row.items() if k != "concurrency"}
    rec.update(
        attempts=attempt,
        wall_s=round(wall_s, 2),
        gen_cpu_s=round(gen_s, 3),
        gen_cores=round(gen_s / wall_s, 3),
        server_cores=round(server_s / wall_s, 3),
        # busy CPU that is neither the server nor perf_analyzer: other tenants of the machine and this harness
        other_cores=round(max(0.0, busy_s - server_s - gen_s) / wall_s, 3),
        machine_cores=round(total_s / wall_s, 2),
    )
    if rec.get("infer_per_s"):
        rec["gen_cpu_us_per_infer"] = round(rec["gen_cores"] / rec["infer_per_s"] * 1e6, 2)
        rec["server_cpu_us_per_infer"] = round(rec["server_cores"] / rec["infer_per_s"] * 1e6, 2)
    return rec


# ---- systems and rounds ----------------------------------------------------------------------------


def check_systems(systems: list[str]) -> None:
    for s in systems:
        if s not in SYSTEMS and not TRITON_SYSTEM.fullmatch(s):
            raise SystemExit(
                f"sloserve bench perf: unknown system {s!r}; choose from {', '.join(SYSTEMS)} or triton-<wait ms>x<instances>"
            )


def make_system(system: str, repos: Repos, args: argparse.Namespace, tmp: Path) -> tuple[Launch, bytes]:
    """The system's launch (not started) and the request that tells it is ready."""
    inputs = list(repos.config["inputs"])
    if system.startswith("sloserve"):
        repo = repos.triton if system == "sloserve-triton" else repos.native
        launch = default_launch(repo, repos.model, tmp, inprocess=args.sloserve_backend == "inprocess")
        launch.system = system
        return launch, readiness_body(inputs)
    m = TRITON_SYSTEM.fullmatch(system)
    assert m is not None  # check_systems
    knobs = BatchingKnobs(
        max_batch_size=int(repos.config["max_batch_size"]),
        max_wait_ms=float(m.group(1)) if m.group(1) else args.triton_max_wait_ms,
        triton_instances=int(m.group(2)) if m.group(2) else args.triton_instances,
    )
    launch = make_launch("triton", repos.native, repos.model, repos.variant, knobs, tmp)
    launch.system = system
    launch.argv.append("--unrestricted")  # perf_analyzer reads the statistics endpoint, which pytriton guards
    if len(inputs) == 1:  # the peer names its one input "input" (sloserve/loadtests/peers/triton_server.py)
        inputs = [{**inputs[0], "name": "input"}]
    return launch, readiness_body(inputs)


def one_system(
    system: str, rnd: int, repos: Repos, tool: perf_analyzer.Tool, args: argparse.Namespace, tmp: Path
) -> list[dict[str, Any]]:
    """Start ``system``, measure every protocol and concurrency, stop it. A failure is recorded on every
    point it left unmeasured; the run goes on."""
    points = [(p, c) for p in args._protocols for c in args._concurrency]
    recs: list[dict[str, Any]] = []
    print(f"[round {rnd + 1}/{args.rounds}] {system}: starting", file=sys.stderr, flush=True)
    launch = None
    try:
        launch, body = make_system(system, repos, args, tmp)
        launch.start(tmp / "logs")
        ready_s = launch.wait_ready(body)
        for protocol, c in points:
            rec = measure(launch, tool, repos.model, protocol, c, args, tmp / "csv")
            recs.append(
                {
                    "system": system,
                    "round": rnd + 1,
                    "protocol": protocol,
                    "concurrency": c,
                    "ready_s": round(ready_s, 2),
                    **rec,
                }
            )
            if "error" in rec:
                print(
                    f"[round {rnd + 1}] {system} {protocol} c={c}: FAILED {rec['error']}", file=sys.stderr, flush=True
                )
            else:
                print(
                    f"[round {rnd + 1}/{args.rounds}] {system} {protocol} c={c}: {rec.get('infer_per_s', 0):,.0f} infer/s  "
                    f"p50 {rec.get('p50_ms', 0):.2f} ms  p99 {rec.get('p99_ms', 0):.2f} ms  "
                    f"perf_analyzer {rec['gen_cores']:.2f} cores  server {rec['server_cores']:.2f} cores",
                    file=sys.stderr,
                    flush=True,
                )
    except Exception as e:
        err = f"{type(e).__name__}: {e}"[:4000]
        print(f"[round {rnd + 1}] {system}: FAILED {err[:400]}", file=sys.stderr, flush=True)
        done = {(r["protocol"], r["concurrency"]) for r in recs}
        recs += [
            {"system": system, "round": rnd + 1, "protocol": p, "concurrency": c, "error": err}
            for p, c in points
            if (p, c) not in done
        ]
    finally:
        if launch is not None:
            launch.stop()
    return recs


def machine() -> dict[str, Any]:
    import psutil

    from sloserve.replica.runtime import cpu_model_name

    return {
        "cpu": cpu_model_name(),
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "perf_analyzer": perf_analyzer.TRITONCLIENT,
    }


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options ``--quick`` decides when unset, and parse the lists."""
    for k, v in QUICK.items():
        if getattr(args, k) is None and args.quick:
            setattr(args, k, v)
    args.rounds = args.rounds or 2
    args._systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    check_systems(args._systems)
    args._protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    bad = [p for p in args._protocols if p not in PROTOCOLS]
    if bad or not args._protocols:
        raise SystemExit(f"sloserve bench perf: --protocols takes {', '.join(PROTOCOLS)}, not {args.protocols!r}")
    try:
        args._concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        raise SystemExit(f"sloserve bench perf: --concurrency {args.concurrency!r} is not a list of numbers") from None
    if not args._concurrency or min(args._concurrency) < 1:
        raise SystemExit("sloserve bench perf: --concurrency takes numbers of at least 1")
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    args = resolve(args)
    tool = perf_analyzer.ensure()
    if args.tmp_dir:
        Path(args.tmp_dir).mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="sloserve-bench-perf-", dir=Path(args.tmp_dir).resolve()))
    else:
        tmp = default_tmp()
    (tmp / "csv").mkdir(parents=True, exist_ok=True)
    repos = prepare_repos(Path(args.onnx), args.model, tmp / "repos", args.max_batch_size)
    systems = args._systems
    records: list[dict[str, Any]] = []
    t_start = time.time()
    for rnd in range(args.rounds):
        for s in systems if rnd % 2 == 0 else systems[::-1]:
            records += one_system(s, rnd, repos, tool, args, tmp)
            time.sleep(args.pause)
    failed = any("error" in r for r in records)
    if args.keep_tmp or failed:
        print(f"server logs, perf_analyzer reports and repositories kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = summarise(records)
    return {
        "benchmark": "perf",
        "command": "sloserve bench " + " ".join(sys.argv[sys.argv.index("perf") :]) if "perf" in sys.argv else None,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(t_start)),
        "wall_s": round(time.time() - t_start, 1),
        "machine": machine(),
        "setup": {
            "onnx": str(Path(args.onnx)),
            "onnx_sha256": repos.sha256,
            "model": repos.model,
            "native_variant": repos.variant,
            "max_batch_size": repos.config["max_batch_size"],
            "slo_ms": repos.config.get("slo_ms"),
            "profiles": list(repos.profiles),
            "triton_config_pbtxt": triton_config(
                repos.model, repos.config["max_batch_size"], repos.config.get("slo_ms")
            ),
            "systems": systems,
            "protocols": args._protocols,
            "concurrency": args._concurrency,
            "rounds": args.rounds,
            "measurement_interval_ms": args.measurement_interval,
            "stability_percentage": args.stability_percentage,
            "max_trials": args.max_trials,
            "perf_args": args.perf_args,
            "sloserve_backend": args.sloserve_backend,
            "triton_max_wait_ms": args.triton_max_wait_ms,
            "triton_instances": args.triton_instances,
        },
        "summary": summary,
        "ratios": ratios(summary, systems),
        "records": records,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--onnx", default=DEFAULT_ONNX, help=f"the ONNX file every system serves (default {DEFAULT_ONNX})")
    p.add_argument("--model", default="digits", help="the model's name in every system (default digits)")
    p.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="comma list of " + ", ".join(SYSTEMS) + ", triton-<wait ms>x<instances>",
    )
    p.add_argument("--protocols", default="http,grpc", help="comma list of http, grpc (default both)")
    p.add_argument(
        "--concurrency",
        default="1,2,4,8,16",
        help="requests in flight, one perf_analyzer run each (default 1,2,4,8,16)",
    )
    p.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds, medians reported (default 2; 1 with --quick)"
    )
    p.add_argument(
        "--measurement-interval",
        type=int,
        default=None,
        metavar="MS",
        help="perf_analyzer's window in ms (default: its own, 5000; 1000 with --quick)",
    )
    p.add_argument(
        "--stability-percentage",
        type=float,
        default=None,
        help="perf_analyzer's stability rule, in %% (default: its own, 10; 50 with --quick)",
    )
    p.add_argument(
        "--max-trials",
        type=int,
        default=None,
        help="perf_analyzer's windows at most (default: its own, 10; 6 with --quick)",
    )
    p.add_argument(
        "--perf-args",
        default="",
        help="more perf_analyzer arguments, one string (e.g. --perf-args='--async --max-threads 8')",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=1,
        help="perf_analyzer runs again this many times when it fails (no stable window)",
    )
    p.add_argument(
        "--quick", action="store_true", help="a smoke test: one round, 1 s windows, at most 6 of them, 50%% stability"
    )
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help="every system's max batch size (default: the model's config.json, else 32)",
    )
    p.add_argument(
        "--sloserve-backend",
        choices=["ray", "inprocess"],
        default="ray",
        help="sloserve's backend (default ray, as make run starts it)",
    )
    p.add_argument(
        "--triton-max-wait-ms", type=float, default=0.0, help="Triton's max_queue_delay (default 0, Triton's own)"
    )
    p.add_argument("--triton-instances", type=int, default=1, help="Triton's model instances (default 1)")
    p.add_argument("--pause", type=float, default=1.0, help="seconds between systems")
    p.add_argument(
        "--tmp-dir", help="a folder to hold this run's temp dir (repositories, logs, reports; default: the system's)"
    )
    p.add_argument("--keep-tmp", action="store_true", help="keep the temp dir even when every run worked")
    p.add_argument("--out", help="the JSON result (default results/perf-<model>-<time>.json)")


def main_args(args: argparse.Namespace) -> int:
    result = run(args)
    out = args.out or f"results/perf-{args.model}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_result(result, out)
    print(markdown(result["summary"], result["ratios"], result["setup"]["systems"]))
    return 0 if any("error" not in r for r in result["records"]) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sloserve.loadtests.bench.perf",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    return main_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
