"""The systems the open-loop benchmark starts: sloserve as make run starts it (or with a policy, a backend, a pinned variant), and each peer in a named configuration; the peers' tuning pass."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from sloserve.loadtests.bench.otlp_sink import tracing_env
from sloserve.loadtests.bench.systems import (
    BatchingKnobs,
    Launch,
    from_tree,
    make_launch,
    split_tree,
)

POLICIES = ("slo", "timeout", "fixed", "aimd", "nexus")


PEERS_TUNED = ("triton", "rayserve", "mlserver")


PEER_CONFIG = re.compile(r"(triton|mlserver)-\d+(\.\d+)?x\d+|rayserve-\d+(\.\d+)?x\d+(-opt|-ha0?)?")


DEFAULT_SYSTEMS = "sloserve-default,sloserve-default-inprocess,triton,rayserve,mlserver"


# ---- systems --------------------------------------------------------------------------------------
def policy_batching(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    b: dict[str, Any] = {"policy": policy, "max_batch_size": args.max_batch_size}
    if policy == "timeout":
        b["max_wait_ms"] = args.max_wait_ms
    elif policy == "fixed":
        b["max_queue_delay_ms"] = args.max_wait_ms
    elif policy in ("aimd", "nexus"):
        b["slo_ms"] = args.slo_ms
    return b | json.loads(args.sloserve_batching or "{}")


def launch_for(system: str, args: argparse.Namespace, repo: Path, tmp: Path) -> tuple[Launch, dict[str, str], str]:
    """(launch, generator headers, variant served by a peer or pinned); ``<system>:LABEL`` runs a sloserve
    system from the checkout given as ``--tree LABEL=PATH``."""
    base, tree = split_tree(system, args._trees)
    launch, hdrs, pin = _launch_for(base, args, repo, tmp)
    launch = from_tree(launch, tree)
    launch.system = system
    return launch, hdrs, pin


def _launch_for(system: str, args: argparse.Namespace, repo: Path, tmp: Path) -> tuple[Launch, dict[str, str], str]:
    if system.startswith("sloserve"):
        name, _, pin = system.partition("@")
        hdrs = {"x-slo-ms": f"{args.slo_ms:g}"}
        pin = pin or args.variant
        default = re.fullmatch(r"sloserve-default(-inprocess)?(?:-w(\d+))?(?:-trace(\d+(?:\.\d+)?))?", name)
        if default:  # `make run`: no config, every default (-wN: with --workers N; -traceP: tracing P% of requests)
            workers = int(default.group(2)) if default.group(2) else None
            launch = default_launch(repo, args.model, tmp, inprocess=bool(default.group(1)), workers=workers)
            if default.group(3):
                launch.env.update(tracing_env(float(default.group(3))))
        else:
            parts = name.split("-")
            backend = "ray" if "ray" in parts[1:] else "inprocess"
            policy = parts[-1] if parts[-1] in POLICIES else "slo"
            cfg = tmp / f"{system.replace('@', '_')}.json"
            model_cfg = {"slo_ms": args.slo_ms, "batching": policy_batching(policy, args)}
            if "shared" in parts[1:]:  # sloserve-shared-<policy>: every replica holds every variant
                model_cfg["shared_replicas"] = True
            if "types" in parts[1:]:  # sloserve-...-types: replicas on every --device-types type, a pair per batch
                model_cfg["device_types"] = [d.strip() for d in args.device_types.split(",") if d.strip()]
            cfg.write_text(json.dumps({"models": {args.model: model_cfg}}))
            knobs = BatchingKnobs(sloserve_config=str(cfg), sloserve_backend=backend)
            launch = make_launch("sloserve", repo, args.model, args.variant, knobs, tmp)
        launch.system = system
        # the readiness probe carries the warm-up budget: at the benchmark's SLO a cold start can be refused
        launch.headers = {"x-slo-ms": f"{args.warmup_slo_ms:g}"}
        pin, _, device = pin.partition("+")  # @VARIANT+TYPE pins a (variant, device type) pair
        if device:
            launch.headers["x-device-type"] = device
            hdrs["x-device-type"] = device
        if pin != "any":
            launch.headers["x-variant"] = pin
            hdrs["x-variant"] = pin
        return launch, hdrs, pin
    peer, _, conf = system.partition("-")
    knobs = BatchingKnobs(
        max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms, triton_metrics=args.triton_metrics
    )
    if conf:  # <wait ms>x<instances | replicas | workers>[-opt]
        head, _, flag = conf.partition("-")
        wait, _, count = head.partition("x")
        knobs.max_wait_ms = float(wait)
        if peer == "triton":
            knobs.triton_instances = int(count or 1)
        elif peer == "rayserve":
            knobs.rayserve_replicas = int(count or 1)
            knobs.rayserve_mode = flag
        elif peer == "mlserver":
            knobs.mlserver_workers = int(count or 1)
    launch = make_launch(peer, repo, args.model, args.variant, knobs, tmp)
    launch.system = system
    return launch, {}, args.variant


def default_launch(repo: Path, model: str, tmp: Path, inprocess: bool = False, workers: int | None = None) -> Launch:
    """``sloserve serve --repo REPO`` on free ports: the Makefile's ``make run`` line, nothing else set
    (``inprocess``: with ``--backend inprocess``, replicas in the gateway's process; ``workers``: with
    ``--workers N``, N gateway processes sharing the ports)."""
    from sloserve.loadtests.bench.systems import _with_tmp, free_ports

    http, grpc = free_ports(2)
    exe = Path(sys.executable).with_name("sloserve")
    argv = [str(exe), "serve", "--repo", str(repo), "--http-port", str(http), "--grpc-port", str(grpc)]
    argv += ["--backend", "inprocess"] if inprocess else []
    argv += ["--workers", str(workers)] if workers else []
    return _with_tmp(
        Launch(
            "sloserve-default",
            argv,
            f"http://127.0.0.1:{http}/v2/models/{model}/infer",
            f"http://127.0.0.1:{http}/metrics",
            grace_s=15.0,
        ),
        tmp,
    )


def tune_peers(systems: list[str], args: argparse.Namespace, one, results: dict) -> tuple[list[str], dict]:
    """The tuning pass of each peer named without a configuration: every configuration of
    ``--<peer>-configs`` once (no light-load step); the one with the highest rate at target takes the
    peer's place in the rounds. Returns the systems of the rounds and what the pass found."""
    tuning: dict[str, Any] = {}
    for peer in PEERS_TUNED:
        if peer not in systems:
            continue
        configs = [c.strip() for c in getattr(args, f"{peer}_configs").split(",") if c.strip()]
        tres = {f"{peer}-{c}": one(f"{peer}-{c}", 0, light=False) for c in configs}
        ok = {k: v for k, v in tres.items() if "error" not in v}
        best = (
            max(
                ok,
                key=lambda k: (ok[k]["max_rate_at_target"], max((s["goodput_rps"] for s in ok[k]["steps"]), default=0)),
            )
            if ok
            else None
        )
        tuning[peer] = {
            "runs": tres,
            "best": best,
            "max_rate_at_target": {k: v.get("max_rate_at_target") for k, v in tres.items()},
            "errors": {k: v["error"] for k, v in tres.items() if "error" in v},
        }
        print(f"{peer} tuning: {tuning[peer]['max_rate_at_target']} -> {best}", file=sys.stderr, flush=True)
        systems = [s for s in systems if s != peer] if best is None else [best if s == peer else s for s in systems]
        if best is None:
            results[peer] = [
                {
                    "system": peer,
                    "error": f"every {peer} configuration failed: " + json.dumps(tuning[peer]["errors"])[:3000],
                }
            ]
    return systems, tuning
