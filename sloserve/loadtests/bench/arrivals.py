"""Arrival schedules for the open-loop benchmark: Poisson, gamma (a coefficient of variation), a public trace's shape, and a burst."""

from __future__ import annotations

import argparse
import csv
import math
import random
from pathlib import Path

from sloserve.sim.arrivals import AZURE_FUNCTIONS_2019 as TRACE_CSV


# ---- arrival schedules (offsets in seconds, sorted) ------------------------------------------------
def poisson(rate: float, dur: float, rng: random.Random, t0: float = 0.0) -> list[float]:
    out: list[float] = []
    t = t0
    while True:
        t += rng.expovariate(rate)
        if t >= t0 + dur:
            return out
        out.append(t)


def gamma_arrivals(rate: float, cv: float, dur: float, rng: random.Random) -> list[float]:
    """Renewal process with gamma inter-arrival times: mean 1/rate, coefficient of variation cv."""
    k = 1.0 / (cv * cv)
    theta = 1.0 / (rate * k)
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.gammavariate(k, theta)
        if t >= dur:
            return out
        out.append(t)


def trace_shape(column: str | None, path: Path = TRACE_CSV) -> tuple[str, list[float]]:
    """Per-minute counts of one column of the trace CSV, normalised to mean 1."""
    with open(path) as f:
        rows = list(csv.reader(f))
    head, body = rows[0], rows[1:]
    cols = [c for c in head if c.lower() not in ("minute", "time", "t", "index")]
    col = column or cols[0]
    j = head.index(col)
    vals = [float(r[j]) for r in body if len(r) > j and r[j] != ""]
    m = sum(vals) / len(vals)
    return col, [v / m for v in vals]


def trace_arrivals(rate: float, dur: float, rng: random.Random, shape: list[float], bucket_s: float) -> list[float]:
    """Non-homogeneous Poisson: each trace minute becomes ``bucket_s`` seconds at ``rate * shape``."""
    out: list[float] = []
    n = max(1, math.ceil(dur / bucket_s))
    for b in range(n):
        r = rate * shape[b % len(shape)]
        d = min(bucket_s, dur - b * bucket_s)
        if r > 0 and d > 0:
            out += poisson(r, d, rng, b * bucket_s)
    return out


def burst_arrivals(rate: float, factor: float, dur: float, rng: random.Random) -> list[float]:
    third = dur / 3
    return (
        poisson(rate, third, rng)
        + poisson(rate * factor, third, rng, third)
        + poisson(rate, dur - 2 * third, rng, 2 * third)
    )


def step_duration(args: argparse.Namespace, rate: float) -> float:
    """Seconds of arrivals at ``rate``: ``--duration``, stretched so that a step carries at least
    ``--min-requests`` (99% attainment cannot be judged on 27 requests: one late one is 96%)."""
    return max(args.duration, args.min_requests / rate) if rate > 0 else args.duration


def schedule(args: argparse.Namespace, rate: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    dur = step_duration(args, rate)
    if args.arrival == "poisson":
        return poisson(rate, dur, rng)
    if args.arrival == "gamma":
        return gamma_arrivals(rate, args.cv, dur, rng)
    if args.arrival == "trace":
        return trace_arrivals(rate, dur, rng, args._shape, args.trace_bucket_s)
    if args.arrival == "burst":
        return burst_arrivals(rate, args.burst_factor, dur, rng)
    raise ValueError(args.arrival)
