"""Where a request's time goes on the way through the gateway: per-stage timestamps of slow requests.

Starts the gateway in this process with hooks on its stages, drives it with the open-loop generator
(Poisson arrivals, ``sloserve/loadtests/bench/gen.py``), and prints, per rate: the client's latency
percentiles, the server's stage percentiles (queue: arrival to dispatch; hand-off: the batch's round
trip less the replica's compute; compute; after: the batch's return to the request's answer), and
what the slow requests overlapped: a garbage collection, an event-loop stall, a poll of the Serve
controller. Each loop stall longer than ``--stall-stacks-ms`` (10 ms) also records the loop
thread's Python stack (``stall_stacks``): what it was running, when it ran Python that long.

    python -m sloserve.loadtests.bench.stage_probe --rates 20,200 --duration 30
    python -m sloserve.loadtests.bench.stage_probe --ray-transport grpc --status-poll 5   # the handle path, and
                                                                                 # serve.status() every 5 s

``--status-poll S`` adds a thread that calls ``serve.status()`` every S seconds, as the gateway's
replica poll did, to show what it costs the requests around it. Results: ``--out FILE`` (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import random
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[3]


class Stall(NamedTuple):
    """One event-loop stall: when the probe slept, how late it woke, and what the loop's thread did
    meanwhile (seconds on a CPU, seconds waiting on a run queue; the rest it was blocked)."""

    t: float
    late: float
    on_cpu: float
    run_queue: float


class Recorder:
    """Timestamps (``time.monotonic``) of requests, batches, collections, loop stalls and polls."""

    def __init__(self) -> None:
        self.requests: list[tuple[float, float, bool]] = []  # arrival, answered, ok
        self.batches: list[tuple[float, float, float, int]] = []  # dispatched, back, compute_s, rows
        self.gcs: list[tuple[float, float]] = []
        self.stalls: list[Stall] = []
        self.polls: list[tuple[float, float, str]] = []
        self.stacks: list[tuple[float, str]] = []  # (when, the loop thread's stack in a long stall)
        self.loop_alive_s = time.monotonic()  # the stall probe's last wake-up
        self._gc_t = 0.0

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t = time.monotonic()
        else:
            self.gcs.append((self._gc_t, time.monotonic() - self._gc_t))

    def clear(self) -> None:
        for xs in (self.requests, self.batches, self.gcs, self.stalls, self.polls, self.stacks):
            xs.clear()


def install(rec: Recorder) -> None:
    """Wrap the data plane's ``infer``, the backends' ``run`` and the Ray backend's controller reads."""
    from sloserve.gateway import dataplane
    from sloserve.gateway.backends import ray as ray_backend
    from sloserve.gateway.backends.threads import InProcessBackend

    infer = dataplane.DataPlane.infer

    async def timed_infer(self, req, on_shed=None):
        t = time.monotonic()
        ok = False
        try:
            out = await infer(self, req, on_shed)
            ok = True
            return out
        finally:
            rec.requests.append((req.arrival_s or t, time.monotonic(), ok))

    dataplane.DataPlane.infer = timed_infer
    for cls in (ray_backend.RayServeBackend, InProcessBackend):
        run = cls.run

        async def timed_run(self, model, variant, inputs, timeout_s=None, _run=run):
            t = time.monotonic()
            res = await _run(self, model, variant, inputs, timeout_s)
            rec.batches.append((t, time.monotonic(), res.compute_s, next(iter(inputs.values())).shape[0]))
            return res

        cls.run = timed_run
    read = ray_backend.RayServeBackend._read_details

    def timed_read(self, *a):
        t = time.monotonic()
        try:
            return read(self, *a)
        finally:
            rec.polls.append((t, time.monotonic() - t, "details"))

    ray_backend.RayServeBackend._read_details = timed_read
    gc.callbacks.append(rec.on_gc)


