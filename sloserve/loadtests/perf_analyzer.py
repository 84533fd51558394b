"""Triton's own load tool, ``perf_analyzer``, pointed at sloserve (or any KServe V2 server).

``perf_analyzer`` is a C++ binary that the ``tritonclient`` wheels up to 2.45 ship in ``bin/``. Off a
GPU machine it needs two shared libraries more: ``libb64.so.0d`` (Debian's ``libb64-0d``, installed
with apt-get when missing, as :func:`sloserve.loadtests.debian.ensure_package` does) and
``libcudart.so.12`` (from the ``nvidia-cuda-runtime-cu12`` wheel; perf_analyzer links it even when it
never touches a GPU). :func:`ensure` fetches both wheels from the package index once, unpacks the
binary and the library under ``.peers/perf_analyzer/`` and returns how to run it::

    python -m sloserve.loadtests.perf_analyzer -m digits -u 127.0.0.1:8000            # HTTP
    python -m sloserve.loadtests.perf_analyzer -m digits -u 127.0.0.1:8001 -i grpc    # gRPC

Every argument is perf_analyzer's own (``--help`` lists them); with none but the model and the
URL it runs with Triton's defaults: concurrency 1, random input data, windows of 5 s until three in
a row agree within 10%.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sloserve.loadtests.debian import ensure_package

TRITONCLIENT = "tritonclient==2.45.0"  # the last wheel that ships bin/perf_analyzer
CUDART = "nvidia-cuda-runtime-cu12>=12.1,<13"
HOME = Path(__file__).resolve().parents[2] / ".peers" / "perf_analyzer"


@dataclass(frozen=True)
class Tool:
    binary: Path
    env: dict[str, str]

    def command(self, *args: str) -> list[str]:
        return [str(self.binary), *args]


def ensure(home: Path = HOME) -> Tool:
    """perf_analyzer ready to run: the binary and libcudart unpacked under ``home`` (downloaded from the
    package index the first time), Debian's libb64 installed if missing."""
    ensure_package("libb64-0d", lambda: _has_library("libb64.so.0d"))
    binary, lib = home / "bin" / "perf_analyzer", home / "lib" / "libcudart.so.12"
    if not (binary.is_file() and lib.is_file()):
        wheels = home / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        for req in (TRITONCLIENT, CUDART):
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--only-binary=:all:",
                    "-d",
                    str(wheels),
                    req,
                ],
                check=True,
                timeout=600,
            )
        _unpack(wheels, "tritonclient-2.45.0", "/bin/perf_analyzer", binary)
        _unpack(wheels, "nvidia_cuda_runtime_cu12", "/libcudart.so.12", lib)
        binary.chmod(0o755)
        shutil.rmtree(wheels)
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(lib.parent), os.environ.get("LD_LIBRARY_PATH")])),
    }
    return Tool(binary, env)


def _unpack(wheels: Path, prefix: str, suffix: str, dest: Path) -> None:
    for whl in sorted(wheels.glob(f"{prefix}*.whl")):
        with zipfile.ZipFile(whl) as z:
            for name in z.namelist():
                if name.endswith(suffix):
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(z.read(name))
                    return
    raise FileNotFoundError(f"no {suffix} in {prefix}*.whl under {wheels}")


def _has_library(name: str) -> bool:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    return name in out


_ROW = re.compile(r"^\s*(Throughput|Avg latency|p50 latency|p90 latency|p95 latency|p99 latency):\s*([\d.]+)")


def parse(output: str) -> dict[str, float]:
    """The client-side figures of perf_analyzer's last measured concurrency: ``Throughput`` (infer/s) and
    latencies in microseconds (``Avg latency``, ``p50 latency`` ... ``p99 latency``)."""
    found: dict[str, float] = {}
    for line in output.splitlines():
        m = _ROW.match(line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


def main(argv: list[str] | None = None) -> int:
    tool = ensure()
    return subprocess.run(tool.command(*(sys.argv[1:] if argv is None else argv)), env=tool.env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
