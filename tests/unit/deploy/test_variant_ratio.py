"""``deploy/gpu/variant_ratio.py``, the GPU host's check that the cnn variants trade cost, runs here on
the CPU provider and prints a line per variant and the most / least accurate variant's ratio."""

from __future__ import annotations

import subprocess
import sys

from sloserve.models.repository import ModelConfig
from tests.conftest import ROOT


def test_variant_ratio_prints_each_variant_and_the_ratio_on_the_cpu(model_repo):
    args = [sys.executable, str(ROOT / "deploy/gpu/variant_ratio.py"), str(model_repo), "--iters", "5", "--warmup", "1"]
    out = subprocess.run([*args, "--device", "cpu"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    lines = [line for line in out.splitlines() if line.startswith("cnn/")]
    # the variants in the config's order, most accurate first, and the ratio of the first to the last:
    # as the build measured their accuracies here (PyTorch's training differs a little by CPU)
    cfg = ModelConfig.model_validate_json((model_repo / "cnn" / "config.json").read_text())
    assert {v.name for v in cfg.variants} >= {"small", "medium", "large"}
    ranked = [v.name for v in cfg.variants_by_accuracy]
    assert [line.split()[0] for line in lines] == [f"cnn/{v.name}" for v in cfg.variants], out
    assert all("CPUExecutionProvider" in line and "b=1: p50" in line and "b=8: p50" in line for line in lines)
    assert out.splitlines()[-1].startswith(f"{ranked[0]} / {ranked[-1]} p50 ratio  b=1: "), out
