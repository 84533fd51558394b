"""Fluid (per-interval) simulation of every replica group: a day of 1,000s of GPUs in seconds.

Each ``dt_s`` step, for all models at once (numpy): arrivals ``A ~ Poisson(rate * dt)``; the ready
replicas drain at most their raw capacity (largest batches back to back); what exceeds it waits
while it can still meet the SLO (at most ``capacity * (slo - D99(max batch))`` requests, as the
SLO policy holds them) and the rest is shed (late). Of the served requests a share
``late_fraction(c, rate)`` misses the SLO (``sloserve.autoscaler.queueing``: the batch-size fluctuation
tail), read from a per-class table. Autoscaling rounds run every ``tick_s`` through the same
:class:`sloserve.sim.control.Controller` (so the same pure policies) as the request-level engine, with the
gateways' windows built from the sampled counts and ongoing requests from Little's law.

docs/simulator.md gives the error against the request-level engine and how cost grows.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from sloserve.autoscaler.queueing import capacity_of, late_fraction, steady_batch
from sloserve.autoscaler.registry import make_autoscaler
from sloserve.autoscaler.types import RateWindow, ScalingSnapshot, ServiceModel
from sloserve.sim.control import Controller, ModelSpec
from sloserve.sim.engine import SimConfig
from sloserve.sim.metrics import ModelRecord, summarize
from sloserve.sim.placement import FixedPool, PlacementHook

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
        self.table = np.array(
            [[late_fraction(service, int(c), float(r) * int(c), memo) for r in grid] for c in _C_BUCKETS]
        )
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


def _with_fallback(
    service: ServiceModel, c: np.ndarray, rate: np.ndarray, late: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Late share and fallback share of a model with a cheaper variant, from the primary's late share.

    Within the primary's SLO capacity nothing changes. Above it the batcher serves a share ``x`` with
    the fallback, the least that fits: ``(1 - x) / cap_primary + x / cap_fallback = 1 / rate``, and
    runs at the SLO's edge (``1 - slo_percentile`` late); when even ``x = 1`` does not fit, the
    fallback's own late share applies."""
    fb = service.fallback
    if fb is None:
        raise ValueError("_with_fallback needs a service with a fallback variant")
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
    return (np.where(over, np.maximum(edge, np.where(x >= 1.0, late_fb, 0.0)), late), np.where(over & (c > 0), x, 0.0))


def _late_table(service: ServiceModel) -> _LateTable:
    """One table per service model, shared by every run of a process (a build costs ~1 s)."""
    tab = _TABLES.get(service)
    if tab is None:
        tab = _TABLES[service] = _LateTable(service)
    return tab


def simulate_fluid(
    specs: list[ModelSpec],
    autoscaler: str,
    cfg: SimConfig,
    dt_s: float = 1.0,
    placement: PlacementHook | None = None,
    progress=None,
    controller_cls: Callable[..., Controller] = Controller,
) -> dict[str, Any]:
    """``controller_cls`` builds the round's driver (``sloserve.sim.bound`` passes one that feeds the oracle hindsight)."""
    run = _FluidRun(specs, cfg, dt_s)
    ctl = controller_cls(
        make_autoscaler(autoscaler, **cfg.autoscaler_kwargs.get(autoscaler, {})), specs, placement or FixedPool()
    )
    for tk in range(run.n_ticks):
        t = tk * run.tick_steps * dt_s
        run.round(ctl, tk, t)
        if progress is not None:
            progress(t)
        run.block(ctl, tk)
    ctl.placement.finish(run.duration)  # a hook with its own clock (sloserve/sim/harvest.py) runs to the end
    recs = run.records()
    return {
        "summary": summarize(recs, run.duration, cfg.sla),
        "records": recs,
        "duration_s": run.duration,
        "placement": ctl.placement.report(),
    }


