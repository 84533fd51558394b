"""Golden-trace regression: `sloserve sim` on a 10-minute trace must give these numbers exactly.

If a deliberate change moves them, regenerate with ``REGEN_GOLDEN=1 pytest tests/unit/sim/test_golden.py``
and say why in the commit.
"""

import json
import os
from pathlib import Path

import pytest

from sloserve.cli import main

HERE = Path(__file__).parent
GOLDEN = HERE / "golden.json"
ARGS = [
    "sim",
    "--trace",
    str(HERE / "golden_trace.csv"),
    "--column",
    "requests",
    "--kind",
    "counts",
    "--interval-s",
    "60",
    "--peak-replicas",
    "2",
    "--slo-ms",
    "1000",
    "--model-class",
    "gpt2-gen",
    "--device",
    "t4",
    "--autoscaler",
    "swayam,ray-default,kpa,oracle",
    "--mode",
    "request",
    "--batching",
    "timeout",
    "--startup-s",
    "10",
    "--tick-s",
    "5",
    "--seed",
    "7",
    "--no-progress",
]
KEYS = ("requests", "slo_attainment", "minutes_sla_met_fraction", "replica_seconds", "goodput_rps", "scale_events")


def run(tmp_path) -> dict:
    assert main(ARGS + ["--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "result.json").read_text())
    assert (tmp_path / "timeline.png").stat().st_size > 1000
    return {p: {k: v[k] for k in KEYS} for p, v in doc["policies"].items()}


def test_golden(tmp_path):
    got = run(tmp_path)
    if os.environ.get("REGEN_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert set(got) == set(want)
    for policy, vals in want.items():
        for k, v in vals.items():
            assert got[policy][k] == pytest.approx(v, rel=1e-9, abs=1e-9), (policy, k)
