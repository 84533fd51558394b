"""Process trees from /proc (Linux): who a process's children are, and ending the ones left over.

One implementation for the gateway (reaping what an embedded Ray leaves behind), the benchmark
harness (a server's whole tree: CPU and memory) and the tests (whose replica is this)."""

from __future__ import annotations

import logging
import os
import signal
import time

log = logging.getLogger("sloserve.proctree")


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` after the command (which may hold spaces): state, ppid, ...; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2 :].split()
    except (OSError, ValueError):
        return None


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid``, None if it is gone."""
    fields = _stat(pid)
    try:
        return int(fields[1]) if fields else None
    except (ValueError, IndexError):
        return None


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = parent_pid(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def describe(pids: set[int]) -> str:
    """``pid state wchan: command`` per process, for a log line about processes that hang (a child
    stuck between fork and exec still shows its parent's command)."""
    out = []
    for p in sorted(pids):
        fields = _stat(p)
        if not fields:
            continue
        state = fields[0].decode()
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
            try:
                with open(f"/proc/{p}/wchan") as f:
                    wchan = f.read().strip() or "-"
            except OSError:
                wchan = "?"
        except OSError:
            continue
        out.append(f"{p} {state} {wchan}: {cmd}")
    return "; ".join(out)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie). A zombie child of ours is collected on the way, so none
    outlives the gateway in its process group."""
    fields = _stat(pid)
    if not fields:
        return False
    if fields[0] != b"Z":
        return True
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # someone else's zombie: its parent collects it
        pass
    return False


def reap(pids: set[int], grace_s: float = 3.0) -> None:
    """Give ``pids`` ``grace_s`` to exit, then SIGKILL whatever is left (and collect our zombies)."""
    deadline = time.monotonic() + grace_s
    alive = {p for p in pids if _alive(p)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = {p for p in alive if _alive(p)}
    for p in alive:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    if alive:
        log.info("killed %d process(es) left behind", len(alive))
        end = time.monotonic() + 1.0
        while alive and time.monotonic() < end:  # collect the killed ones that are our children
            alive = {p for p in alive if _alive(p)}
            if alive:
                time.sleep(0.02)