class _FluidRun:
    """The state of one fluid run: every model's rates, replicas, backlog and counters, as arrays."""

    def __init__(self, specs: list[ModelSpec], cfg: SimConfig, dt_s: float):
        self.specs, self.cfg, self.dt_s = specs, cfg, dt_s
        self.rng = np.random.default_rng(cfg.seed)
        n = self.n = len(specs)
        interval = self.interval = specs[0].arrivals.interval_s
        if any(abs(s.arrivals.interval_s - interval) > 1e-9 for s in specs):
            raise ValueError("fluid mode needs one rate interval for all models")
        steps_per_interval = interval / dt_s
        if abs(steps_per_interval - round(steps_per_interval)) > 1e-9 or cfg.tick_s / dt_s % 1:
            raise ValueError("dt_s must divide the rate interval and tick_s")
        n_int = self.n_int = max(len(s.arrivals.rates) for s in specs)
        self.rates = np.zeros((n_int, n))
        for j, s in enumerate(specs):
            self.rates[: len(s.arrivals.rates), j] = s.arrivals.rates
        self.duration = n_int * interval
        self.n_steps = round(self.duration / dt_s)
        n_min = math.ceil(self.duration / cfg.minute_s)
        self.recs = [ModelRecord(s.name, n_min, cfg.minute_s) for s in specs]
        classes: dict[ServiceModel, list[int]] = {}
        for j, s in enumerate(specs):
            classes.setdefault(s.service, []).append(j)
        self.tables = [(_late_table(svc), np.array(idx), svc) for svc, idx in classes.items()]
        raw = [s.service.fallback or s.service for s in specs]  # under a backlog the batcher serves the cheapest
        bmax = np.array([r.max_batch_size for r in raw], float)
        self.mu1 = bmax / np.array([r.curve.at(r.max_batch_size, "p50") for r in raw])
        self.hold_s = np.array([max(r.slo_s - r.curve.at(r.max_batch_size), 0.0) for r in raw])
        self.fb_x = np.zeros(n)  # share of the served requests answered by the fallback variant, this step
        self.fb_tot = np.zeros(n)
        self.ready = np.array([s.initial_replicas for s in specs], np.int64)
        self.target = self.ready.copy()
        self.pending: list[tuple[float, int, int]] = []  # (ready_at, model, count)
        self.backlog = np.zeros(n)
        self.tick_steps = round(cfg.tick_s / dt_s)
        self.n_ticks = math.ceil(self.n_steps / self.tick_steps)
        self.total_m = np.zeros((n_min, n))
        self.good_m = np.zeros((n_min, n))
        self.shed_tot = np.zeros(n)
        self.rs = np.zeros(n)
        self.ser_target = np.zeros((self.n_ticks, n), np.int64)
        self.ser_ready = np.zeros((self.n_ticks, n), np.int64)
        self.gws = [f"gw{g}" for g in range(cfg.gateways)]
        self.share_w = 1.0 / cfg.gateways
        self.blk_arr = np.zeros(n)
        self.blk_sq = np.zeros(n)  # sum of squared per-step arrivals (the block's dispersion)
        self.blk_steps = 0
        self.blk_q = np.zeros(n)
        self.blk_lam = np.zeros(n)
        self.late = np.zeros(n)
        self.cap_step: np.ndarray | None = None
        self.hold_cap: np.ndarray | None = None
        self.late_key: int | None = None
        self.alloc = self.target.astype(float)
        # lanes of a model on several device types (sloserve/sim/typesize.py): columns sharing one arrival stream
        groups: dict[str, list[int]] = {}
        for j, s in enumerate(specs):
            if s.group:
                groups.setdefault(s.group, []).append(j)
        self.groups = [(np.array(cols), [specs[j].service for j in cols]) for cols in groups.values()]

    def lane_rates(self, lam: np.ndarray) -> np.ndarray:
        """The step's rates with each model's stream routed over its lanes (``sloserve.sim.typesize.route``)."""
        if not self.groups:
            return lam
        from sloserve.sim.typesize import route

        lam = lam.copy()
        for cols, services in self.groups:
            lam[cols] = route(float(lam[cols[0]]), services, self.ready[cols].tolist())
        return lam

    def apply(self, ctl: Controller, j: int, g: int, now: float) -> None:
        """Model ``j`` is granted ``g`` replicas at ``now``: start or drop the difference."""
        pending, target = self.pending, self.target
        diff = g - int(target[j])
        if diff > 0:
            start = now + self.cfg.startup_s + ctl.placement.start_delay_s.get(self.specs[j].name, 0.0)
            heapq.heappush(pending, (start, j, diff))
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
            self.ready[j] -= drop
        target[j] = g

    def round(self, ctl: Controller, tk: int, t: float) -> None:
        """The autoscaling round at ``t``, on what the previous block measured."""
        cfg, specs, n = self.cfg, self.specs, self.n
        lat = np.zeros(n)
        for tab, idx, _ in self.tables:
            lat[idx] = tab.mean_latency(np.maximum(self.ready[idx], 1), self.blk_lam[idx])
        ongoing = self.blk_lam * lat + self.blk_q
        i0 = min(int(t // self.interval), self.n_int - 1)
        i1 = min(int((t + cfg.startup_s + cfg.tick_s) // self.interval), self.n_int - 1)
        fut = self.rates[i0 : i1 + 1].max(axis=0).tolist()
        arr = self.blk_arr.copy()
        for cols, _ in self.groups:  # each lane's autoscaler sees its model's whole demand
            arr[cols] = arr[cols].sum()
        share = (arr * self.share_w).tolist()
        # each gateway's view of the block's per-step counts: a 1/n random split of the stream's
        steps = max(self.blk_steps, 1)
        mean = self.blk_arr / steps
        with np.errstate(invalid="ignore", divide="ignore"):
            whole = np.where(mean > 0, np.maximum(self.blk_sq / steps - mean * mean, 0.0) / mean, 1.0)
        disp = (
            1.0 + self.share_w * (whole - 1.0) if steps > 1 else np.ones(n)
        ).tolist()  # sloserve.autoscaler.burst.thinned
        ongoing_l = ongoing.tolist()
        t_prev = t - cfg.tick_s
        tgt_l, ready_l = self.target.tolist(), self.ready.tolist()
        snaps = [
            ScalingSnapshot(
                s.name,
                tgt_l[j],
                ready_l[j],
                s.service,
                ongoing_l[j],
                tuple([RateWindow(g, t_prev, t, share[j], self.share_w, disp[j], self.dt_s) for g in self.gws])
                if tk
                else (),
                s.min_replicas,
                s.max_replicas,
                fut[j],
                s.split,
            )
            for j, s in enumerate(specs)
        ]
        grants = ctl.round_snapshots(t, snaps)
        for j, g in enumerate(grants):
            self.apply(ctl, j, g, t)
        self.ser_target[tk] = self.target
        self.ser_ready[tk] = self.ready
        self.alloc = self.target.astype(float)

    def block(self, ctl: Controller, tk: int) -> None:
        """The steps until the next round: arrivals, service, backlog, shedding, lateness."""
        cfg, dt_s, rates = self.cfg, self.dt_s, self.rates
        k0, k1 = tk * self.tick_steps, min((tk + 1) * self.tick_steps, self.n_steps)
        blk_arr, blk_q, blk_lam = self.blk_arr, self.blk_q, self.blk_lam
        blk_arr[:] = 0
        self.blk_sq[:] = 0
        blk_q[:] = 0
        blk_lam[:] = 0
        pending, ready, late = self.pending, self.ready, self.late
        lam = rates[0]
        for k in range(k0, k1):
            tt = k * dt_s
            changed = False
            while pending and pending[0][0] <= tt + 1e-9:
                _, j, cnt = heapq.heappop(pending)
                ready[j] += cnt
                changed = True
            ii = int(tt // self.interval)
            if changed or self.late_key != ii or self.cap_step is None or self.hold_cap is None or self.groups:
                lam = self.lane_rates(rates[ii])
                for tab, idx, sv in self.tables:
                    late[idx] = tab.lookup(ready[idx], lam[idx])
                    if sv.fallback is not None:
                        late[idx], self.fb_x[idx] = _with_fallback(sv, ready[idx], lam[idx], late[idx])
                self.cap_step = ready * self.mu1 * dt_s
                self.hold_cap = ready * self.mu1 * self.hold_s
                self.late_key = ii
            else:
                lam = rates[ii]
            a = self.rng.poisson(lam * dt_s).astype(float)
            work = self.backlog + a
            served = np.minimum(work, self.cap_step)
            over = work - served
            self.backlog = np.minimum(over, self.hold_cap)
            shed = over - self.backlog
            late_n = np.minimum(shed + late * served, a)
            self.fb_tot += self.fb_x * served
            mi = int(tt // cfg.minute_s)
            self.total_m[mi] += a
            self.good_m[mi] += a - late_n
            self.shed_tot += shed
            blk_arr += a
            self.blk_sq += a * a
            blk_q += self.backlog
            blk_lam += lam
        steps = max(k1 - k0, 1)
        self.blk_steps = k1 - k0
        self.rs += self.alloc * (steps * dt_s)
        blk_q /= steps
        blk_lam /= steps

    def records(self) -> list[ModelRecord]:
        t_ser = [tk * self.tick_steps * self.dt_s for tk in range(self.n_ticks)]
        idx = np.minimum((np.array(t_ser) // self.interval).astype(int), self.n_int - 1)  # each tick's interval
        for j, r in enumerate(self.recs):
            r.minute_total = self.total_m[:, j].copy()
            r.minute_good = self.good_m[:, j].copy()
            r.replica_seconds = float(self.rs[j])
            r.shed = float(self.shed_tot[j])
            r.fallback = float(self.fb_tot[j])
            r.series_t = t_ser
            r.series_target = self.ser_target[:, j].tolist()
            r.series_ready = self.ser_ready[:, j].tolist()
            r.series_rate = self.rates[idx, j].tolist()
            r.scale_events = int((np.diff(self.ser_target[:, j]) != 0).sum())
        return self.recs
