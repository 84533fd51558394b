"""CPU and memory of a process tree (psutil): what a server really spends."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import psutil


def tree(root: int) -> list[psutil.Process]:
    """root and all its descendants, alive now (empty if root is gone)."""
    try:
        p = psutil.Process(root)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user+system, including reaped children) used so far by root's process tree.

    Children that were reaped move their time into their parent's children_user/children_system, so
    nothing is counted twice and short-lived helpers are not lost."""
    total = 0.0
    for p in tree(root):
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def machine_busy_s() -> tuple[float, float]:
    """(busy CPU seconds, total CPU seconds) of the whole machine since boot."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest time is inside user
    return total - idle, total


def tree_memory_mb(root: int) -> dict[str, float]:
    """RSS and PSS (MB) summed over the tree (PSS splits shared pages fairly between processes)."""
    rss = pss = 0.0
    n = 0
    for p in tree(root):
        try:
            m = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += m.rss
        pss += getattr(m, "pss", m.rss)  # PSS where the OS has it (Linux)
        n += 1
    return {"rss_mb": round(rss / 2**20, 1), "pss_mb": round(pss / 2**20, 1), "processes": n}


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


def core_speed_ms(loops: int = 9, n: int = 100_000) -> float:
    """How fast a core runs right now: the median CPU milliseconds (this thread's clock, so time spent
    waiting for a core does not count) of a fixed pure-Python loop of ``n`` additions, over ``loops``
    runs. On a shared virtual machine the same loop costs more CPU in spells (a neighbour on the
    physical core, the host's power management): a step whose figure is well above the run's usual
    one ran on a slower machine. Back to back, the runs after the first measure a core kept awake."""
    if loops < 1 or n < 1:
        raise ValueError(f"loops and n must be >= 1, got {loops} and {n}")
    samples = []
    for _ in range(loops):
        t0 = time.thread_time()
        acc = 0
        for i in range(n):
            acc += i
        samples.append(time.thread_time() - t0)
    return round(statistics.median(samples) * 1e3, 3)
