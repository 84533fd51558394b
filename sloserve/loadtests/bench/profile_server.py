"""Where a server's CPU goes under closed-loop load: start it, drive it with wrk, sample it with
py-spy (``.venv/bin/pip install py-spy``), and split the samples into categories.

    .venv/bin/python -m sloserve.loadtests.bench.profile_server --system sloserve --model digits --variant small \
        --concurrency 32 --seconds 15 --out results/profile-sloserve-digits-small

Writes <out>.raw (collapsed stacks; open with speedscope or flamegraph.pl), <out>.json (category
split, with CPU ms per request from psutil), and prints the split. py-spy samples in non-blocking
mode so it perturbs the server little; the categories are matched on the innermost frame that
names one (see CATEGORIES)."""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from sloserve.loadtests.bench.closed import run_wrk, write_lua
from sloserve.loadtests.bench.procstat import CpuWindow
from sloserve.loadtests.bench.systems import (
    BatchingKnobs,
    default_tmp,
    make_launch,
    prioritise,
    request_body,
)

# (category, substrings of a frame "function (file:line)"); the innermost matching frame decides.
CATEGORIES = [
    ("ORT compute (session.run)", ("onnxruntime/capi", "sloserve/replica/runtime.py")),
    ("JSON encode response (encode_rest, orjson.dumps)", ("encode_rest", "raw_bytes")),
    (
        "JSON decode + numpy (decode_rest, array_from_json)",
        ("decode_rest", "array_from_json", "parse_params", "_params_from_headers", "shape_of"),
    ),
    ("metrics (prometheus_client)", ("prometheus_client", "sloserve/gateway/metrics.py")),
    ("batching (queue, policy, concat/split)", ("sloserve/batching/",)),
    ("dataplane (validate, variants, response object)", ("sloserve/gateway/dataplane.py", "sloserve/gateway/types.py")),
    ("REST handler (read body, headers, Response)", ("sloserve/gateway/transports/rest.py",)),
    ("FastAPI/Starlette (routing, middleware, Request/Response)", ("fastapi/", "starlette/")),
    ("uvicorn HTTP protocol (httptools parsing, transport)", ("uvicorn/", "httptools")),
    ("asyncio / uvloop event loop", ("asyncio/", "uvloop", "selectors.py")),
]


def categorise(stack: str) -> str:
    frames = stack.split(";")
    for fr in reversed(frames):
        for name, keys in CATEGORIES:
            if any(k in fr for k in keys):
                return name
    return "other"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", default="sloserve")
    p.add_argument("--model", default="digits")
    p.add_argument("--variant", default="small")
    p.add_argument("--repo", default="model_repository")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--nice", type=int, default=0)
    p.add_argument("--out", default="results/profile")
    args = p.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    repo = Path(args.repo)
    tmp = default_tmp()
    launch = make_launch(args.system, repo, args.model, args.variant, BatchingKnobs(), tmp)
    body = request_body(repo, args.model)
    (tmp / "body.json").write_bytes(body)
    lua = tmp / "p.lua"
    write_lua(lua, tmp / "body.json", launch.headers)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    launch.start(tmp / "logs", args.nice)
    try:
        launch.wait_ready(body)
        run_wrk(launch.infer_url, lua, args.concurrency, 3, 1, args.nice)
        wrk = subprocess.Popen(
            [
                shutil.which("wrk"),
                "-t1",
                f"-c{args.concurrency}",
                f"-d{int(args.seconds + 4)}s",
                "-s",
                str(lua),
                launch.infer_url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=bool(args.nice),
            preexec_fn=prioritise(args.nice),
        )
        time.sleep(1.0)
        win = CpuWindow(launch.pid)
        win.start()
        t0 = time.monotonic()
        subprocess.run(
            [
                spy,
                "record",
                "--pid",
                str(launch.pid),
                "--duration",
                str(int(args.seconds)),
                "--rate",
                str(args.rate),
                "--nonblocking",
                "--format",
                "raw",
                "--threads",
                "-o",
                str(out.with_suffix(".raw")),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        server_s, _, _ = win.stop()
        secs = time.monotonic() - t0
        text = wrk.communicate()[0].decode(errors="replace")
    finally:
        launch.stop()
    reqs = None
    for line in text.splitlines():
        if "Requests/sec" in line:
            reqs = float(line.split()[-1])
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in out.with_suffix(".raw").read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        counts[categorise(stack)] += int(n)
        total += int(n)
    cpu_ms_req = server_s * 1e3 / (reqs * secs) if reqs else None
    split = {k: round(v / total, 4) for k, v in counts.most_common()}
    res = {
        "system": args.system,
        "model": args.model,
        "variant": args.variant,
        "rps": reqs,
        "server_cpu_ms_per_req": round(cpu_ms_req, 4) if cpu_ms_req else None,
        "server_cores": round(server_s / secs, 3),
        "samples": total,
        "share": split,
        "ms_per_req": {k: round(v * cpu_ms_req, 4) for k, v in split.items()} if cpu_ms_req else None,
    }
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
