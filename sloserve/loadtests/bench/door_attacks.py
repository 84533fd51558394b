"""Each hostile client of ``sloserve.loadtests.flood`` against two checkouts of the gateway, one attack at a time.

For every attack and every tree (interleaved: attack 1 on each tree, then attack 2, ...), starts a
fresh gateway from that tree exactly as ``sloserve serve --repo REPO --backend inprocess`` (digits
only, every other setting at its default, free ports), runs ``python -m sloserve.loadtests.flood`` against it
(ordinary clients before, during and after the attack; the gateway's memory sampled), and stops it.
Records per attack and tree: the attackers' outcomes, the ordinary clients' p99 in each phase and
their errors, the gateway's peak memory, and the generator's CPU.

    python -m sloserve.loadtests.bench.door_attacks --tree before=/path/to/old/checkout --tree now=. \\
        --seconds 10 --out docs/data/door/attacks.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from sloserve.loadtests.bench.systems import free_ports
from sloserve.loadtests.flood import ATTACKS


def _start(tree: Path, repo: Path, log: Path) -> tuple[subprocess.Popen, int, int]:
    http, grpc = free_ports(2)
    cmd = [sys.executable, "-m", "sloserve.cli", "serve", "--repo", str(repo), "--backend", "inprocess"]
    cmd += ["--http-port", str(http), "--grpc-port", str(grpc)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with log.open("w") as f:
        p = subprocess.Popen(cmd, cwd=tree, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return p, http, grpc
        except OSError:
            pass
        if p.poll() is not None:
            break
        time.sleep(0.3)
    p.kill()
    raise RuntimeError(f"the gateway of {tree} did not become ready:\n{log.read_text()[-2000:]}")


def _summary(flood: dict[str, Any]) -> dict[str, Any]:
    def phase(name: str) -> dict[str, Any]:
        ph = flood.get(name) or {}
        return {k: ph.get(k) for k in ("sent", "status", "ok_p50_ms", "ok_p99_ms", "ok_max_ms")}

    return {
        "attacks": flood.get("attacks"),
        "hung": flood.get("hung"),
        "ordinary": {name: phase(name) for name in ("before", "flood", "after")},
        "memory": flood.get("memory"),
        "attackers_cpu_s": flood.get("attackers_cpu_s"),
        "ordinary_clients_cpu_s": flood.get("ordinary_clients_cpu_s"),
        **({"idle_connections": flood["idle_connections"]} if "idle_connections" in flood else {}),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", action="append", required=True, help="LABEL=PATH of a checkout (repeat)")
    p.add_argument("--repo", default="model_repository")
    p.add_argument("--attacks", default=",".join(ATTACKS))
    p.add_argument("--seconds", type=float, default=10.0, help="each phase's length")
    p.add_argument("--rate", type=float, default=100.0, help="ordinary requests per second")
    p.add_argument("--attacker-source", default=None, help="passed to sloserve.loadtests.flood")
    p.add_argument("--out")
    args = p.parse_args(argv)
    trees = {t.split("=", 1)[0]: Path(t.split("=", 1)[1]).resolve() for t in args.tree}
    tmp = Path(tempfile.mkdtemp(prefix="sloserve-door-"))
    repo = tmp / "repo"
    shutil.copytree(Path(args.repo) / "digits", repo / "digits")
    results: dict[str, dict[str, Any]] = {}
    for attack in [a for a in args.attacks.split(",") if a]:
        for label, tree in trees.items():
            server, http, grpc = _start(tree, repo, tmp / f"{label}-{attack}.log")
            out = tmp / f"{label}-{attack}.json"
            flood = [sys.executable, "-m", "sloserve.loadtests.flood", "--url", f"http://127.0.0.1:{http}"]
            flood += ["--grpc", f"127.0.0.1:{grpc}", "--pid", str(server.pid), "--attacks", attack]
            flood += ["--seconds", str(args.seconds), "--rate", str(args.rate), "--out", str(out)]
            flood += ["--attacker-source", args.attacker_source] if args.attacker_source else []
            try:
                subprocess.run(flood, timeout=args.seconds * 3 + 200, capture_output=True)
                got = _summary(json.loads(out.read_text())) if out.exists() else {"error": "no result"}
            except subprocess.TimeoutExpired:
                got = {"error": "the flood run did not end"}
            got["server_alive"] = server.poll() is None
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
            results.setdefault(attack, {})[label] = got
            o = got.get("ordinary", {})
            print(attack, label, got.get("attacks"), {k: v.get("ok_p99_ms") for k, v in o.items()}, flush=True)
    doc = {
        "command": " ".join(
            ["python -m sloserve.loadtests.bench.door_attacks", *(sys.argv[1:] if argv is None else argv)]
        ),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "results": results,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
