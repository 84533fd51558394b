"""How soon a model loaded through one gateway worker is served by the others.

Starts ``sloserve serve --workers 2`` as ``make run`` would (the Ray backend, every default, free
ports). Each try unloads ``--model``, then opens ``--connections`` keep-alive connections (the kernel
gives each to either worker and it stays there) that ask the model for an inference every
``--every-ms``, and loads the model through a fresh connection. It records when the load answered and
when each connection got its first 200: ``spread_s`` is the time from the first connection served
(the worker that loaded it) to the last (every worker serves it); ``last_after_answer_s`` is the last
connection's first 200 less the load's answer (0 or less: every worker served it before the load
answered). The per-worker request counts from ``/metrics`` show that both workers answered.

    python -m sloserve.loadtests.bench.model_spread --tries 20 --out results/model_spread.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from sloserve.loadtests.bench.slo_systems import default_launch
from sloserve.loadtests.bench.systems import request_body
from sloserve.loadtests.promtext import samples


async def _try(args: argparse.Namespace, base: str, body: bytes) -> dict[str, Any]:
    json_ct = {"content-type": "application/json"}
    fresh = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=fresh, timeout=300) as s:
        r = await s.post(f"{base}/v2/repository/models/{args.model}/unload", content=b"{}", headers=json_ct)
        assert r.status_code == 200, r.text
    first: dict[int, float] = {}
    stop = asyncio.Event()
    start = time.monotonic()

    async def poll(i: int) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(limits=limits, timeout=30) as c:
            while not stop.is_set():
                try:
                    r = await c.post(f"{base}/v2/models/{args.model}/infer", content=body, headers=json_ct)
                    if r.status_code == 200 and i not in first:
                        first[i] = time.monotonic() - start
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(args.every_ms / 1e3)

    pollers = [asyncio.create_task(poll(i)) for i in range(args.connections)]
    await asyncio.sleep(0.5)  # every poller connected (and answered 404)
    t0 = time.monotonic() - start
    async with httpx.AsyncClient(limits=fresh, timeout=300) as s:
        r = await s.post(f"{base}/v2/repository/models/{args.model}/load", content=b"{}", headers=json_ct)
    answered = time.monotonic() - start
    deadline = time.monotonic() + 10.0
    while len(first) < args.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.gather(*pollers)
    served = sorted(first.values())
    return {
        "load_status": r.status_code,
        "load_s": round(answered - t0, 3),
        "connections_served": len(served),
        "spread_s": round(served[-1] - served[0], 3) if served else None,
        "last_after_answer_s": round(served[-1] - answered, 3) if served else None,
    }


def _per_worker(text: str, model: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for x in samples(text, "sloserve_requests_total", model=model, outcome="ok"):
        out[x.labels.get("worker", "0")] = out.get(x.labels.get("worker", "0"), 0.0) + x.value
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", default="model_repository")
    p.add_argument("--model", default="cnn")
    p.add_argument("--tries", type=int, default=20)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--every-ms", type=float, default=20.0)
    p.add_argument("--out")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="sloserve-spread-"))
    repo = Path(args.repo).resolve()
    launch = default_launch(repo, args.model, tmp, workers=2)
    body = request_body(repo, args.model)
    launch.start(tmp / "logs")
    tries = []
    try:
        launch.wait_ready(body)
        base = launch.infer_url.split("/v2/")[0]
        for i in range(args.tries):
            tries.append(asyncio.run(_try(args, base, body)))
            print(i, tries[-1], flush=True)
        per_worker = _per_worker(httpx.get(launch.metrics_url or "", timeout=10).text, args.model)
    finally:
        launch.stop()
    spreads = [t["spread_s"] for t in tries if t["spread_s"] is not None]
    after = [t["last_after_answer_s"] for t in tries if t["last_after_answer_s"] is not None]
    result = {
        "command": " ".join(
            ["python -m sloserve.loadtests.bench.model_spread", *(sys.argv[1:] if argv is None else argv)]
        ),
        "tries": tries,
        "loads_ok": sum(t["load_status"] == 200 for t in tries),
        "all_connections_served": sum(t["connections_served"] == args.connections for t in tries),
        "spread_s": {"p50": statistics.median(spreads), "max": max(spreads)} if spreads else None,
        "last_after_answer_s": {"p50": statistics.median(after), "max": max(after)} if after else None,
        "load_s": {"p50": statistics.median(t["load_s"] for t in tries), "max": max(t["load_s"] for t in tries)},
        "ok_per_worker": per_worker,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "tries"}, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
