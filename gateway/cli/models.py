"""``sloserve models build`` and ``sloserve profile``: the demo repository and its latency profiles."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("models", help="model repository tools")
    msub = m.add_subparsers(dest="mcmd", required=True)
    b = msub.add_parser("build", help="build the demo models (digits, heavy) locally, no downloads")
    b.add_argument("--repo", default="model_repository")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--profile-iters",
        type=int,
        default=30,
        help="also profile the built models with this many batches per size (0: skip)",
    )
    b.set_defaults(func=_models_build)

    pr = sub.add_parser("profile", help="measure latency per batch size of every (model, variant) on this device")
    pr.add_argument("--repo", default="model_repository")
    pr.add_argument("--model", action="append", help="only this model (repeatable)")
    pr.add_argument("--iters", type=int, default=100, help="timed batches per batch size")
    pr.add_argument("--warmup", type=int, default=10)
    pr.add_argument("--intra-op-threads", type=int, default=1)
    pr.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    pr.set_defaults(func=_profile)


def _models_build(args: argparse.Namespace) -> int:
    from models.build import build_demo

    print(f"building demo models into {args.repo} ...", flush=True)
    build_demo(args.repo, seed=args.seed)
    if args.profile_iters > 0:
        from models.profiler import profile_repo
        from models.runtime import RuntimeOptions

        print("profiling them on this machine (a prior; the SLO policy calibrates online) ...", flush=True)
        profile_repo(args.repo, RuntimeOptions(), iters=args.profile_iters, warmup=3)
    print("done", flush=True)
    return 0


def _profile(args: argparse.Namespace) -> int:
    from models.profiler import profile_repo
    from models.runtime import RuntimeOptions

    opts = RuntimeOptions(intra_op_threads=args.intra_op_threads, device=args.device)
    paths = profile_repo(args.repo, opts, iters=args.iters, warmup=args.warmup, models=args.model or None)
    for p in paths:
        print(f"wrote {p}")
    return 0
