"""CPU and memory of a process tree from /proc (Linux): what a server really spends."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gateway.backends.proctree import descendants

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, utime+stime+cutime+cstime in seconds) of one process, None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(b")") + 2 :].split()
    # fields after the command: state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17)
    ppid = int(rest[1])
    ticks = int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
    return ppid, ticks / CLK_TCK


def tree_pids(root: int) -> list[int]:
    """root and all its descendants (by parent pid), alive now."""
    return [root, *descendants(root)]


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user+system, including reaped children) used so far by root's process tree.

    Children that were reaped move their time into their parent's cutime/cstime, so nothing is
    counted twice and short-lived helpers are not lost."""
    total = 0.0
    for p in tree_pids(root):
        st = _stat(p)
        if st is not None:
            total += st[1]
    return total


def machine_busy_s() -> tuple[float, float]:
    """(busy CPU seconds, total CPU seconds) of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    vals = [int(x) for x in parts]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    total = sum(vals[:8])  # guest time is already inside user
    return (total - idle) / CLK_TCK, total / CLK_TCK


def tree_memory_mb(root: int) -> dict[str, float]:
    """RSS and PSS (MB) summed over the tree (PSS splits shared pages fairly between processes)."""
    rss = pss = 0.0
    n = 0
    for p in tree_pids(root):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
            n += 1
        except OSError:
            continue
    return {"rss_mb": round(rss / 1024, 1), "pss_mb": round(pss / 1024, 1), "processes": n}


@dataclass
class CpuWindow:
    """Server tree CPU and machine CPU over one measured window."""

    root: int
    t0_tree: float = 0.0
    t0_busy: float = 0.0
    t0_total: float = 0.0

    def start(self) -> None:
        self.t0_tree = tree_cpu_s(self.root)
        self.t0_busy, self.t0_total = machine_busy_s()

    def stop(self) -> tuple[float, float, float]:
        """(server CPU s, machine busy CPU s, machine total CPU s) since start."""
        tree = tree_cpu_s(self.root)
        busy, total = machine_busy_s()
        return tree - self.t0_tree, busy - self.t0_busy, total - self.t0_total
