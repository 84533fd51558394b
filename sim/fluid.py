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
from collections.abc import Callable
from typing import Any

import numpy as np

from autoscaler.queueing import capacity_of, late_fraction, steady_batch
from autoscaler.registry import make_autoscaler
from autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
from sim.control import Controller, ModelSpec
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
        memo: dict = {}  # steady batches per rate, on-time batch limits per replica count: computed once
        self.table = np.array([[late_fraction(service, int(c), float(r) * int(c), memo) for r in grid]
                               for c in _C_BUCKETS])
        # mean latency at a per-replica rate: wait ~ half a batch + own batch (for Little's law)
        lat = []
        for r in grid:
            b = steady_batch(service, float(r))
            lat.append(1.5 * service.curve.at(max(b, 1.0), "p50") if b is not None else service.slo_s)
        self.latency = np.array(lat)

    def mean_latency(self, c: np.ndarray, rate: np.ndarray) -> np.ndarray:
        r = rate / np.maximum(c, 1)
        return self.latency[np.minimum(np.ceil(r / self.r_step).astype(np.int64), _R_POINTS - 1)]

    def lookup(self, c: np.ndarray, rate: np.ndarray) -> np.ndarray:
        cb = np.clip(np.searchsorted(_C_BUCKETS, c, side="right") - 1, 0, len(_C_BUCKETS) - 1)
        r = rate / np.maximum(c, 1)
        ri = np.minimum(np.ceil(r / self.r_step).astype(np.int64), _R_POINTS - 1)
        out = self.table[cb, ri]
        out[r > self.r_max] = 1.0
        out[c <= 0] = 1.0
        return np.where(rate > 0, out, 0.0)


_TABLES: dict[ServiceModel, _LateTable] = {}


