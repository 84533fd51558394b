"""Reclaims of a real GPU from a training job by an inference replica: the training runtime on a CUDA
host, with the GPU's own memory accounting.

Starts a local Ray on the host's GPUs and runs the PyTorch demo job (``sloserve.training.demo``
under Ray Train, ``sloserve.training.runtime.RayLauncher``) on one of them. Each reclaim:

1. the decision (``t=0``): ``RayJobHandle.preempt(grace_s)``, what the placement controller calls;
2. **GPU free**: NVML lists no process of the job on the GPU any more and the device's used memory
   is back within ``--slack-mib`` of what it was before the job started;
3. only then a replica process starts (a fresh interpreter: ONNX Runtime's import, a CUDA session
   of ``--model``, one batch), and **first answer** is when its first output is back;
4. the replica exits, the job resumes from its latest good checkpoint, and trains until it has
   reached ``--train-s`` seconds of new iterations before the next reclaim.

Per reclaim: the two times from the decision, the job's used GPU memory while it trained and the
device's used memory when the replica began to load, the preemption's outcome and the iterations
lost. Without CUDA (a CPU box) the job runs on an emulated GPU and the replica on the CPU, which
checks the script, not the GPU.

    python -m sloserve.loadtests.bench.reclaim_gpu --model model_repository/heavy/large/model.onnx \
        --reclaims 10 --out results/reclaim-gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sloserve.loadtests.results import spread, write_result

REPLICA = r"""
import sys, time, json
t0 = time.perf_counter()
import numpy as np
import onnxruntime as ort
t_import = time.perf_counter()
cuda = "CUDAExecutionProvider" in ort.get_available_providers() and sys.argv[2] == "cuda"
if cuda and hasattr(ort, "preload_dlls"):
    ort.preload_dlls()
prov = ["CUDAExecutionProvider", "CPUExecutionProvider"] if cuda else ["CPUExecutionProvider"]
s = ort.InferenceSession(sys.argv[1], providers=prov)
t_load = time.perf_counter()
i = s.get_inputs()[0]
shape = [1 if not isinstance(d, int) or d < 0 else d for d in i.shape]
out = s.run(None, {i.name: np.zeros(shape, np.float32)})
t_answer = time.perf_counter()
print(json.dumps({"import_s": t_import - t0, "load_s": t_load - t_import, "first_batch_s": t_answer - t_load,
                  "providers": s.get_providers()}), flush=True)
