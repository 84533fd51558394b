"""A process tree's CPU and memory (sloserve/loadtests/bench/procstat.py, on psutil), as the benchmarks read them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sloserve.loadtests.bench.procstat import CpuWindow, core_speed_ms, machine_busy_s, tree, tree_cpu_s, tree_memory_mb


def test_a_tree_counts_its_children_and_a_window_its_cpu():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert child.pid in {p.pid for p in tree(os.getpid())}
        mem = tree_memory_mb(os.getpid())
        assert mem["processes"] >= 2 and 0 < mem["pss_mb"] <= mem["rss_mb"]
        win = CpuWindow(os.getpid())
        win.start()
        end = time.process_time() + 0.1  # 100 ms of CPU of our own: several of /proc's 10 ms ticks
        while time.process_time() < end:
            pass
        server, busy, total = win.stop()
        assert server > 0 and 0 <= busy <= total
    finally:
        child.communicate(b"")
    assert tree_cpu_s(os.getpid()) > 0
    assert tree(2**22 + 12345) == []  # gone (beyond pid_max): an empty tree
    busy, total = machine_busy_s()
    assert 0 < busy < total


def test_the_core_speed_probe_measures_cpu_and_refuses_nonsense():
    assert core_speed_ms(loops=1, n=1000) > 0
    for bad in ({"loops": 0}, {"n": 0}):
        with pytest.raises(ValueError, match="must be >= 1"):
            core_speed_ms(**bad)
