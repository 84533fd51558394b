"""ONNX Runtime sessions: the CUDA provider when a GPU is really present, the CPU provider otherwise.

>>> from models.runtime import RuntimeOptions, make_session
>>> sess = make_session("model_repository/digits/small/model.onnx", RuntimeOptions())  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """ONNX Runtime settings per session.

    ``intra_op_threads`` 1 is right on a small shared box; spinning is off by default because
    spinning threads steal the cores the gateway needs.
    """

    intra_op_threads: int = 1
    inter_op_threads: int = 1
    allow_spinning: bool = False
    device: str = "auto"  # auto | cpu | cuda


@functools.lru_cache(maxsize=1)
def gpu_present() -> bool:
    """True only when a CUDA device is visible, so CPU hosts never ask ORT for CUDA."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/version").exists()


def providers_for(device: str) -> list[str]:
    available = ort.get_available_providers()
    want_gpu = device == "cuda" or (device == "auto" and gpu_present())
    chosen = []
    if want_gpu:
        chosen += [p for p in ("CUDAExecutionProvider",) if p in available]
        if device == "cuda" and not chosen:
            raise RuntimeError(f"device=cuda asked for, but ONNX Runtime offers only {available}")
        if chosen:
            _preload_cuda_libraries()
    chosen.append("CPUExecutionProvider")
    return chosen


@functools.lru_cache(maxsize=1)
def _preload_cuda_libraries() -> None:
    """Load CUDA and cuDNN from the ``nvidia-*`` pip packages when they are installed there.

    onnxruntime-gpu links against CUDA 13's libraries but ships none; on hosts where they come
    from pip (as beside PyTorch) rather than from the system, the CUDA provider only finds them
    after ``onnxruntime.preload_dlls()``. Where the system has them, this is a no-op.
    """
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:
            pass


@functools.lru_cache(maxsize=1)
def device_type(device: str = "auto") -> str:
    """A stable name for the hardware a profile belongs to: GPU name or CPU model, slugged.

    The GPU's name only when ONNX Runtime will really run on it: a GPU host whose onnxruntime
    has no CUDA provider computes on the CPU, and its profiles must say so.
    """
    name = None
    if device != "cpu" and gpu_present() and "CUDAExecutionProvider" in providers_for(device):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=5,
            )
            name = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, IndexError, subprocess.TimeoutExpired):
            name = None
    if name is None:
        name = _cpu_model()
    return "".join(c if c.isalnum() else "-" for c in name).strip("-").lower()[:80] or "cpu"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu-" + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu-" + (platform.processor() or platform.machine())


def make_session(path: str | Path, opts: RuntimeOptions) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = opts.intra_op_threads
    so.inter_op_num_threads = opts.inter_op_threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if opts.allow_spinning else "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "1" if opts.allow_spinning else "0")
    so.log_severity_level = 3
    wanted = providers_for(opts.device)
    sess = ort.InferenceSession(str(path), sess_options=so, providers=wanted)
    if "CUDAExecutionProvider" in wanted and "CUDAExecutionProvider" not in sess.get_providers():
        # onnxruntime-gpu lists CUDA even where its libraries do not load, then runs on the CPU
        msg = (
            f"{path}: ONNX Runtime could not start its CUDA provider (CUDA 13 / cuDNN 9 libraries not "
            f"found?) and runs on the CPU; install them, or set device: cpu"
        )
        if opts.device == "cuda":
            raise RuntimeError(msg)
        log.warning("%s; its profile is named after the GPU but measures the CPU", msg)
    return sess


class Replica:
    """One ONNX Runtime session for one (model, variant): takes a batch, returns a batch."""

    def __init__(self, path: str | Path, opts: RuntimeOptions, output_names: list[str]):
        self.session = make_session(path, opts)
        self.output_names = output_names
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = self.session.run(self.output_names, inputs)
        return dict(zip(self.output_names, results, strict=False))

    def warm_up(self, rows: int = 1) -> None:
        """Run one batch of zeros, so the first request does not pay the session's first run (its
        allocations and kernel choices: tens of milliseconds, past a tight SLO)."""
        feeds: dict[str, np.ndarray] = {}
        for i in self.session.get_inputs():
            dtype = _ORT_TYPES.get(i.type)
            if dtype is None:  # an input type this warm-up does not know: the first request warms it
                return
            dims = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
            if dims:
                dims[0] = rows
            feeds[i.name] = np.zeros(dims, dtype)
        self.session.run(self.output_names, feeds)


_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}
