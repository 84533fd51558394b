"""Arrival processes: a piecewise-constant rate (what the fluid mode and the oracle read) plus,
for the request-level mode, the arrival times themselves.

Sources: Poisson (constant rate), gamma-burst (per-interval rates drawn from a gamma law with a
given CV: a bursty Cox process), diurnal (sinusoid), and replay of any CSV trace column of
per-interval counts (arrivals spread as a Poisson process within each interval) or of timestamps
(replayed exactly; ``scale`` thins or duplicates them).

>>> a = poisson(rate_rps=5.0, duration_s=60.0)
>>> a.rate_at(10.0), a.duration_s
(5.0, 60.0)
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The public trace slices shipped with the repository (provenance and licences: their README.md). The
# one place that names the folder: the simulator's and the load tests' defaults all start here.
TRACES_DIR = Path(__file__).resolve().parents[1] / "loadtests" / "traces"
AZURE_FUNCTIONS_2019 = TRACES_DIR / "azure_functions_2019_selected_per_minute.csv"  # per-minute counts, 1 day
AZURE_LLM_2023 = TRACES_DIR / "azure_llm_2023_conv.csv"  # request timestamps (t_s), 58 min
ALIBABA_GENAI_2026 = TRACES_DIR / "alibaba_genai2026_qps.csv"  # gateway QPS every 57 s, 22 h


@dataclass(frozen=True)
class Arrivals:
    """``rates[i]`` requests/s over ``[i * interval_s, (i + 1) * interval_s)``; optional exact times."""

    interval_s: float
    rates: np.ndarray
    timestamps: np.ndarray | None = None  # seconds, sorted; replaces Poisson sampling when set
    name: str = ""

    @property
    def duration_s(self) -> float:
        return float(len(self.rates) * self.interval_s)

    def rate_at(self, t: float) -> float:
        i = int(t // self.interval_s)
        return float(self.rates[i]) if 0 <= i < len(self.rates) else 0.0

    def peak_rate(self, t0: float, t1: float) -> float:
        """The highest interval rate overlapping ``[t0, t1]``."""
        i0 = max(int(t0 // self.interval_s), 0)
        i1 = min(int(t1 // self.interval_s), len(self.rates) - 1)
        return float(self.rates[i0 : i1 + 1].max()) if i1 >= i0 else 0.0

    def scaled(self, factor: float) -> Arrivals:
        """``factor`` times the load. Timestamps are thinned or duplicated, each added copy at a uniform
        time in its original's interval: the per-interval counts (what the rates, fluid mode and the
        autoscalers' windows see) scale exactly, and a request does not become a clump of ``factor``
        requests in the same millisecond, which no larger user base sends (and no batcher could serve
        within a tight SLO: the oracle met 54% of requests that way on the Azure LLM trace x1,300)."""
        ts = self.timestamps
        if ts is not None and factor != 1.0:
            rng = np.random.default_rng(12345)
            reps = np.floor(factor) + (rng.random(len(ts)) < factor - np.floor(factor))
            keep = ts[reps > 0]  # each original that stays keeps its own time
            extra = np.repeat(ts, np.maximum(reps.astype(int) - 1, 0))
            iv = self.interval_s
            ts = np.sort(np.concatenate([keep, np.floor(extra / iv) * iv + rng.random(len(extra)) * iv]))
        return Arrivals(self.interval_s, self.rates * factor, ts, self.name)

    def sliced(self, start_s: float, end_s: float) -> Arrivals:
        i0, i1 = int(start_s // self.interval_s), math.ceil(end_s / self.interval_s)
        ts = None
        if self.timestamps is not None:
            ts = self.timestamps[(self.timestamps >= i0 * self.interval_s) & (self.timestamps < i1 * self.interval_s)]
            ts = ts - i0 * self.interval_s
        return Arrivals(self.interval_s, self.rates[i0:i1].copy(), ts, self.name)

    def sample_times(self, rng: np.random.Generator) -> np.ndarray:
        """All arrival times, sorted (the exact timestamps, or Poisson within each interval)."""
        if self.timestamps is not None:
            return self.timestamps
        counts = rng.poisson(self.rates * self.interval_s)
        starts = np.repeat(np.arange(len(self.rates)) * self.interval_s, counts)
        return np.sort(starts + rng.random(int(counts.sum())) * self.interval_s)


def poisson(rate_rps: float, duration_s: float, interval_s: float = 60.0) -> Arrivals:
    n = max(math.ceil(duration_s / interval_s), 1)
    return Arrivals(interval_s, np.full(n, float(rate_rps)), name=f"poisson-{rate_rps:g}")


def gamma_burst(
    rate_rps: float, duration_s: float, cv: float = 2.0, interval_s: float = 10.0, seed: int = 0
) -> Arrivals:
    n = max(math.ceil(duration_s / interval_s), 1)
    shape = 1.0 / (cv * cv)
    rates = np.random.default_rng(seed).gamma(shape, rate_rps / shape, n)
    return Arrivals(interval_s, rates, name=f"gamma-{rate_rps:g}-cv{cv:g}")


def diurnal(
    mean_rps: float,
    duration_s: float = 86400.0,
    amplitude: float = 0.5,
    period_s: float = 86400.0,
    interval_s: float = 60.0,
    phase_s: float = 0.0,
) -> Arrivals:
    n = max(math.ceil(duration_s / interval_s), 1)
    t = (np.arange(n) + 0.5) * interval_s
    rates = mean_rps * (1 + amplitude * np.sin(2 * np.pi * (t - phase_s) / period_s))
    return Arrivals(interval_s, np.maximum(rates, 0.0), name=f"diurnal-{mean_rps:g}")


def read_column(path: str | Path, column: str) -> np.ndarray:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or column not in reader.fieldnames:
            raise ValueError(f"{path}: no column {column!r}; columns: {reader.fieldnames}")
        return np.array([float(row[column] or 0.0) for row in reader])


def from_counts(path: str | Path, column: str, interval_s: float) -> Arrivals:
    """A column of per-interval counts (e.g. invocations per minute: ``interval_s=60``)."""
    counts = read_column(path, column)
    return Arrivals(interval_s, counts / interval_s, name=column)


def from_timestamps(path: str | Path, column: str, time_unit_s: float = 1.0, interval_s: float = 1.0) -> Arrivals:
    """A column of arrival timestamps (in units of ``time_unit_s`` seconds), replayed exactly."""
    ts = np.sort(read_column(path, column) * time_unit_s)
    ts = ts - ts[0] if len(ts) else ts
    n = max(math.ceil((ts[-1] if len(ts) else 0.0) / interval_s) + 1, 1)
    counts = np.bincount((ts // interval_s).astype(int), minlength=n)[:n]
    return Arrivals(interval_s, counts / interval_s, ts, name=column)
