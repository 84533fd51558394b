"""Factories for batching tests: requests, views and simple latency models (no clock, no sleep)."""

from __future__ import annotations

from sloserve.batching.types import QueuedItem, QueueView


def linear(a_ms: float, b_ms: float):
    """latency(rows) = a + b * rows milliseconds, as seconds."""
    return lambda v, n: (a_ms + b_ms * n) / 1e3


TWO = {"big": (4.0, 0.5), "small": (1.0, 0.1)}  # ms: big = 4 + 0.5 n, small = 1 + 0.1 n
ACC = {"big": 0.95, "small": 0.85}


def two_variants(v: str, n: int) -> float:
    a, b = TWO[v]
    return (a + b * n) / 1e3


def items(n: int, slo_s: float = 0.02, gap_s: float = 0.0, variants=("v",), start_s: float = 0.0):
    return [QueuedItem(i, start_s + i * gap_s, start_s + i * gap_s + slo_s, 1, 0, variants) for i in range(n)]


def view(its, idle=None, max_batch_size: int = 32, busy=None, model: str = "m") -> QueueView:
    return QueueView(model, its, idle if idle is not None else {"v": 1}, max_batch_size, busy)