def _schedstat() -> tuple[float, float]:
    """This thread's time on a CPU and waiting on a run queue, in seconds (Linux; zeros elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            on_cpu, waiting, _ = f.read().split()
        return int(on_cpu) / 1e9, int(waiting) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


async def stall_probe(rec: Recorder, period_s: float = 0.001) -> None:
    """Records each time the loop comes back more than 2 ms late, split into what the loop's thread did
    meanwhile: ran (Python in the loop), waited for a CPU (run queue), or neither (blocked: the GIL, a
    system call). One read of the thread's counters per wake-up: each is the next sleep's start."""
    before = _schedstat()
    while True:
        t = time.monotonic()
        await asyncio.sleep(period_s)
        rec.loop_alive_s = now = time.monotonic()
        late = now - t - period_s
        after = _schedstat()
        if late > 0.002:
            rec.stalls.append(Stall(t, late, after[0] - before[0], after[1] - before[1]))
        before = after


def stack_watch(rec: Recorder, loop_tid: int, over_s: float, stop: threading.Event) -> None:
    """Once per long stall (the stall probe silent for ``over_s``), the loop thread's Python stack: what
    it runs when it runs Python for that long (a thread of its own takes the GIL at the switch interval)."""
    import traceback

    seen = 0.0
    while not stop.wait(over_s / 4):
        alive = rec.loop_alive_s
        if time.monotonic() - alive > over_s and alive != seen:
            seen = alive
            frame = sys._current_frames().get(loop_tid)
            if frame is not None:
                frames = traceback.extract_stack(frame)[-8:]
                rec.stacks.append(
                    (alive, " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames)))
                )


def status_poller(rec: Recorder, every_s: float, stop: threading.Event) -> None:
    from ray import serve

    while not stop.wait(every_s):
        t = time.monotonic()
        serve.status()
        rec.polls.append((t, time.monotonic() - t, "serve.status"))


def drive(port: int, model: str, variant: str, rate: float, dur: float, slo_ms: float, repo: Path) -> list[tuple]:
    from sloserve.loadtests.bench.gen import read_records
    from sloserve.loadtests.bench.systems import request_body

    rng = random.Random(int(rate))
    t, sched = 0.0, []
    while (t := t + rng.expovariate(rate)) < dur:
        sched.append(t)
    tmp = Path(tempfile.mkdtemp(prefix="stage-probe-"))
    (tmp / "body.json").write_bytes(request_body(repo, model))
    with open(tmp / "s.bin", "wb") as f:
        array("d", sched).tofile(f)
    spec = {
        "port": port,
        "path": f"/v2/models/{model}/infer",
        "body_file": str(tmp / "body.json"),
        "schedule_file": str(tmp / "s.bin"),
        "headers": {"x-variant": variant, "x-slo-ms": f"{slo_ms:g}"},
        "timeout_s": 3,
        "max_conns": 512,
        "variants": [],
    }
    (tmp / "spec.json").write_text(json.dumps(spec))
    subprocess.run(
        [sys.executable, "-m", "sloserve.loadtests.bench.gen", str(tmp / "spec.json"), str(tmp / "out.bin")],
        cwd=ROOT,
        check=True,
    )
    recs, _ = read_records(str(tmp / "out.bin"), len(sched))
    return recs


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1)] * 1e3, 2)


def report(rec: Recorder, recs: list[tuple], slow_ms: float) -> dict[str, Any]:
    client = [done - t for t, _s, done, status, _v in recs if 200 <= status < 300]
    t0 = min((a for a, _d, _ok in rec.requests), default=0.0)
    t_end = max((d for _a, d, _ok in rec.requests), default=math.inf)
    batches = sorted(rec.batches)
    starts = [b[0] for b in batches]
    import bisect

    stages: dict[str, list[float]] = {"queue": [], "handoff": [], "compute": [], "after": [], "server": []}
    slow = []
    for arrival, done, ok in rec.requests:
        if not ok:
            continue
        i = bisect.bisect_right(starts, done) - 1  # the batch that answered it: the last one back by then
        while i >= 0 and not (batches[i][1] <= done + 1e-9 and batches[i][0] >= arrival - 1e-6):
            i -= 1
        if i < 0:
            continue
        d, back, compute, _ = batches[i]
        row = {
            "queue": d - arrival,
            "handoff": back - d - compute,
            "compute": compute,
            "after": done - back,
            "server": done - arrival,
        }
        for k, v in row.items():
            stages[k].append(v)
        if row["server"] * 1e3 > slow_ms:

            def near(spans, done=done, arrival=arrival):
                return [round(x * 1e3, 1) for t, x, *_ in spans if t < done and t + x > arrival]

            slow.append(
                {
                    "at_s": round(arrival, 3),
                    **{k: round(v * 1e3, 2) for k, v in row.items()},
                    "gc_ms": near(rec.gcs),
                    "loop_stall_ms": near(rec.stalls),
                    "controller_poll_ms": near(rec.polls),
                }
            )
    causes = {"gc": 0, "loop_stall": 0, "controller_poll": 0, "none_of_these": 0}
    for s in slow:
        hit = False
        for k in ("gc", "loop_stall", "controller_poll"):
            if s[f"{k}_ms"]:
                causes[k] += 1
                hit = True
        causes["none_of_these"] += not hit
    return {
        "client_ms": {q: pct(client, p) for q, p in (("p50", 50), ("p99", 99), ("p99.9", 99.9), ("max", 100))},
        "answered": len(client),
        "sent": len(recs),
        "server_stages_ms": {
            k: {"p50": pct(v, 50), "p99": pct(v, 99), "p99.9": pct(v, 99.9)} for k, v in stages.items()
        },
        "slow_over_ms": slow_ms,
        "slow": len(slow),
        "slow_overlapping": causes,
        "polls_ms": [round(x * 1e3, 1) for _t, x, _k in rec.polls][:20],
        "gc_over_2ms": [round(x * 1e3, 1) for _t, x in rec.gcs if x > 0.002],
        "loop_stalls": _stall_split(rec.stalls, t0),
        # up to the last answer: not the probe's own report, computed on the loop after the run
        "stall_stacks": [{"at_s": round(t - t0, 2), "stack": st} for t, st in rec.stacks if t <= t_end][:10],
        "slow_examples": slow[:15],
    }


def _stall_split(stalls: list[Stall], t0: float = 0.0) -> dict[str, Any]:
    """The loop's stalls: how many, their total, and the share of that time the loop's thread spent
    on a CPU, waiting for one, or blocked; the worst with when they began (``at_s``, from ``t0``)."""
    total = sum(s.late for s in stalls)
    on_cpu = sum(min(s.on_cpu, s.late) for s in stalls)
    runq = sum(min(s.run_queue, s.late) for s in stalls)
    return {
        "count": len(stalls),
        "total_ms": round(total * 1e3, 1),
        "share_on_cpu": round(on_cpu / total, 2) if total else None,
        "share_run_queue": round(runq / total, 2) if total else None,
        "share_blocked": round(max(0.0, total - on_cpu - runq) / total, 2) if total else None,
        "worst_ms": [
            {
                "ms": round(s.late * 1e3, 1),
                "on_cpu": round(s.on_cpu * 1e3, 1),
                "run_queue": round(s.run_queue * 1e3, 1),
                "at_s": round(s.t - t0, 2),
            }
            for s in sorted(stalls, key=lambda s: -s.late)[:8]
        ],
    }


PRINTED = ("client_ms", "server_stages_ms", "slow", "slow_overlapping", "polls_ms", "loop_stalls", "stall_stacks")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from sloserve.gateway.config import load_settings
    from sloserve.gateway.server import Gateway

    rec = Recorder()
    install(rec)
    settings = load_settings(
        args.config, repo=args.repo, backend=args.backend, http_port=0, grpc_port=0, ray_transport=args.ray_transport
    )
    gw = Gateway(settings)
    await gw.start()
    probe = asyncio.get_running_loop().create_task(stall_probe(rec))
    stop = threading.Event()
    if args.stall_stacks_ms:
        threading.Thread(
            target=stack_watch, args=(rec, threading.get_ident(), args.stall_stacks_ms / 1e3, stop), daemon=True
        ).start()
    if args.status_poll:
        threading.Thread(target=status_poller, args=(rec, args.status_poll, stop), daemon=True).start()
    out: dict[str, Any] = {"setup": {k: v for k, v in vars(args).items() if k != "func"}, "rates": {}}
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(
            None, drive, gw.http_port, args.model, args.variant, 100.0, 3.0, 1000.0, Path(args.repo)
        )  # warm-up
        for rate in args.rates:
            rec.clear()
            recs = await loop.run_in_executor(
                None, drive, gw.http_port, args.model, args.variant, rate, args.duration, args.slo_ms, Path(args.repo)
            )
            out["rates"][str(rate)] = r = report(rec, recs, args.slow_ms)
            print(
                json.dumps(
                    {
                        "rate": rate,
                        **{k: r[k] for k in PRINTED},
                    }
                ),
                flush=True,
            )
    finally:
        stop.set()
        probe.cancel()
        await gw.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sloserve.loadtests.bench.stage_probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--repo", default="model_repository")
    p.add_argument("--config", help="a sloserve config file (default: none, as `make run`)")
    p.add_argument("--backend", default="ray", choices=("ray", "inprocess"))
    p.add_argument("--ray-transport", default="direct", choices=("direct", "grpc", "object_ref"))
    p.add_argument("--model", default="heavy")
    p.add_argument("--variant", default="large")
    p.add_argument("--slo-ms", type=float, default=20.0)
    p.add_argument("--rates", default="20,200", type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--slow-ms", type=float, default=12.0, help="a request slower than this, server side, is listed")
    p.add_argument(
        "--stall-stacks-ms",
        type=float,
        default=10.0,
        help="record the event loop thread's stack once in every stall longer than this (0: off)",
    )
    p.add_argument("--status-poll", type=float, default=0.0, help="call serve.status() every this many seconds")
    p.add_argument("--out")
    args = p.parse_args(argv)
    if args.duration > 300 or min(args.rates) <= 0 or args.stall_stacks_ms < 0:
        raise SystemExit("--duration <= 300 s, positive --rates and --stall-stacks-ms >= 0")
    out = asyncio.run(main_async(args))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
