"""Ending left-over processes (sloserve/gateway/backends/proctree.py, on psutil): a process still there after the
grace period is killed, our zombies are collected, and the log line names the processes."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from sloserve.gateway.backends.proctree import describe, reap


def _child(code: str) -> psutil.Process:
    return psutil.Process(subprocess.Popen([sys.executable, "-c", code]).pid)


def test_reap_kills_what_outlives_its_grace_and_collects_our_zombies():
    sleeper = _child("import time; time.sleep(60)")
    done = _child("pass")
    while done.status() != psutil.STATUS_ZOMBIE:  # exited, not yet collected: a zombie of ours
        time.sleep(0.01)
    assert f"{sleeper.pid} " in describe({sleeper, done})
    t0 = time.monotonic()
    reap({sleeper, done}, grace_s=0.2)
    assert time.monotonic() - t0 < 5
    assert not psutil.pid_exists(sleeper.pid)  # killed, and collected (it is our child)
    assert not psutil.pid_exists(done.pid)  # collected


def test_describe_skips_processes_that_are_gone():
    p = _child("pass")
    p.wait(timeout=10)
    assert describe({p}) == ""
