"""A gateway worker killed mid-load: what its clients see, and how soon its replica slots go back.

Starts ``sloserve serve --workers 2`` as ``make run`` would (the Ray backend, every default, free
ports), drives it with ``--concurrency`` clients for ``--seconds`` (each request on a new connection,
so the kernel spreads them over both workers), and SIGKILLs worker 1 at ``--kill-at``. Every request
ends as an answer (its HTTP status), an explicit error (the connection closed or reset), or silence
(no answer within ``--timeout``: lost). Meanwhile ``/metrics`` is read every 0.1 s: the slots worker 0
holds on the pinned variant (``sloserve_batch_slots``) before the kill, and how long after it worker 0
holds every slot of the replicas (the dead worker's lease back).

    python -m sloserve.loadtests.bench.gateway_kill --out results/gateway_kill.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from sloserve.loadtests.bench.slo_systems import default_launch
from sloserve.loadtests.bench.systems import request_body
from sloserve.loadtests.promtext import samples


def _slots(text: str, model: str, variant: str) -> dict[str, float]:
    return {
        s.labels.get("worker", "0"): s.value
        for s in samples(text, "sloserve_batch_slots", model=model, variant=variant)
    }


async def _drive(args: argparse.Namespace, url: str, metrics_url: str, body: bytes, victim: int) -> dict[str, Any]:
    outcomes: collections.Counter = collections.Counter()
    latencies: list[float] = []
    slots: list[tuple[float, dict[str, float]]] = []
    start = time.monotonic()
    end = start + args.seconds
    killed_at: list[float] = []
    headers = {"content-type": "application/json", "x-variant": args.variant}
    # no keep-alive: every request on a new connection, which the kernel gives to either worker
    limits = httpx.Limits(max_keepalive_connections=0)

    async with httpx.AsyncClient(limits=limits, timeout=args.timeout) as s:

        async def client() -> None:
            while time.monotonic() < end:
                t0 = time.monotonic()
                try:
                    r = await s.post(url, content=body, headers=headers)
                    outcomes[r.status_code] += 1
                    if r.status_code == 200:
                        latencies.append(time.monotonic() - t0)
                except httpx.TimeoutException:
                    outcomes["lost (no answer)"] += 1
                except httpx.TransportError as e:
                    outcomes[f"error: {type(e).__name__}"] += 1

        async def watch() -> None:
            while time.monotonic() < end + 3.0:
                try:
                    r = await s.get(metrics_url)
                    slots.append((time.monotonic() - start, _slots(r.text, args.model, args.variant)))
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)

        async def kill() -> None:
            await asyncio.sleep(args.kill_at)
            os.kill(victim, signal.SIGKILL)
            killed_at.append(time.monotonic() - start)

        await asyncio.gather(watch(), kill(), *(client() for _ in range(args.concurrency)))
    kill_t = killed_at[0]
    before = [w for t, w in slots if t < kill_t and "0" in w]
    held_before = before[-1]["0"] if before else None
    total = max((sum(w.values()) for t, w in slots if t < kill_t), default=None)
    back = next((t - kill_t for t, w in slots if t > kill_t and total and w.get("0", 0) >= total), None)
    return {
        "outcomes": dict(outcomes),
        "lost": outcomes["lost (no answer)"],
        "ok_p50_ms": round(statistics.median(latencies) * 1e3, 2) if latencies else None,
        "killed_at_s": round(kill_t, 2),
        "worker0_slots_before": held_before,
        "all_slots": total,
        "worker0_holds_all_after_s": None if back is None else round(back, 2),
        # each change of the workers' slots, seconds from the start
        "slots_timeline": [(round(t, 2), w) for i, (t, w) in enumerate(slots) if i == 0 or w != slots[i - 1][1]],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", default="model_repository")
    p.add_argument("--model", default="digits")
    p.add_argument("--variant", default="small")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--kill-at", type=float, default=4.0)
    p.add_argument("--timeout", type=float, default=10.0, help="a request unanswered this long is lost")
    p.add_argument("--out")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="sloserve-kill-"))
    repo = Path(args.repo).resolve()
    launch = default_launch(repo, args.model, tmp, workers=2)
    body = request_body(repo, args.model)
    launch.start(tmp / "logs")
    try:
        launch.headers = {"x-variant": args.variant}
        launch.wait_ready(body)
        time.sleep(2.0)  # both workers have renewed their leases
        kids = [c for c in psutil.Process(launch.pid).children() if "spawn_main" in " ".join(c.cmdline())]
        victim = max(kids, key=lambda c: c.create_time()).pid
        result = asyncio.run(_drive(args, launch.infer_url, launch.metrics_url or "", body, victim))
    finally:
        launch.stop()
    result["command"] = " ".join(
        ["python -m sloserve.loadtests.bench.gateway_kill", *(sys.argv[1:] if argv is None else argv)]
    )
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
