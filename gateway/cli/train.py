"""``sloserve train submit | list | preempt | resume | cancel`` over a jobs directory.

Jobs run as detached local processes (``autoscaler.training.worker``) unless ``--foreground``;
``cancel`` and ``preempt`` send SIGTERM (checkpoint at the next iteration boundary) and SIGKILL
after ``--grace-s``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

DEFAULT_DIR = os.environ.get("SLOSERVE_TRAINING_DIR", ".sloserve/training")


def _manager(args):
    from autoscaler.training.manager import TrainingManager

    return TrainingManager(args.jobs_dir, grace_s=args.grace_s)


def _print(infos, as_json: bool) -> None:
    if as_json:
        print(json.dumps([i.to_dict() for i in infos], indent=1))
        return
    print(f"{'JOB':<20} {'STATE':<10} {'ITER':>8} {'CKPT':>8} {'TOTAL':>8} {'LOSS':>8} GPUS")
    for i in infos:
        loss = f"{i.loss:.4f}" if i.loss is not None else "-"
        print(
            f"{i.job_id:<20} {i.state:<10} {i.iteration:>8} {i.checkpoint_iteration:>8} "
            f"{i.total_iterations or '-':>8} {loss:>8} {i.num_gpus}x{i.gpu_type}"
        )
        for bad in i.corrupt_checkpoints:
            print(f"{'':<20} corrupt checkpoint skipped: {bad}")


def _submit(args) -> int:
    from autoscaler.training.job import TrainingRunner, TrainingSpec

    spec = TrainingSpec(
        job_id=args.job_id,
        dataset=args.dataset,
        hidden=args.hidden,
        total_iterations=args.iterations or None,
        checkpoint_every=args.checkpoint_every,
        iteration_delay_s=args.iteration_delay_s,
        num_gpus=args.gpus,
        gpu_type=args.gpu_type,
        memory_mib=args.memory_mib,
        seed=args.seed,
    )
    m = _manager(args)
    try:
        info = m.submit(spec, start=not args.foreground)
    except ValueError as e:
        print(f"sloserve: {e}", file=sys.stderr)
        return 2
    if args.foreground:  # Ctrl-C checkpoints at the next iteration boundary
        import signal

        from autoscaler.training.job import PreemptSignal

        sig = PreemptSignal()
        signal.signal(signal.SIGINT, lambda *_: sig.request())
        m._save(spec.job_id, state="running", launcher="foreground")
        r = TrainingRunner(spec, m.dir / spec.job_id, signal=sig).run()
        m._save(spec.job_id, state=r.status if r.status != "stopped" else "preempted")
        info = m.get(spec.job_id)
    _print([info], args.json)
    return 0


def _list(args) -> int:
    _print(_manager(args).list(), args.json)
    return 0


def _act(verb):
    def run(args) -> int:
        m = _manager(args)
        try:
            info = getattr(m, verb)(args.job_id)
        except (KeyError, ValueError) as e:
            print(f"sloserve: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
            return 2
        _print([info], args.json)
        return 0

    return run


def register(sub: argparse._SubParsersAction) -> None:
    t = sub.add_parser("train", help="preemptible training jobs on idle GPUs")
    tsub = t.add_subparsers(dest="tcmd", required=True)

    def common(p):
        p.add_argument(
            "--jobs-dir", default=DEFAULT_DIR, help=f"jobs directory (default {DEFAULT_DIR}, env SLOSERVE_TRAINING_DIR)"
        )
        p.add_argument("--grace-s", type=float, default=1.0, help="preemption grace period before SIGKILL")
        p.add_argument("--json", action="store_true", help="print JSON")
        return p

    s = common(tsub.add_parser("submit", help="submit a job (runs as a detached local process)"))
    s.add_argument("job_id")
    s.add_argument("--dataset", choices=["digits", "synthetic"], default="digits")
    s.add_argument("--hidden", type=int, default=64)
    s.add_argument("--iterations", type=int, default=2000, help="0: until cancelled")
    s.add_argument("--checkpoint-every", type=int, default=50)
    s.add_argument("--iteration-delay-s", type=float, default=0.0, help="emulate a heavier model")
    s.add_argument("--gpus", type=int, default=1)
    s.add_argument("--gpu-type", default="T4")
    s.add_argument("--memory-mib", type=int, default=2048)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--foreground", action="store_true", help="train in this process (Ctrl-C checkpoints)")
    s.set_defaults(func=_submit)
    common(tsub.add_parser("list", help="list jobs and their progress")).set_defaults(func=_list)
    for verb, method, helptext in (
        ("cancel", "cancel", "checkpoint, stop and cancel a job"),
        ("preempt", "preempt", "checkpoint and stop a job, keeping it resumable"),
        ("resume", "start", "resume a preempted job from its latest checkpoint"),
    ):
        p = common(tsub.add_parser(verb, help=helptext))
        p.add_argument("job_id")
        p.set_defaults(func=_act(method))
