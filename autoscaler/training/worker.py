"""A training job as an OS process: ``python -m autoscaler.training.worker --job-dir DIR``.

``DIR/spec.json`` holds the ``TrainingSpec``; checkpoints go to ``DIR/checkpoints``, progress to
``DIR/status.json``. SIGTERM (or SIGINT) asks for a checkpoint at the next iteration boundary
and a clean exit (code 0, status ``preempted``); the launcher sends SIGKILL if the grace period
runs out. The process resumes from the latest valid checkpoint when started again.

Test hooks (used by tests/integration/test_checkpoint_crash.py to make a crash land in the middle
of a checkpoint write, deterministically): ``--crash-mid-write-at N`` with ``--crash-mode kill``
SIGKILLs the process itself after half of the first checkpoint at iteration >= N is written;
``--crash-mode pause`` creates ``<temp file>.paused`` and blocks there, so that another process
can SIGKILL it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from autoscaler.training.job import PreemptSignal, TrainingRunner, TrainingSpec


def _crash_hook(mode: str):
    def hook(tmp: Path) -> None:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        Path(f"{tmp}.paused").touch()
        threading.Event().wait()  # until SIGKILL

    return hook


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autoscaler.training.worker")
    p.add_argument("--job-dir", required=True)
    p.add_argument("--crash-mid-write-at", type=int, default=None, help="test hook: iteration")
    p.add_argument("--crash-mode", choices=["kill", "pause"], default="kill")
    args = p.parse_args(argv)
    job_dir = Path(args.job_dir)
    spec = TrainingSpec.model_validate(json.loads((job_dir / "spec.json").read_text()))
    sig = PreemptSignal()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: sig.request())
    hook = _crash_hook(args.crash_mode) if args.crash_mid_write_at is not None else None
    runner = TrainingRunner(
        spec, job_dir, signal=sig, mid_write_hook=hook, mid_write_at_iteration=args.crash_mid_write_at
    )
    try:
        result = runner.run()
    except Exception as e:  # record the failure where `train list` sees it
        runner.write_status("failed")
        print(f"training job {spec.job_id} failed: {e!r}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "job_id": spec.job_id,
                "status": result.status,
                "iteration": result.iteration,
                "checkpoint_iteration": result.checkpoint_iteration,
                "resumed_from": result.resumed_from,
                "corrupt_skipped": runner.corrupt,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
