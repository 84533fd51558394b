"""A training job without a gateway: ``python -m sloserve.training.worker --job-dir DIR``.

Starts a local Ray (``RAY_ADDRESS`` set: joins that cluster instead) with the job's GPUs: the real
ones when torch sees CUDA, else ``workers`` emulated GPUs of the job's type (``GPU`` +
``accelerator_type:<T>``, as the gateway's ``emulated_gpus``), runs the job on Ray Train
(``runtime.RayLauncher``) and exits when it ends. SIGTERM (or SIGINT) asks the gang to checkpoint
at its next iteration boundary and stop; ``sloserve train`` sends SIGKILL to the process group
after the grace period, which takes the local Ray down with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from sloserve.training.job import TrainingSpec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sloserve.training.worker")
    p.add_argument("--job-dir", required=True)
    args = p.parse_args(argv)
    job_dir = Path(args.job_dir)
    spec = TrainingSpec.model_validate_json((job_dir / "spec.json").read_text())
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())

    import ray
    import torch

    from sloserve.training.runtime import RayLauncher

    cuda = torch.cuda.is_available()
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        n = torch.cuda.device_count() if cuda else spec.workers
        ray.init(
            address="local",
            num_cpus=max(2, os.cpu_count() or 2),
            num_gpus=n,
            resources={f"accelerator_type:{spec.gpu_type}": float(n)},
            include_dashboard=False,
            log_to_driver=False,
        )
    launcher = RayLauncher(backend=None if cuda else "gloo")
    try:
        launcher.check(spec)
    except ValueError as e:
        print(f"training job {spec.job_id}: {e}", file=sys.stderr)
        return 2
    h = launcher.start(spec, job_dir)
    while h.alive():
        if stop.wait(0.1):
            h.preempt(grace_s=3600.0)  # the CLI kills the whole process group past its own grace period
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
