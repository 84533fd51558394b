"""The command line of ``sloserve bench slo``."""

from __future__ import annotations

import argparse

from sloserve.loadtests.bench.slo_systems import (
    DEFAULT_SYSTEMS,
)

DEFAULT_RATES = (
    "20,30,40,50,65,80,100,125,150,200,250,300,350,400,450,500,600,700,800,900,1000,1200,1400,1600,1800,2000,2400,2800"
)


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
        "HTTP servers (Ray Serve's documented high-throughput mode); '-ha0': '-ha' with Ray's workers "
        "at niceness 0 (RAY_worker_niceness=0, as sloserve's embedded Ray runs its replicas)",
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
    p.add_argument(
        "--device-types",
        default="cpu,emul-slow",
        help="the device types of a sloserve-...-types system (models.<model>.device_types)",
    )
    p.add_argument(
        "--emulate",
        default="",
        help="TYPE=SCALE[,...]: serve from a copy of --repo whose model has a profile for TYPE derived "
        "from this host's CPU profile times SCALE (sloserve/loadtests/emulated.py); in-process replicas of TYPE "
        "then run the real CPU session and wait out that profile",
    )
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
        "records (out-*.bin, sloserve/loadtests/bench/gen.py's format)",
    )
    p.add_argument("--out")
    p.add_argument("--plot", help="PNG: attainment against rate, one line per system")
