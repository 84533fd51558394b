"""Fluid (per-interval) simulation of every replica group: a day of 1,000s of GPUs in seconds.

Each ``dt_s`` step, for all models at once (numpy): arrivals ``A ~ Poisson(rate * dt)``; the ready
replicas drain at most their raw capacity (largest batches back to back); what exceeds it waits
while it can still meet the SLO (at most ``capacity * (slo - D99(max batch))`` requests, as the
SLO policy holds them) and the rest is shed (late). Of the served requests a share
``late_fraction(c, rate)`` misses the SLO (``autoscaler.queueing``: the batch-size fluctuation
tail), read from a per-class table. Autoscaling rounds run every ``tick_s`` through the same
:class:`sim.control.Controller` (so the same pure policies) as the request-level engine, with the
gateways' windows built from the sampled counts and ongoing requests from Little's law.

docs/simulator.md gives the error against the request-level engine and how cost grows.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

from autoscaler.queueing import late_fraction, steady_batch
from autoscaler.registry import make_autoscaler
from autoscaler.types import RateWindow, ServiceModel
from sim.control import Controller, ModelSpec, Observation
from sim.engine import SimConfig
from sim.metrics import ModelRecord, summarize
from sim.placement import FixedPool, PlacementHook

_C_BUCKETS = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128])
_R_POINTS = 400


class _LateTable:
    """late_fraction(service, c, rate) on a grid of per-replica rate x replica-count buckets."""

    def __init__(self, service: ServiceModel):
        cap = service.max_batch_size
        self.r_max = 1.05 * cap / service.curve.at(cap, "p50")
        self.r_step = self.r_max / (_R_POINTS - 1)
        grid = np.arange(_R_POINTS) * self.r_step
        self.table = np.array([[late_fraction(service, int(c), float(r) * int(c)) for r in grid]
                               for c in _C_BUCKETS])

    def lookup(self, c: np.ndarray, rate: np.ndarray) -> np.ndarray:
        cb = np.clip(np.searchsorted(_C_BUCKETS, c, side="right") - 1, 0, len(_C_BUCKETS) - 1)
        r = rate / np.maximum(c, 1)
        ri = np.minimum(np.ceil(r / self.r_step).astype(np.int64), _R_POINTS - 1)
        out = self.table[cb, ri]
        out[r > self.r_max] = 1.0
        out[c <= 0] = 1.0
        return np.where(rate > 0, out, 0.0)


def simulate_fluid(specs: list[ModelSpec], autoscaler: str, cfg: SimConfig, dt_s: float = 1.0,
                   placement: PlacementHook | None = None, progress=None) -> dict[str, Any]:
    rng = np.random.default_rng(cfg.seed)
    n = len(specs)
    interval = specs[0].arrivals.interval_s
    if any(abs(s.arrivals.interval_s - interval) > 1e-9 for s in specs):
        raise ValueError("fluid mode needs one rate interval for all models")
    steps_per_interval = interval / dt_s
    if abs(steps_per_interval - round(steps_per_interval)) > 1e-9 or cfg.tick_s / dt_s % 1:
        raise ValueError("dt_s must divide the rate interval and tick_s")
    n_int = max(len(s.arrivals.rates) for s in specs)
    rates = np.zeros((n_int, n))
    for j, s in enumerate(specs):
        rates[:len(s.arrivals.rates), j] = s.arrivals.rates
    duration = n_int * interval
    n_steps = int(round(duration / dt_s))
    n_min = int(math.ceil(duration / cfg.minute_s))
    recs = [ModelRecord(s.name, n_min, cfg.minute_s) for s in specs]
    ctl = Controller(make_autoscaler(autoscaler, **cfg.autoscaler_kwargs.get(autoscaler, {})), specs,
                     placement or FixedPool())

    classes: dict[ServiceModel, list[int]] = {}
    for j, s in enumerate(specs):
        classes.setdefault(s.service, []).append(j)
    tables = [(_LateTable(svc), np.array(idx)) for svc, idx in classes.items()]
    bmax = np.array([s.service.max_batch_size for s in specs], float)
    mu1 = bmax / np.array([s.service.curve.at(s.service.max_batch_size, "p50") for s in specs])
    hold_s = np.array([max(s.service.slo_s - s.service.curve.at(s.service.max_batch_size), 0.0) for s in specs])

    ready = np.array([s.initial_replicas for s in specs], np.int64)
    target = ready.copy()
    alloc = ready.astype(float)  # replicas holding a GPU (starting + ready)
    pending: list[tuple[float, int, int]] = []  # (ready_at, model, count)
    backlog = np.zeros(n)
    tick_steps = int(round(cfg.tick_s / dt_s))
    acc_arr = np.zeros(n)
    acc_q = np.zeros(n)
    acc_rate = np.zeros(n)
    last_tick = 0.0
    total_m = np.zeros((n_min, n))
    good_m = np.zeros((n_min, n))
    shed_tot = np.zeros(n)
    rs = np.zeros(n)
    gw = cfg.gateways

    for k in range(n_steps):
        t = k * dt_s
        while pending and pending[0][0] <= t + 1e-9:
            _, j, cnt = heapq.heappop(pending)
            ready[j] += cnt
        if k % tick_steps == 0:
            span = max(t - last_tick, 1e-9)
            obs = []
            for j, s in enumerate(specs):
                lam = acc_rate[j] / max(k - int(round(last_tick / dt_s)), 1)
                b = steady_batch(s.service, lam / max(ready[j], 1)) if lam > 0 else 0.0
                lat = 1.5 * s.service.curve.at(max(b, 1.0), "p50") if b is not None else s.service.slo_s
                ongoing = lam * lat + acc_q[j] / max(span / dt_s, 1)
                share = acc_arr[j] / gw
                wins = tuple(RateWindow(f"gw{g}", last_tick, t, share, 1.0 / gw) for g in range(gw)) if t > 0 else ()
                fut = s.arrivals.peak_rate(t, t + cfg.startup_s + cfg.tick_s)
                obs.append(Observation(int(target[j]), int(ready[j]), ongoing, wins, fut))
            grants = ctl.round(t, obs)
            for j, g in enumerate(grants):
                diff = g - int(target[j])
                if diff > 0:
                    heapq.heappush(pending, (t + cfg.startup_s, j, diff))
                elif diff < 0:  # drop starting replicas first (newest), then ready ones
                    drop = -diff
                    keep = []
                    for item in sorted((p for p in pending if p[1] == j), reverse=True):
                        take = min(drop, item[2])
                        drop -= take
                        if item[2] - take:
                            keep.append((item[0], j, item[2] - take))
                    pending = [p for p in pending if p[1] != j] + keep
                    heapq.heapify(pending)
                    ready[j] -= drop
                target[j] = g
                recs[j].tick(t, float(rates[min(int(t // interval), n_int - 1), j]), g, int(ready[j]))
            alloc = target.astype(float)
            acc_arr[:] = 0
            acc_q[:] = 0
            acc_rate[:] = 0
            last_tick = t
            if progress is not None:
                progress(t)
        lam = rates[int(t // interval)]
        a = rng.poisson(lam * dt_s).astype(float)
        cap = ready * mu1 * dt_s
        work = backlog + a
        served = np.minimum(work, cap)
        over = work - served
        backlog = np.minimum(over, ready * mu1 * hold_s)
        shed = over - backlog
        late = np.zeros(n)
        for tab, idx in tables:
            late[idx] = tab.lookup(ready[idx], lam[idx])
        late_n = np.minimum(shed + late * served, a + 1e-12)
        mi = int(t // cfg.minute_s)
        total_m[mi] += a
        good_m[mi] += np.maximum(a - late_n, 0.0)
        shed_tot += shed
        rs += alloc * dt_s
        acc_arr += a
        acc_q += backlog
        acc_rate += lam

    for j, r in enumerate(recs):
        r.minute_total = total_m[:, j].copy()
        r.minute_good = good_m[:, j].copy()
        r.replica_seconds = float(rs[j])
        r.shed = float(shed_tot[j])
    return {"summary": summarize(recs, duration, cfg.sla), "records": recs, "duration_s": duration,
            "placement": ctl.placement.report()}
