"""ONNX Runtime sessions: the CUDA provider when ONNX Runtime offers it and a GPU is visible, the CPU
provider otherwise; every session says which one it really runs on.

ONNX Runtime comes as two wheels that install the same ``onnxruntime`` module and cannot be installed
together: ``onnxruntime`` (CPU) and ``onnxruntime-gpu`` (CUDA and CPU). sloserve's extras pick one,
``pip install 'sloserve[cpu]'`` or ``pip install 'sloserve[gpu]'``.

>>> from sloserve.replica.runtime import RuntimeOptions, make_session
>>> sess = make_session("model_repository/digits/small/model.onnx", RuntimeOptions())  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import os
import platform
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sloserve.batching.profile import Curve

INSTALL_HINT = (
    "install sloserve with one of its ONNX Runtime extras: pip install 'sloserve[cpu]' on a CPU host, "
    "or pip install 'sloserve[gpu]' on an NVIDIA GPU host (CUDA 13, cuDNN 9)"
)
try:
    import onnxruntime as ort
except ModuleNotFoundError as e:  # neither wheel: say which to install (any other import error is its own)
    if e.name != "onnxruntime":
        raise
    raise ModuleNotFoundError(f"ONNX Runtime is not installed: {INSTALL_HINT}", name="onnxruntime") from e

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
# cuDNN's convolution algorithm per input shape by its heuristic, not by ONNX Runtime's default
# exhaustive benchmark: a served model meets every batch size from 1 to max_batch_size, and the
# benchmark of a shape not seen before runs inside that request's batch (on an H100, a CNN's p99 went
# to 0.5-1 s under a burst of varied batch sizes while its profiled batches took under 1 ms).
CUDA_OPTIONS = {"cudnn_conv_algo_search": "HEURISTIC"}


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


@dataclass(frozen=True, slots=True)
class ProviderChoice:
    """The execution providers to ask ONNX Runtime for, best first, and why (one line for the log)."""

    providers: tuple[str, ...]
    why: str
    warn: bool = False  # a GPU is there but will not be used: said at warning level

    @property
    def device(self) -> str:
        """``cuda`` or ``cpu``: where the session is meant to run."""
        return "cuda" if self.providers[0] == CUDA else "cpu"


def choose_providers(device: str, available: Sequence[str], gpu_visible: bool) -> ProviderChoice:
    """The providers for ``device`` (``auto``, ``cpu`` or ``cuda``), given the providers the installed
    ONNX Runtime offers and whether a GPU is visible to this process. ``auto`` takes CUDA whenever it
    is offered and a GPU is visible; ``cuda`` without the CUDA provider is an error.

    >>> choose_providers("auto", [CUDA, CPU], gpu_visible=True).providers
    ('CUDAExecutionProvider', 'CPUExecutionProvider')
    >>> choose_providers("auto", [CUDA, CPU], gpu_visible=False).device
    'cpu'
    """
    if device == "cpu":
        return ProviderChoice((CPU,), "device: cpu")
    if device not in ("auto", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {device!r}")
    if CUDA in available and (device == "cuda" or gpu_visible):
        return ProviderChoice((CUDA, CPU), f"device: {device}, and ONNX Runtime offers {CUDA}")
    if device == "cuda":
        raise RuntimeError(
            f"device: cuda asked for, but the installed ONNX Runtime offers only {list(available)}: "
            f"pip install 'sloserve[gpu]' (after pip uninstall onnxruntime), or set device: cpu"
        )
    if gpu_visible:
        return ProviderChoice(
            (CPU,),
            f"device: auto, a GPU is visible but the installed ONNX Runtime offers only {list(available)}: "
            f"pip install 'sloserve[gpu]' (after pip uninstall onnxruntime) to compute on it",
            warn=True,
        )
    return ProviderChoice((CPU,), "device: auto, and no GPU is visible")


@functools.lru_cache(maxsize=1)
def gpu_present() -> bool:
    """True only when an NVIDIA device is visible to this process, so CPU hosts never ask ONNX Runtime
    for CUDA (``CUDA_VISIBLE_DEVICES`` empty or -1 hides them, as Ray does for a replica given no GPU)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return any(Path("/dev").glob("nvidia[0-9]*")) or Path("/proc/driver/nvidia/version").exists()


def providers_for(device: str) -> ProviderChoice:
    """:func:`choose_providers` for this host's ONNX Runtime and GPUs (the CUDA libraries preloaded
    when CUDA is chosen)."""
    choice = choose_providers(device, ort.get_available_providers(), gpu_present())
    if choice.device == "cuda":
        _preload_cuda_libraries()
    return choice


def runtime_package() -> str:
    """Which ONNX Runtime wheel is installed, with its version (``onnxruntime-gpu 1.31.1``); both
    named when both are (they overwrite each other's files: uninstall both, install one)."""
    found = []
    for dist in ("onnxruntime", "onnxruntime-gpu"):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return " and ".join(found) or f"onnxruntime {ort.__version__}"


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
    if device != "cpu" and gpu_present() and providers_for(device).device == "cuda":
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
    return "cpu-" + cpu_model_name()


def cpu_model_name() -> str:
    """The CPU's model name (Linux's ``/proc/cpuinfo``: psutil does not read it), else the platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def make_session(path: str | Path, opts: RuntimeOptions) -> ort.InferenceSession:
    """An ONNX Runtime session of ``path`` on the providers :func:`providers_for` chooses; logs which
    device and provider it really runs on (:func:`session_device` reads them back)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = opts.intra_op_threads
    so.inter_op_num_threads = opts.inter_op_threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if opts.allow_spinning else "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "1" if opts.allow_spinning else "0")
    so.log_severity_level = 3
    choice = providers_for(opts.device)
    providers: list = [(p, CUDA_OPTIONS) if p == CUDA else p for p in choice.providers]
    sess = ort.InferenceSession(str(path), sess_options=so, providers=providers)
    device, provider = session_device(sess)
    if choice.device == "cuda" and device != "cuda":
        # onnxruntime-gpu lists CUDA even where its libraries do not load, then runs on the CPU
        msg = (
            f"{path}: ONNX Runtime could not start its CUDA provider (CUDA 13 / cuDNN 9 libraries not "
            f"found?) and runs on the CPU; install them, or set device: cpu"
        )
        if opts.device == "cuda":
            raise RuntimeError(msg)
        log.warning("%s; its profile is named after the GPU but measures the CPU", msg)
    level = logging.WARNING if choice.warn else logging.INFO
    log.log(level, "%s runs on %s (%s, %s; %s)", path, device, provider, runtime_package(), choice.why)
    return sess


def session_device(sess: ort.InferenceSession) -> tuple[str, str]:
    """(``cuda`` or ``cpu``, the execution provider) a session really runs on: its first provider."""
    provider = sess.get_providers()[0]
    return ("cuda" if provider == CUDA else "cpu"), provider


class Replica:
    """One ONNX Runtime session for one (model, variant): takes a batch, returns a batch."""

    def __init__(self, path: str | Path, opts: RuntimeOptions, output_names: list[str]):
        self.session = make_session(path, opts)
        self.device, self.provider = session_device(self.session)  # what it really runs on
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


def wait_out_profile(curve: Curve, t0: float, inputs: dict[str, np.ndarray]) -> None:
    """An emulated device type's replica: busy until ``curve``'s median for this batch has passed
    since ``t0`` (``time.perf_counter()`` when the batch started), whatever the real session took."""
    rows = next(iter(inputs.values())).shape[0] if inputs else 1
    rest = t0 + curve.at(rows, "p50") - time.perf_counter()
    if rest > 0:
        time.sleep(rest)
