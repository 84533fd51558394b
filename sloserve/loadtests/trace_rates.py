"""Arrival traces -> target request rates (pure functions; no Locust import).

Used by sloserve/loadtests/trace_shape.py, the plots and the tests. A slice of ``minutes`` trace minutes
starting at ``start`` becomes ``minutes * seconds_per_minute`` test seconds; the busiest bin of
the slice maps to ``peak_rps`` and the others keep their proportion (linear interpolation).
A trace is per-minute counts (``kind="counts"``: one bin a minute) or request timestamps
(``kind="timestamps"``: a column of seconds, counted per second, so the clumps inside each minute
are replayed as they came).
"""

from __future__ import annotations

import csv
from pathlib import Path

from sloserve.sim.arrivals import AZURE_FUNCTIONS_2019

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


def load_timestamps(path: str | Path, column: str, start: int, minutes: int) -> list[float]:
    """Per-second request counts of trace minutes ``start .. start+minutes-1`` of a timestamp trace
    whose ``column`` holds each request's time in seconds."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or column not in reader.fieldnames:
            raise SystemExit(f"trace {path}: no column {column!r}; columns: {reader.fieldnames}")
        times = [float(r[column]) for r in reader]
    t0 = min(times, default=0.0)
    end = (max(times, default=0.0) - t0) / 60
    if not 0 <= start < end:
        raise SystemExit(f"trace {path}: start minute {start} is outside 0..{int(end)}")
    counts = [0.0] * (60 * max(1, minutes))
    for t in times:
        i = int(t - t0) - 60 * start
        if 0 <= i < len(counts):
            counts[i] += 1
    return counts


def load_bins(
    path: str | Path, kind: str, column: str, start: int, minutes: int, seconds_per_minute: float
) -> tuple[list[float], float]:
    """The slice's counts per bin and the test seconds one bin lasts, for either kind of trace."""
    if kind == "timestamps":
        return load_timestamps(path, column, start, minutes), seconds_per_minute / 60
    if kind == "counts":
        return load_trace(path, column, start, minutes), seconds_per_minute
    raise SystemExit(f"trace kind {kind!r}: use counts (per-minute counts) or timestamps (request times)")


def rate_at(counts: list[float], t_s: float, seconds_per_bin: float, peak_rps: float) -> float | None:
    """Target requests/s at test time ``t_s`` (bins of ``seconds_per_bin`` test seconds); None once
    the slice is over."""
    pos = t_s / seconds_per_bin
    if pos >= len(counts):
        return None
    i = int(pos)
    nxt = counts[i + 1] if i + 1 < len(counts) else counts[i]
    c = counts[i] + (nxt - counts[i]) * (pos - i)
    peak = max(counts) or 1.0
    return c / peak * peak_rps
