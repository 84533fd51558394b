"""``sloserve loadtest``: a headless, bounded Locust run against a live sloserve, judged on its SLO.

    sloserve loadtest --host http://127.0.0.1:8000 --duration 15 --users 8 --slo-ms 50
    sloserve loadtest --shape trace --trace-column diurnal_strong --peak-rps 150 --duration 20

Runs sloserve/loadtests/locustfile.py (and sloserve/loadtests/trace_shape.py with ``--shape trace``) in a child
process with a time limit and a user cap, and exits with Locust's code: 0 when SLO attainment and
the error rate meet their thresholds, 3 when either misses, 1/2 on Locust's own errors. Also
``python sloserve/loadtests/run.py ...`` without the sloserve CLI.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MAX_DURATION_S = 600
MAX_USERS = 256


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="http://127.0.0.1:8000", help="sloserve REST base URL")
    p.add_argument("--grpc-host", default="", help="gRPC host:port (default: REST port + 1)")
    p.add_argument(
        "--transport",
        choices=["http", "grpc", "both"],
        default="both",
        help="V2 over REST (FastHttpUser), gRPC (tritonclient) or both (3:1)",
    )
    p.add_argument("--models", default="digits", help="models and weights, e.g. digits:3,heavy:1")
    p.add_argument("--slo-ms", type=float, default=50.0, help="parameters.slo_ms of every request")
    p.add_argument("--min-attainment", type=float, default=0.95, help="fail below this SLO attainment")
    p.add_argument("--max-error-rate", type=float, default=0.01, help="fail above this error rate")
    p.add_argument(
        "--shape",
        choices=["constant", "trace"],
        default="constant",
        help="constant users, or users following an arrival trace (sloserve/loadtests/trace_shape.py)",
    )
    p.add_argument("--users", type=int, default=4, help="users for --shape constant")
    p.add_argument("--rps-per-user", type=float, default=20.0, help="requests/s per user (0: closed loop)")
    p.add_argument("--duration", type=float, default=15.0, help=f"seconds of load (<= {MAX_DURATION_S})")
    p.add_argument("--trace-file", default="", help="per-minute trace CSV (default: sloserve/loadtests/traces/...)")
    p.add_argument(
        "--trace-kind",
        choices=["counts", "timestamps"],
        default="counts",
        help="per-minute counts, or request timestamps replayed per second (then --seconds-per-minute 60 is real time)",
    )
    p.add_argument("--trace-column", default="aggregate_1350fn")
    p.add_argument("--trace-start-minute", type=int, default=540)
    p.add_argument("--seconds-per-minute", type=float, default=1.0, help="test seconds per trace minute")
    p.add_argument("--peak-rps", type=float, default=150.0, help="rate of the busiest trace minute")
    p.add_argument("--results-json", default="", help="write the SLO summary and per-second timeline here")
    p.add_argument("--csv", default="", help="Locust CSV prefix (stats, failures, history)")
    p.add_argument("-q", "--quiet", action="store_true", help="only the summary, no periodic stats")


def locust_command(a: argparse.Namespace) -> list[str]:
    if not 0 < a.duration <= MAX_DURATION_S:
        raise SystemExit(f"sloserve loadtest: --duration must be in (0, {MAX_DURATION_S}] s")
    files = [str(HERE / "locustfile.py")]
    cmd = [
        sys.executable,
        "-m",
        "locust",
        "--headless",
        "-H",
        a.host,
        "-t",
        f"{math.ceil(a.duration)}s",
        "--stop-timeout",
        "2",
        "--models",
        a.models,
        "--slo-ms",
        str(a.slo_ms),
        "--min-attainment",
        str(a.min_attainment),
        "--max-error-rate",
        str(a.max_error_rate),
        "--rps-per-user",
        str(a.rps_per_user),
    ]
    if a.shape == "constant":
        if not 1 <= a.users <= MAX_USERS:
            raise SystemExit(f"sloserve loadtest: --users must be in 1..{MAX_USERS}")
        cmd += ["-u", str(a.users), "-r", str(a.users)]
    else:
        per_user = a.rps_per_user if a.rps_per_user > 0 else 50.0
        if math.ceil(a.peak_rps / per_user) > MAX_USERS:
            raise SystemExit(
                f"sloserve loadtest: --peak-rps {a.peak_rps} at {per_user} requests/s per user needs "
                f"over {MAX_USERS} users; raise --rps-per-user"
            )
        files.append(str(HERE / "trace_shape.py"))
        minutes = max(1, int(a.duration // a.seconds_per_minute))
        cmd += [
            "--trace-kind",
            a.trace_kind,
            "--trace-column",
            a.trace_column,
            "--trace-start-minute",
            str(a.trace_start_minute),
            "--trace-minutes",
            str(minutes),
            "--seconds-per-minute",
            str(a.seconds_per_minute),
            "--peak-rps",
            str(a.peak_rps),
        ]
        if a.trace_file:
            cmd += ["--trace-file", a.trace_file]
    cmd[3:3] = ["-f", ",".join(files)]
    if a.grpc_host:
        cmd += ["--grpc-host", a.grpc_host]
    if a.results_json:
        cmd += ["--results-json", a.results_json]
    if a.csv:
        cmd += ["--csv", a.csv, "--csv-full-history"]
    if a.quiet:
        cmd.append("--only-summary")
    cmd += {"http": ["V2HttpUser"], "grpc": ["V2GrpcUser"], "both": []}[a.transport]
    return cmd


EXIT_GRACE_S = 10.0  # how long Locust may take to exit once it has written its exit code


def run(a: argparse.Namespace) -> int:
    cmd = locust_command(a)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}  # flags above are the truth
    with tempfile.TemporaryDirectory(prefix="sloserve-loadtest-") as tmp:
        code_file = Path(tmp) / "exit_code"
        proc = subprocess.Popen(cmd + ["--exit-code-file", str(code_file)], env=env)
        try:
            return _wait(proc, code_file, a.duration + 60)
        except KeyboardInterrupt:
            return 130
        finally:  # never leave a Locust behind (its temporary folder is about to go)
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _wait(proc: subprocess.Popen, code_file: Path, limit_s: float) -> int:
    """Locust's exit code; a Locust that hangs after its verdict is ended with that verdict's code.

    Once the run is over, Locust writes its exit code to ``code_file`` (sloserve/loadtests/locustfile.py,
    the ``quit`` event) and then leaves. If it is still there ``EXIT_GRACE_S`` later, the process
    is hanging on its way out (gRPC under gevent, seen in CI): it is killed and the written code,
    which already holds the SLO verdict, is returned. A Locust that never gets that far is killed
    at ``limit_s`` and the run fails with 4.
    """
    deadline = time.monotonic() + limit_s
    code: int | None = None
    written_at = 0.0  # when the code was first read
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if code is None:
            code = _read_code(code_file)
            written_at = now
        if code is not None and (now - written_at > EXIT_GRACE_S or now > deadline):
            proc.kill()
            proc.wait()
            print(
                f"sloserve loadtest: Locust hung on its way out after its verdict; ended it (exit code {code})",
                file=sys.stderr,
            )
            return code
        if now > deadline:
            proc.kill()
            proc.wait()
            print("sloserve loadtest: Locust did not stop within 60 s of its time limit", file=sys.stderr)
            return 4


def _read_code(path: Path) -> int | None:
    """The exit code Locust wrote, or None while there is none (not yet, or not a whole number yet)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def register(sub) -> None:
    p = sub.add_parser(
        "loadtest",
        help="headless Locust run (V2 REST/gRPC, per-request SLOs); fails on a missed SLO",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sloserve/loadtests/run.py", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
