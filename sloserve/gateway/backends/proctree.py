"""Ending the processes an embedded Ray leaves behind, and naming them in a log line (psutil).

Who a process's children are is psutil's ``Process(pid).children(recursive=True)``; a
:class:`psutil.Process` also remembers its start time, so a pid the kernel has since given to another
process is never signalled."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import psutil

log = logging.getLogger("sloserve.proctree")


def describe(procs: Iterable[psutil.Process]) -> str:
    """``pid status: command`` per process still there, for a log line about processes that hang (a
    child stuck between fork and exec still shows its parent's command)."""
    out = []
    for p in sorted(procs, key=lambda p: p.pid):
        try:
            with p.oneshot():
                out.append(f"{p.pid} {p.status()}: {' '.join(p.cmdline())[:160]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return "; ".join(out)


def _running(p: psutil.Process) -> bool:
    """Not gone and not a zombie. A zombie child of ours is collected on the way, so none outlives the
    gateway in its process group; someone else's is left to its parent."""
    try:
        if p.status() != psutil.STATUS_ZOMBIE:
            return True
        p.wait(timeout=0)  # ours: collected; not ours: TimeoutExpired
    except (psutil.NoSuchProcess, psutil.TimeoutExpired, psutil.AccessDenied):
        pass
    return False


def reap(procs: Iterable[psutil.Process], grace_s: float = 3.0) -> None:
    """Give ``procs`` ``grace_s`` to exit, then SIGKILL whatever is left (and collect our zombies).

    Polled here rather than with ``psutil.wait_procs``, which waits out its whole timeout on a zombie
    whose parent is not us (such a process has ended; its parent collects it)."""
    deadline = time.monotonic() + grace_s
    left = [p for p in procs if _running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _running(p)]
    for p in left:
        try:
            p.kill()  # psutil checks it is still the process we meant, not a reused pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    if left:
        log.info("killed %d process(es) left behind", len(left))
        end = time.monotonic() + 1.0
        while left and time.monotonic() < end:  # collect the killed ones that are our children
            left = [p for p in left if _running(p)]
            if left:
                time.sleep(0.02)


def die_with_parent() -> None:
    """In a child process: be sent SIGTERM when the process that started it dies, even by SIGKILL
    (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing), so that no child outlives a killed gateway."""
    import contextlib
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