def _with_fallback(service: ServiceModel, c: np.ndarray, rate: np.ndarray, late: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Late share and fallback share of a model with a cheaper variant, from the primary's late share.

    Within the primary's SLO capacity nothing changes. Above it the batcher serves a share ``x`` with
    the fallback, the least that fits: ``(1 - x) / cap_primary + x / cap_fallback = 1 / rate``, and
    runs at the SLO's edge (``1 - slo_percentile`` late); when even ``x = 1`` does not fit, the
    fallback's own late share applies."""
    fb = service.fallback
    edge = 1.0 - service.slo_percentile
    over = late > edge
    if not over.any():
        return late, np.zeros_like(late)
    cl = np.array([capacity_of(service, int(k)) for k in c])
    cs = np.array([capacity_of(fb, int(k)) for k in c])
    inv_l = 1.0 / np.maximum(cl, 1e-9)
    inv_s = 1.0 / np.maximum(cs, 1e-9)
    x = np.clip((inv_l - 1.0 / np.maximum(rate, 1e-9)) / np.maximum(inv_l - inv_s, 1e-12), 0.0, 1.0)
    late_fb = _late_table(fb).lookup(c, rate)
    return (np.where(over, np.maximum(edge, np.where(x >= 1.0, late_fb, 0.0)), late),
            np.where(over & (c > 0), x, 0.0))


def _late_table(service: ServiceModel) -> _LateTable:
    """One table per service model, shared by every run of a process (a build costs ~1 s)."""
    tab = _TABLES.get(service)
    if tab is None:
        tab = _TABLES[service] = _LateTable(service)
    return tab


def simulate_fluid(specs: list[ModelSpec], autoscaler: str, cfg: SimConfig, dt_s: float = 1.0,
                   placement: PlacementHook | None = None, progress=None,
                   controller_cls: Callable[..., Controller] = Controller) -> dict[str, Any]:
    """``controller_cls`` builds the round's driver (``sim.bound`` passes one that feeds the oracle hindsight)."""
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
    n_steps = round(duration / dt_s)
    n_min = math.ceil(duration / cfg.minute_s)
    recs = [ModelRecord(s.name, n_min, cfg.minute_s) for s in specs]
    ctl = controller_cls(make_autoscaler(autoscaler, **cfg.autoscaler_kwargs.get(autoscaler, {})), specs,
                     placement or FixedPool())

    classes: dict[ServiceModel, list[int]] = {}
    for j, s in enumerate(specs):
        classes.setdefault(s.service, []).append(j)
    tables = [(_late_table(svc), np.array(idx), svc) for svc, idx in classes.items()]
    raw = [s.service.fallback or s.service for s in specs]  # under a backlog the batcher serves the cheapest
    bmax = np.array([r.max_batch_size for r in raw], float)
    mu1 = bmax / np.array([r.curve.at(r.max_batch_size, "p50") for r in raw])
    hold_s = np.array([max(r.slo_s - r.curve.at(r.max_batch_size), 0.0) for r in raw])
    fb_x = np.zeros(n)  # share of the served requests answered by the fallback variant, this step
    fb_tot = np.zeros(n)

    ready = np.array([s.initial_replicas for s in specs], np.int64)
    target = ready.copy()
    pending: list[tuple[float, int, int]] = []  # (ready_at, model, count)
    backlog = np.zeros(n)
    tick_steps = round(cfg.tick_s / dt_s)
    n_ticks = math.ceil(n_steps / tick_steps)
    total_m = np.zeros((n_min, n))
    good_m = np.zeros((n_min, n))
    shed_tot = np.zeros(n)
    rs = np.zeros(n)
    ser_target = np.zeros((n_ticks, n), np.int64)
    ser_ready = np.zeros((n_ticks, n), np.int64)
    gws = [f"gw{g}" for g in range(cfg.gateways)]
    share_w = 1.0 / cfg.gateways
    svc = [s.service for s in specs]
    names = [s.name for s in specs]
    mins = [s.min_replicas for s in specs]
    maxs = [s.max_replicas for s in specs]
    blk_arr = np.zeros(n)
    blk_q = np.zeros(n)
    blk_lam = np.zeros(n)
    late = np.zeros(n)
    cap_step = hold_cap = None
    late_key = None

    def apply(j: int, g: int, now: float) -> None:
        """Model ``j`` is granted ``g`` replicas at ``now``: start or drop the difference."""
        diff = g - int(target[j])
        if diff > 0:
            heapq.heappush(pending, (now + cfg.startup_s + ctl.placement.start_delay_s.get(names[j], 0.0), j, diff))
        elif diff < 0:  # drop starting replicas first (newest), then ready ones
            drop = -diff
            keep = []
            for item in sorted((p for p in pending if p[1] == j), reverse=True):
                take = min(drop, item[2])
                drop -= take
                if item[2] - take:
                    keep.append((item[0], j, item[2] - take))
            pending[:] = [p for p in pending if p[1] != j] + keep
            heapq.heapify(pending)
            ready[j] -= drop
        target[j] = g

    for tk in range(n_ticks):
        t = tk * tick_steps * dt_s
        # ---- autoscaling round, on what the previous block measured
        lat = np.zeros(n)
        for tab, idx, _ in tables:
            lat[idx] = tab.mean_latency(np.maximum(ready[idx], 1), blk_lam[idx])
        ongoing = blk_lam * lat + blk_q
        i0 = min(int(t // interval), n_int - 1)
        i1 = min(int((t + cfg.startup_s + cfg.tick_s) // interval), n_int - 1)
        fut = rates[i0:i1 + 1].max(axis=0).tolist()
        share = (blk_arr * share_w).tolist()
        ongoing_l = ongoing.tolist()
        t_prev = t - cfg.tick_s
        tgt_l, ready_l = target.tolist(), ready.tolist()
        snaps = [ScalingSnapshot(names[j], tgt_l[j], ready_l[j], svc[j], ongoing_l[j],
                                 tuple([RateWindow(g, t_prev, t, share[j], share_w) for g in gws]) if tk else (),
                                 mins[j], maxs[j], fut[j]) for j in range(n)]
        grants = ctl.round_snapshots(t, snaps)
        for j, g in enumerate(grants):
            apply(j, g, t)
        ser_target[tk] = target
        ser_ready[tk] = ready
        alloc = target.astype(float)
        if progress is not None:
            progress(t)
        # ---- the block of steps until the next round
        k0, k1 = tk * tick_steps, min((tk + 1) * tick_steps, n_steps)
        blk_arr[:] = 0
        blk_q[:] = 0
        blk_lam[:] = 0
        for k in range(k0, k1):
            tt = k * dt_s
            changed = False
            while pending and pending[0][0] <= tt + 1e-9:
                _, j, cnt = heapq.heappop(pending)
                ready[j] += cnt
                changed = True
            ii = int(tt // interval)
            if changed or late_key != ii or cap_step is None:
                lam = rates[ii]
                for tab, idx, sv in tables:
                    late[idx] = tab.lookup(ready[idx], lam[idx])
                    if sv.fallback is not None:
                        late[idx], fb_x[idx] = _with_fallback(sv, ready[idx], lam[idx], late[idx])
                cap_step = ready * mu1 * dt_s
                hold_cap = ready * mu1 * hold_s
                late_key = ii
            a = rng.poisson(lam * dt_s).astype(float)
            work = backlog + a
            served = np.minimum(work, cap_step)
            over = work - served
            backlog = np.minimum(over, hold_cap)
            shed = over - backlog
            late_n = np.minimum(shed + late * served, a)
            fb_tot += fb_x * served
            mi = int(tt // cfg.minute_s)
            total_m[mi] += a
            good_m[mi] += a - late_n
            shed_tot += shed
            blk_arr += a
            blk_q += backlog
            blk_lam += lam
        steps = max(k1 - k0, 1)
        rs += alloc * (steps * dt_s)
        blk_q /= steps
        blk_lam /= steps

    ctl.placement.finish(duration)  # a hook with its own clock (sim/harvest.py) runs to the end
    t_ser = [tk * tick_steps * dt_s for tk in range(n_ticks)]
    idx = np.minimum((np.array(t_ser) // interval).astype(int), n_int - 1)  # each tick's trace interval
    for j, r in enumerate(recs):
        r.minute_total = total_m[:, j].copy()
        r.minute_good = good_m[:, j].copy()
        r.replica_seconds = float(rs[j])
        r.shed = float(shed_tot[j])
        r.fallback = float(fb_tot[j])
        r.series_t = t_ser
        r.series_target = ser_target[:, j].tolist()
        r.series_ready = ser_ready[:, j].tolist()
        r.series_rate = rates[idx, j].tolist()
        r.scale_events = int((np.diff(ser_target[:, j]) != 0).sum())
    return {"summary": summarize(recs, duration, cfg.sla), "records": recs, "duration_s": duration,
            "placement": ctl.placement.report()}
