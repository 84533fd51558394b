"""Per-minute arrival traces -> target request rates (pure functions; no Locust import).

Used by loadtests/trace_shape.py, the plots and the tests. A slice of ``minutes`` trace minutes
starting at ``start`` becomes ``minutes * seconds_per_minute`` test seconds; the busiest minute of
the slice maps to ``peak_rps`` and the others keep their proportion (linear interpolation).
"""

from __future__ import annotations

import csv
from pathlib import Path

from sim.arrivals import AZURE_FUNCTIONS_2019

DEFAULT_TRACE = AZURE_FUNCTIONS_2019


def load_trace(path: str | Path, column: str, start: int, minutes: int) -> list[float]:
    """Per-minute counts of ``column`` for minutes ``start .. start+minutes-1``."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or column not in rows[0]:
        cols = [c for c in (rows[0] if rows else {}) if c != "minute"]
        raise SystemExit(f"trace {path}: no column {column!r}; columns: {cols}")
    counts = [float(r[column]) for r in rows]
    if not 0 <= start < len(counts):
        raise SystemExit(f"trace {path}: start minute {start} is outside 0..{len(counts) - 1}")
    return counts[start : start + max(1, minutes)]


def rate_at(counts: list[float], t_s: float, seconds_per_minute: float, peak_rps: float) -> float | None:
    """Target requests/s at test time ``t_s``; None once the slice is over."""
    pos = t_s / seconds_per_minute
    if pos >= len(counts):
        return None
    i = int(pos)
    nxt = counts[i + 1] if i + 1 < len(counts) else counts[i]
    c = counts[i] + (nxt - counts[i]) * (pos - i)
    peak = max(counts) or 1.0
    return c / peak * peak_rps