"""


class Gpu:
    """NVML's view of GPU 0 (None of it on a machine without NVIDIA's driver)."""

    def __init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv: Any = pynvml
            self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.name = pynvml.nvmlDeviceGetName(self.h)
        except Exception:
            self.nv, self.h, self.name = None, None, None

    def used_mib(self) -> float | None:
        if self.nv is None:
            return None
        return self.nv.nvmlDeviceGetMemoryInfo(self.h).used / 2**20

    def processes(self) -> dict[int, float]:
        """pid -> MiB of every other process with a CUDA context on the GPU."""
        if self.nv is None:
            return {}
        procs = self.nv.nvmlDeviceGetComputeRunningProcesses(self.h)
        return {p.pid: (p.usedGpuMemory or 0) / 2**20 for p in procs if p.pid != os.getpid()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m sloserve.loadtests.bench.reclaim_gpu", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", required=True, help="the replica's ONNX file")
    p.add_argument("--reclaims", type=lambda v: max(1, int(v)), default=10, help="at least 1")
    p.add_argument("--grace-s", type=float, default=1.0)
    p.add_argument("--train-s", type=float, default=3.0, help="new training between reclaims")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--slack-mib", type=float, default=64.0, help="used memory back within this of the baseline")
    p.add_argument("--timeout-s", type=float, default=60.0, help="bound on each wait")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import ray
    import torch

    from sloserve.training.job import TrainingSpec
    from sloserve.training.runtime import RayLauncher

    gpu = Gpu()
    cuda = torch.cuda.is_available()
    base_mib = gpu.used_mib()

    def start_ray(resources: dict[str, float] | None = None) -> None:
        ray.init(address="local", num_gpus=1, resources=resources, include_dashboard=False, log_to_driver=False)

    gpu_type = "T4"  # emulated where torch sees no GPU
    if cuda:
        start_ray()
        types = [k.split(":", 1)[1] for k in ray.cluster_resources() if k.startswith("accelerator_type:")]
        gpu_type = types[0] if types else "GPU"
        if not types:  # Ray names the type itself on a real GPU; else declare one
            ray.shutdown()
            start_ray({"accelerator_type:GPU": 1.0})
    else:
        start_ray({"accelerator_type:T4": 1.0})
    launcher = RayLauncher(backend=None if cuda else "gloo")
    spec = TrainingSpec(
        job_id="reclaim-gpu",
        config={"iterations": 0, "checkpoint_every": args.checkpoint_every, "batch_size": 256, "channels": 64},
        workers=1,
        gpu_type=gpu_type,
        checkpoint_every=args.checkpoint_every,
    )
    launcher.check(spec)
    job_dir = Path(tempfile.mkdtemp(prefix="reclaim-gpu-"))
    (job_dir / "spec.json").write_text(spec.model_dump_json())
    device = "cuda" if cuda else "cpu"
    print(f"GPU: {gpu.name or 'none (emulated ' + gpu_type + ')'}; baseline used {base_mib} MiB; replica on {device}")
    rows: list[dict[str, Any]] = []
    h = None
    try:
        for k in range(args.reclaims):
            h = launcher.start(spec, job_dir)
            t_wait = time.monotonic() + args.timeout_s
            first_it: int | None = None
            t_first: float | None = None
            while time.monotonic() < t_wait:  # training again, for train_s of new iterations
                pr = h.progress() or {}
                it = int(pr.get("iteration") or 0)
                if pr.get("status") == "failed":
                    print(pr.get("error"), file=sys.stderr)
                    return 1
                if first_it is None and pr.get("metrics"):
                    first_it, t_first = it, time.monotonic()
                if t_first is not None and time.monotonic() - t_first >= args.train_s:
                    break
                time.sleep(0.05)
            else:
                print(f"reclaim {k}: the job did not train within {args.timeout_s} s", file=sys.stderr)
                return 1
            job_mib = sum(gpu.processes().values()) if gpu.nv else None
            before = h.progress() or {}
            t0 = time.monotonic()
            outcome = h.preempt(args.grace_s)
            t_stop = time.monotonic() - t0
            t_free = None
            while time.monotonic() - t0 < args.timeout_s:
                used = gpu.used_mib()
                if used is None or (not gpu.processes() and used <= (base_mib or 0) + args.slack_mib):
                    t_free = time.monotonic() - t0
                    break
                time.sleep(0.005)
            if t_free is None:
                print(
                    f"reclaim {k}: GPU memory not released within {args.timeout_s} s: {gpu.processes()}",
                    file=sys.stderr,
                )
                return 1
            used_at_load = gpu.used_mib()
            rep = subprocess.run(
                [sys.executable, "-c", REPLICA, args.model, device],
                capture_output=True,
                text=True,
                timeout=args.timeout_s,
            )
            t_answer = time.monotonic() - t0
            if rep.returncode != 0:
                print(rep.stderr[-2000:], file=sys.stderr)
                return 1
            st = json.loads((job_dir / "status.json").read_text())
            lost = max(0, int(before.get("iteration") or 0) - int(st.get("checkpoint_iteration") or 0))
            row = {
                "reclaim": k,
                "outcome": outcome,
                "stopped_s": round(t_stop, 4),
                "gpu_free_s": round(t_free, 4),
                "first_answer_s": round(t_answer, 4),
                "job_gpu_mib": job_mib,
                "used_mib_at_load": used_at_load,
                "iteration_at_decision": before.get("iteration"),
                "checkpoint_iteration": st.get("checkpoint_iteration"),
                "lost_iterations_upper_bound": lost,
                "replica": json.loads(rep.stdout.strip().splitlines()[-1]),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:  # an early return leaves neither the job nor Ray running
        if h is not None and h.alive():
            h.preempt(0.1)
        ray.shutdown()
    free = [r["gpu_free_s"] for r in rows]
    ans = [r["first_answer_s"] for r in rows]
    summary = {
        "gpu": gpu.name,
        "gpu_type": gpu_type,
        "device": device,
        "baseline_used_mib": base_mib,
        "reclaims": len(rows),
        "gpu_free_s": spread(free),
        "first_answer_s": spread(ans),
        "outcomes": {o: sum(r["outcome"] == o for r in rows) for o in {r["outcome"] for r in rows}},
        "lost_iterations_max": max(r["lost_iterations_upper_bound"] for r in rows),
        "checkpoint_every": args.checkpoint_every,
        "rows": rows,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))
    write_result(summary, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
