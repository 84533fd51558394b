"""The stage probe hooks the gateway's own classes by name: a move of one of them must fail here,
not in the middle of a benchmark."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_stage_probe_hooks_install():
    code = (
        "from sloserve.loadtests.bench.stage_probe import Recorder, install\n"
        "install(Recorder())\n"
        "from sloserve.gateway.backends.ray import RayServeBackend\n"
        "assert RayServeBackend.run.__name__ == 'timed_run'\n"
        "assert RayServeBackend._read_details.__name__ == 'timed_read'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_long_stall_records_the_stalled_threads_stack_once():
    """``stack_watch`` samples the loop thread's Python stack once per stall, naming the function it
    runs (here a thread busy in ``_spin`` stands in for the loop)."""
    import threading
    import time

    from sloserve.loadtests.bench.stage_probe import Recorder, stack_watch

    rec = Recorder()

    def _spin(until: float) -> None:  # busy until the watch has sampled it (at most 5 s), then a bit more
        while time.monotonic() < until and not rec.stacks:
            pass
        end = time.monotonic() + 0.1
        while time.monotonic() < end:
            pass

    busy = threading.Thread(target=_spin, args=(time.monotonic() + 5.0,))
    busy.start()
    rec.loop_alive_s = time.monotonic()  # the "loop" last woke now, then stalls
    stop = threading.Event()
    watch = threading.Thread(target=stack_watch, args=(rec, busy.ident, 0.02, stop))
    watch.start()
    busy.join()
    stop.set()
    watch.join()
    assert len(rec.stacks) == 1, rec.stacks
    assert "_spin" in rec.stacks[0][1]
