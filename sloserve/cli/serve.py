"""``sloserve serve``: the gateway (KServe V2 over REST and gRPC) on the model repository."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sloserve.gateway.config import Settings


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="serve the model repository over KServe V2 REST and gRPC")
    s.add_argument("--config", help="settings file (.yaml, .toml or .json)")
    s.add_argument("--repo", help="model repository (default: model_repository)")
    s.add_argument("--host", help="bind address (default 127.0.0.1)")
    s.add_argument("--http-port", type=int, help="REST port (default 8000)")
    s.add_argument("--grpc-port", type=int, help="gRPC port (default 8001)")
    s.add_argument("--backend", choices=["ray", "inprocess"], help="replicas on Ray Serve (default) or in-process")
    s.add_argument("--ray-address", help="join an existing Ray cluster: auto | ray://host:port")
    s.add_argument("--instances", type=int, help="replicas per (model, variant)")
    s.add_argument(
        "--workers",
        type=int,
        help="gateway processes sharing the ports (default: half the cores, at most 8; 1 on 2 cores)",
    )
    s.add_argument("--intra-op-threads", type=int, help="ONNX Runtime threads per replica")
    s.add_argument("--device", choices=["auto", "cpu", "cuda"], help="execution provider")
    s.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=_serve)


def settings_from_args(args: argparse.Namespace, config: str | Path | None) -> Settings:
    """The settings `sloserve serve` runs with: ``config`` (a file, or None) under the command line's
    overrides (each None when not given)."""
    from sloserve.gateway.config import load_settings

    return load_settings(
        config,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        repo=args.repo,
        backend=args.backend,
        ray_address=args.ray_address,
        instances=args.instances,
        workers=getattr(args, "workers", None),
        intra_op_threads=args.intra_op_threads,
        device=args.device,
        log_level=args.log_level,
    )


def _serve(args: argparse.Namespace) -> int:
    from sloserve.gateway import earlystop

    earlystop.hold()  # a stop asked for from here on is honoured, however long start-up takes
    from sloserve.gateway.config import ConfigError
    from sloserve.gateway.config_tracing import TracingConfigError, resolve

    try:
        settings = settings_from_args(args, args.config)
        resolve(settings.tracing, os.environ)  # an OTEL_* variable it cannot use stops start-up here, named
    except (ConfigError, TracingConfigError) as e:
        print(f"sloserve: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from sloserve.gateway.workers import run_workers, workers_of

    if workers_of(settings) > 1:  # a supervisor of N gateway processes (sloserve/gateway/workers.py)
        return run_workers(settings, workers_of(settings))
    # A crash in native code (gRPC, Ray's core worker, ONNX Runtime) prints every thread's Python stack
    # to stderr before the process dies, instead of a bare exit -11.
    faulthandler.enable(all_threads=True)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    from sloserve.gateway.server import serve

    try:
        asyncio.run(serve(settings))
    except FileNotFoundError as e:
        print(f"sloserve: {e}", file=sys.stderr)
        return 2
    # A clean stop has released everything: replicas and worker processes, Ray (ray.shutdown completed:
    # the embedded one stopped, or the driver disconnected from a joined cluster), the sockets. Skip the
    # interpreter's own teardown: the destructors of native extensions can crash it there (exit -11 after
    # Ray's driver logged "Driver shutdown complete"), which turns a graceful SIGTERM into a crash for a
    # supervisor. Only this path exits so; errors propagate.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the reader has gone: nothing left to tell it
            pass
    os._exit(0)
