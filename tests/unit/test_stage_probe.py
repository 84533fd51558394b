"""The stage probe hooks the gateway's own classes by name: a move of one of them must fail here,
not in the middle of a benchmark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_stage_probe_hooks_install():
    code = (
        "from loadtests.bench.stage_probe import Recorder, install\n"
        "install(Recorder())\n"
        "from gateway.backends.ray import RayServeBackend\n"
        "assert RayServeBackend.run.__name__ == 'timed_run'\n"
        "assert RayServeBackend._read_details.__name__ == 'timed_read'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
