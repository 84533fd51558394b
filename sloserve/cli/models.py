"""``sloserve models build | check | variants`` and ``sloserve profile``: the demo repository, the check
of a repository without serving it, measured accuracy variants of a user's model, and latency profiles."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("models", help="model repository tools")
    msub = m.add_subparsers(dest="mcmd", required=True)
    b = msub.add_parser("build", help="build the demo models (digits, heavy, cnn) locally, no downloads")
    b.add_argument("--repo", default="model_repository")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--models",
        default="digits,heavy,cnn",
        help="which demo models to build, comma-separated (default: all three)",
    )
    b.add_argument(
        "--profile-iters",
        type=int,
        default=30,
        help="also profile the built models with this many batches per size (0: skip)",
    )
    b.set_defaults(func=_models_build)

    c = msub.add_parser(
        "check",
        help="check a model repository without serving it: each config.json (or Triton config.pbtxt) against its "
        "ONNX graphs (inputs, outputs, datatypes, shapes, max_batch_size) and every variant's (version's) file; "
        "exit 1 on any problem",
    )
    c.add_argument("repo", metavar="DIR", help="the model repository folder")
    c.set_defaults(func=_models_check)

    v = msub.add_parser(
        "variants",
        help="turn one ONNX model and a labelled validation set into a served model with measured accuracy "
        "variants (fp32, int8 by static quantization, fp16 on a GPU, and your own smaller models)",
    )
    v.add_argument("--onnx", required=True, metavar="PATH", help="the model (one input, a dynamic batch dimension)")
    v.add_argument(
        "--val",
        required=True,
        metavar="VAL.npz",
        help="validation set: x (rows of the model's input) and y (an integer label a row)",
    )
    v.add_argument("--name", required=True, help="the model's name in the repository")
    v.add_argument("--repo", required=True, metavar="DIR", help="the model repository to write DIR/NAME into")
    v.add_argument(
        "--kinds",
        type=lambda s: [k.strip() for k in s.split(",") if k.strip()],
        default=None,
        help="variants to build, of fp32,fp16,int8 (default: all; fp16 only where a GPU runs it)",
    )
    v.add_argument(
        "--extra-variant",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also serve this ONNX model (same inputs and outputs) as variant NAME (repeatable)",
    )
    v.add_argument("--output", help="the output whose argmax is the class (default: the first)")
    v.add_argument("--max-batch", type=int, default=64, help="max_batch_size of the config (and the profiles)")
    v.add_argument("--slo-ms", type=float, default=50.0, help="slo_ms of the config")
    v.add_argument("--calib-fraction", type=float, default=0.3, help="share of VAL.npz that calibrates int8")
    v.add_argument("--seed", type=int, default=0, help="seed of the calibration / held-out split")
    v.add_argument("--profile-iters", type=int, default=30, help="timed batches per batch size (0: no profiles)")
    v.add_argument("--force", action="store_true", help="replace DIR/NAME if it exists")
    v.set_defaults(func=_models_variants)

    pr = sub.add_parser("profile", help="measure latency per batch size of every (model, variant) on this device")
    pr.add_argument("--repo", default="model_repository")
    pr.add_argument("--model", action="append", help="only this model (repeatable)")
    pr.add_argument("--iters", type=int, default=100, help="timed batches per batch size")
    pr.add_argument("--warmup", type=int, default=10)
    pr.add_argument("--intra-op-threads", type=int, default=1)
    pr.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    pr.set_defaults(func=_profile)


def _models_build(args: argparse.Namespace) -> int:
    from sloserve.modeltools.demo import build_demo

    print(f"building demo models into {args.repo} ...", flush=True)
    try:
        build_demo(args.repo, seed=args.seed, models=tuple(m for m in args.models.split(",") if m))
    except ValueError as e:
        print(f"sloserve models build: {e}", file=sys.stderr)
        return 2
    if args.profile_iters > 0:
        from sloserve.modeltools.profiler import profile_repo
        from sloserve.replica.runtime import RuntimeOptions

        print("profiling them on this machine (a prior; the SLO policy calibrates online) ...", flush=True)
        profile_repo(args.repo, RuntimeOptions(), iters=args.profile_iters, warmup=3)
    print("done", flush=True)
    return 0


def _models_check(args: argparse.Namespace) -> int:
    """The check the server runs on every model it loads (``sloserve.models.repository.load_model_dir``), one
    line per model folder (for a Triton one: its served versions, and what of its config.pbtxt is not honoured)."""
    from pathlib import Path

    from sloserve.models.repository import LoadedModel, ModelRepository

    repo = ModelRepository(args.repo)
    try:
        results = repo.check_models()
    except FileNotFoundError as e:
        print(f"sloserve models check: {e}")
        return 2
    others = sorted(p.name for p in repo.root.iterdir() if p.is_dir() and p.name not in results)
    for name, r in results.items():
        if not isinstance(r, LoadedModel):
            print(f"{name}: FAIL: {r}")
        elif r.triton is None:
            print(f"{name}: ok")
        else:
            t = r.triton
            note = f"; accepted, not honoured: {', '.join(t.ignored)}" if t.ignored else ""
            print(f"{name}: ok (Triton config.pbtxt, versions {', '.join(r.config.versions)}{note})")
    for name in others:
        print(f"{name}: skipped (no {Path(name) / 'config.json'} nor config.pbtxt, so not a model folder)")
    bad = sum(1 for r in results.values() if not isinstance(r, LoadedModel))
    if not results:
        print(f"sloserve models check: {repo.root} holds no <model>/config.json (or config.pbtxt)")
        return 2
    print(f"{len(results) - bad} of {len(results)} model(s) ok in {repo.root}")
    return 1 if bad else 0


def _models_variants(args: argparse.Namespace) -> int:

    from sloserve.modeltools.variants import VariantsError, generate_variants

    try:
        generate_variants(
            args.onnx,
            args.val,
            args.name,
            args.repo,
            args.kinds,
            args.extra_variant,
            output=args.output,
            force=args.force,
            max_batch=args.max_batch,
            slo_ms=args.slo_ms,
            calib_fraction=args.calib_fraction,
            seed=args.seed,
            profile_iters=args.profile_iters,
        )
    except VariantsError as e:
        print(f"sloserve models variants: {e}", file=sys.stderr)
        return 2
    return 0


def _profile(args: argparse.Namespace) -> int:
    from sloserve.modeltools.profiler import profile_repo
    from sloserve.replica.runtime import RuntimeOptions

    opts = RuntimeOptions(intra_op_threads=args.intra_op_threads, device=args.device)
    paths = profile_repo(args.repo, opts, iters=args.iters, warmup=args.warmup, models=args.model or None)
    for p in paths:
        print(f"wrote {p}")
    return 0
