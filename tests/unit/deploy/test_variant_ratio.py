"""``deploy/gpu/variant_ratio.py``, the GPU host's check that the cnn variants trade cost, runs here on
the CPU provider and prints a line per variant and the large / small ratio."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_variant_ratio_prints_each_variant_and_the_ratio_on_the_cpu(model_repo):
    args = [sys.executable, str(ROOT / "deploy/gpu/variant_ratio.py"), str(model_repo), "--iters", "5", "--warmup", "1"]
    out = subprocess.run([*args, "--device", "cpu"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    lines = [line for line in out.splitlines() if line.startswith("cnn/")]
    assert [line.split()[0] for line in lines] == ["cnn/large", "cnn/medium", "cnn/small"], out
    assert all("CPUExecutionProvider" in line and "b=1: p50" in line and "b=8: p50" in line for line in lines)
    assert out.splitlines()[-1].startswith("large / small p50 ratio  b=1: "), out
