"""``sloserve models build | check`` and ``sloserve profile``: the demo repository, the check of a
repository without serving it, and latency profiles."""

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

    c = msub.add_parser(
        "check",
        help="check a model repository without serving it: each config.json against its ONNX graphs "
        "(inputs, outputs, datatypes, shapes, max_batch_size) and every variant's file; exit 1 on any problem",
    )
    c.add_argument("repo", metavar="DIR", help="the model repository folder")
    c.set_defaults(func=_models_check)

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


def _models_check(args: argparse.Namespace) -> int:
    """The check the server runs on every model it loads (``models.repository.load_model_dir``), one
    line per model folder."""
    from pathlib import Path

    from models.repository import ModelRepository

    repo = ModelRepository(args.repo)
    try:
        results = repo.check()
    except FileNotFoundError as e:
        print(f"sloserve models check: {e}")
        return 2
    others = sorted(p.name for p in repo.root.iterdir() if p.is_dir() and p.name not in results)
    for name, problem in results.items():
        print(f"{name}: {'ok' if problem is None else 'FAIL: ' + problem}")
    for name in others:
        print(f"{name}: skipped (no {Path(name) / 'config.json'}, so not a model folder)")
    bad = sum(1 for p in results.values() if p is not None)
    if not results:
        print(f"sloserve models check: {repo.root} holds no <model>/config.json")
        return 2
    print(f"{len(results) - bad} of {len(results)} model(s) ok in {repo.root}")
    return 1 if bad else 0


def _profile(args: argparse.Namespace) -> int:
    from models.profiler import profile_repo
    from models.runtime import RuntimeOptions

    opts = RuntimeOptions(intra_op_threads=args.intra_op_threads, device=args.device)
    paths = profile_repo(args.repo, opts, iters=args.iters, warmup=args.warmup, models=args.model or None)
    for p in paths:
        print(f"wrote {p}")
    return 0
