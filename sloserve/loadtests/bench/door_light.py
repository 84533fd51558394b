"""How often the event-loop door refuses a light load on a busy host.

The in-process gateway refuses requests at the door while its event loop lags past
``loop_lag_shed_ms`` (docs/configuration.md). On a host where another program holds a core, a lightly
loaded loop runs late too, waiting for a core rather than working through a backlog. This starts
``sloserve serve --backend inprocess`` (from one or more source trees, interleaved round by round), sends it a
light open-loop load (``sloserve.loadtests.openloop``) while ``--hogs`` busy-looping processes run beside it,
and reports each run's share of requests refused with 503, the answers' p50/p99 and the cores the
load generator itself used:

    python -m sloserve.loadtests.bench.door_light --tree . --tree /path/to/other/checkout \\
        --rate 100 --duration 20 --rounds 3 --hogs 1 --out door-light.json
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(url: str, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


def one_run(tree: Path, repo: Path, model: str, rate: float, duration: float, hogs: int) -> dict:
    """One server started from source tree ``tree`` (``python -m sloserve.cli serve`` run in it, so its
    own modules come first), a light load against it with ``hogs`` busy processes beside it."""
    http, grpc = _port(), _port()
    url = f"http://127.0.0.1:{http}"
    cmd = [sys.executable, "-m", "sloserve.cli", "serve", "--backend", "inprocess", "--repo", str(repo)]
    server = subprocess.Popen(
        [*cmd, "--http-port", str(http), "--grpc-port", str(grpc)],
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    hog_procs: list[subprocess.Popen] = []
    try:
        _ready(url, 120)
        hog_procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(hogs)]
        time.sleep(1.0)
        gen = [sys.executable, "-m", "sloserve.loadtests.openloop", "--url", url, "--model", model]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            [*gen, "--rate", str(rate), "--duration", str(duration)],
            capture_output=True,
            text=True,
            check=True,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the generator: the one child waited for here
        summary = json.loads(done.stdout)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        summary["generator_cores"] = round(cpu / max(summary.get("duration_s") or duration, 1e-9), 3)
    finally:
        for p in hog_procs:
            p.kill()
            p.wait()
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", type=Path, required=True, help="a source tree to serve (repeatable)")
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="digits")
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hogs", type=int, default=1, help="busy-looping processes beside the server")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    runs = []
    for r in range(a.rounds):
        order = a.tree if r % 2 == 0 else a.tree[::-1]  # interleaved: A B, then B A
        for tree in order:
            s = one_run(tree, a.repo.resolve(), a.model, a.rate, a.duration, a.hogs)
            st = s.get("status", {})
            sent = sum(st.values()) or 1
            row = {"round": r, "tree": str(tree), "refused_503": round(st.get("503", 0) / sent, 4), "summary": s}
            print(
                json.dumps(
                    {k: row[k] for k in ("round", "tree", "refused_503")}
                    | {"p99_ms": s.get("ok_p99_ms"), "gen_cores": s.get("generator_cores")}
                ),
                flush=True,
            )
            runs.append(row)
    doc = {"args": {k: str(v) for k, v in vars(a).items()}, "runs": runs}
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
