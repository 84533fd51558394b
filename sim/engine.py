"""Request-level discrete-event simulation: every request, the real batching policy, in virtual time.

Events (a heap ordered by time, then sequence number, so runs are deterministic under a seed):
an arrival, a batch completion, a replica becoming ready, a batching policy's ``Wait(until)``
wake-up, and an autoscaling round every ``tick_s``. After each event touching a model the driver
calls the model's batching policy ``plan(QueueView, now)`` until it answers ``Wait`` -- the same
calls the live ``batching.batcher`` makes -- and samples each batch's latency from the profile
(log-normal through its p50 and p99).

>>> from sim.arrivals import poisson
>>> from sim.profiles import default_profiles, service_for
>>> from sim.control import ModelSpec
>>> svc = service_for(default_profiles(), "gpt2-gen", "t4", slo_ms=1000)
>>> spec = ModelSpec("m", poisson(20.0, 120.0), svc, "t4")
>>> out = simulate_requests([spec], "oracle", SimConfig(seed=1))
>>> out["summary"]["slo_attainment"] > 0.9
True
"""

from __future__ import annotations

import heapq
import inspect
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoscaler.registry import make_autoscaler
from autoscaler.types import RateWindow, ScalingSnapshot
from batching.policy import POLICIES, make_policy
from batching.types import BatchResult, Dispatch, QueuedItem, QueueView, Shed
from sim.control import Controller, ModelSpec, Observation
from sim.metrics import ModelRecord, summarize
from sim.placement import FixedPool, PlacementHook

VARIANT = "default"
FALLBACK = "fallback"
_ARRIVE, _DONE, _READY, _WAKE, _TICK, _CHECK = 0, 1, 2, 3, 4, 5
_Z99 = 2.3263


@dataclass(frozen=True)
class SimConfig:
    """Knobs of a simulation run (both modes)."""

    startup_s: float = 10.0  # replica start-up (model load) time
    tick_s: float = 10.0  # seconds between autoscaling rounds
    gateways: int = 2  # gateways splitting each model's traffic (partial views)
    batching: str = ""  # batching policy name; "" = "slo" when registered, else "timeout"
    batching_kwargs: dict = field(default_factory=dict)
    autoscaler_kwargs: dict = field(default_factory=dict)
    seed: int = 0
    minute_s: float = 60.0
    sla: float = 0.99
    # between rounds (both modes; a policy opts in through ScaleDecision.recheck_above_rps): how often
    # the controller sees fresh gateway rates, and how old they are when it does (live: the replicas
    # push their metrics every second, the controller loop runs every 0.1 s)
    check_every_s: float = 1.0
    report_lag_s: float = 1.0


def batching_policy_for(cfg: SimConfig, spec: ModelSpec):
    name = cfg.batching or ("slo" if "slo" in POLICIES else "timeout")
    factory = POLICIES[name]
    curves = _curves(spec)
    offered = {"max_batch_size": spec.service.max_batch_size, "default_variant": VARIANT,
               "latency_fn": lambda variant, rows: curves[variant].at(rows, "p99"), "model": spec.name,
               "device_type": spec.device_type, "variants": list(curves), **cfg.batching_kwargs}
    if len(curves) > 1:  # rank the variants for the policy: the primary first
        offered.setdefault("accuracy", {VARIANT: 1.0, FALLBACK: 0.5})
    try:
        params = inspect.signature(factory).parameters
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            offered = {k: v for k, v in offered.items() if k in params}
    except (TypeError, ValueError):
        pass
    return make_policy(name, **offered)


def _curves(spec: ModelSpec) -> dict:
    """The model's variants and their curves: the primary, and the fallback when it has one. Every
    replica holds both (the fallback is the smaller model) and runs the one the policy picks."""
    svc = spec.service
    return {VARIANT: svc.curve} if svc.fallback is None else {VARIANT: svc.curve, FALLBACK: svc.fallback.curve}


class _Replica:
    __slots__ = ("batch", "busy_until", "draining", "ready", "started", "variant")

    def __init__(self):
        self.ready = False
        self.busy_until = 0.0
        self.started = 0.0
        self.draining = False
        self.batch: tuple = ()
        self.variant = VARIANT


class _Model:
    def __init__(self, spec: ModelSpec, policy, rec: ModelRecord, gateways: int):
        self.spec = spec
        self.policy = policy
        self.rec = rec
        self.queue: list[QueuedItem] = []
        self.replicas: list[_Replica] = []
        self.wake_at: float | None = None
        self.in_system = 0
        self.last_change = 0.0
        self.ongoing_acc = 0.0
        self.gw_counts = [0] * gateways
        self.alloc_since = 0.0
        self.curves = _curves(spec)
        self.allowed = tuple(self.curves)

    def account(self, now: float) -> None:
        self.ongoing_acc += self.in_system * (now - self.last_change)
        self.last_change = now

    def hold(self, now: float) -> None:  # replica-seconds up to now, before the count changes
        self.rec.replica_seconds += len(self.replicas) * (now - self.alloc_since)
        self.alloc_since = now


def simulate_requests(specs: list[ModelSpec], autoscaler: str, cfg: SimConfig,
                      placement: PlacementHook | None = None, progress=None) -> dict[str, Any]:
    """Simulate every request of ``specs`` under ``autoscaler``; returns summary, records, timing."""
    rng = np.random.default_rng(cfg.seed)
    duration = max(s.arrivals.duration_s for s in specs)
    n_min = math.ceil(duration / cfg.minute_s)
    ctl = Controller(make_autoscaler(autoscaler, **cfg.autoscaler_kwargs.get(autoscaler, {})), specs,
                     placement or FixedPool())
    models = [_Model(s, batching_policy_for(cfg, s), ModelRecord(s.name, n_min, cfg.minute_s), cfg.gateways)
              for s in specs]
    heap: list = []
    seq = 0

    def push(t, kind, mi, payload=None):
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, mi, payload))

    arrivals = []
    for mi, (s, m) in enumerate(zip(specs, models)):
        times = s.arrivals.sample_times(rng)
        arrivals.append(times)
        if len(times):
            push(float(times[0]), _ARRIVE, mi, 0)
        for _ in range(s.initial_replicas):
            r = _Replica()
            r.ready = True
            m.replicas.append(r)
    gw_of = [rng.integers(0, cfg.gateways, len(t)) for t in arrivals]
    push(0.0, _TICK, -1)
    next_id = 0
    last_tick = 0.0
    end = duration + 5 * max(s.service.slo_s for s in specs)

    def pump(m: _Model, mi: int, now: float) -> None:
        svc = m.spec.service
        while True:
            idle = [r for r in m.replicas if r.ready and not r.draining and r.busy_until <= now and not r.batch]
            busy = [r.busy_until for r in m.replicas if r.batch]
            view = QueueView(m.spec.name, m.queue, dict.fromkeys(m.curves, len(idle)), svc.max_batch_size,
                             dict.fromkeys(m.curves, busy), shared=len(m.curves) > 1)
            d = m.policy.plan(view, now)
            if isinstance(d, Dispatch):
                if not idle or not d.ids:
                    return
                ids = set(d.ids)
                batch = tuple(it for it in m.queue if it.id in ids)
                m.queue = [it for it in m.queue if it.id not in ids]
                rows = sum(it.size for it in batch)
                curve = m.curves.get(d.variant, svc.curve)
                if d.variant == FALLBACK:
                    m.rec.fallback += rows
                p50 = curve.at(rows, "p50")
                sigma = math.log(max(curve.at(rows, "p99") / p50, 1.0)) / _Z99
                lat = p50 * math.exp(sigma * float(rng.standard_normal()))
                r = idle[0]
                r.busy_until = now + lat
                r.started = now
                r.batch = batch
                r.variant = d.variant
                push(now + lat, _DONE, mi, r)
            elif isinstance(d, Shed):
                ids = set(d.ids)
                for it in m.queue:
                    if it.id in ids:
                        m.rec.minute_total[int(it.arrival_s // cfg.minute_s)] += 1
                        m.rec.shed += 1
                m.account(now)
                before = len(m.queue)
                m.queue = [it for it in m.queue if it.id not in ids]
                m.in_system -= before - len(m.queue)
                if before == len(m.queue):
                    return
            else:
                if d.until_s is not None and d.until_s > now and (m.wake_at is None or d.until_s < m.wake_at):
                    m.wake_at = d.until_s
                    push(d.until_s, _WAKE, mi)
                return

    while heap:
        now, _, kind, mi, payload = heapq.heappop(heap)
        if now > end:
            break
        if kind == _TICK:
            obs = []
            for m, s in zip(models, specs):
                m.account(now)
                span = max(now - last_tick, 1e-9)
                wins = tuple(RateWindow(f"gw{g}", last_tick, now, c, 1.0 / cfg.gateways)
                             for g, c in enumerate(m.gw_counts)) if now > last_tick else ()
                m.gw_counts = [0] * cfg.gateways
                ready = sum(1 for r in m.replicas if r.ready and not r.draining)
                target = sum(1 for r in m.replicas if not r.draining)
                obs.append(Observation(target, ready, m.ongoing_acc / span, wins,
                                       s.arrivals.peak_rate(now, now + cfg.startup_s + cfg.tick_s)))
                m.ongoing_acc = 0.0
            grants = ctl.round(now, obs)
            delays = ctl.placement.start_delay_s  # e.g. waiting for a preempted GPU, as in fluid mode
            for mi2, (m, g) in enumerate(zip(models, grants)):
                _resize(m, g, now, cfg.startup_s + delays.get(m.spec.name, 0.0),
                        lambda t, r, i=mi2: push(t, _READY, i, r))
                m.rec.tick(now, m.spec.arrivals.rate_at(now), g, obs[mi2].ready)
                pump(m, mi2, now)
            last_tick = now
            if now + cfg.tick_s <= duration:
                push(now + cfg.tick_s, _TICK, -1)
            if ctl.rechecking and cfg.check_every_s < cfg.tick_s - 1e-9:
                push(now + cfg.check_every_s, _CHECK, -1)
            if progress is not None:
                progress(now)
            continue
        if kind == _CHECK:  # between rounds: the policy's up-check where a short window crossed its trigger
            for mi2, g in _check_up(ctl, models, arrivals, gw_of, cfg, now):
                m = models[mi2]
                _resize(m, g, now, cfg.startup_s + ctl.placement.start_delay_s.get(m.spec.name, 0.0),
                        lambda t, r, i=mi2: push(t, _READY, i, r))
                pump(m, mi2, now)
            if now + cfg.check_every_s < last_tick + cfg.tick_s - 1e-9:
                push(now + cfg.check_every_s, _CHECK, -1)
            continue
        m = models[mi]
        if kind == _ARRIVE:
            i = payload
            t_arr = now
            m.account(now)
            m.queue.append(QueuedItem(next_id, t_arr, t_arr + m.spec.service.slo_s, 1, 0, m.allowed))
            next_id += 1
            m.in_system += 1
            m.gw_counts[int(gw_of[mi][i])] += 1
            if i + 1 < len(arrivals[mi]):
                push(float(arrivals[mi][i + 1]), _ARRIVE, mi, i + 1)
        elif kind == _DONE:
            r = payload
            m.account(now)
            slo = m.spec.service.slo_s
            good = 0
            for it in r.batch:
                k = int(it.arrival_s // cfg.minute_s)
                m.rec.minute_total[k] += 1
                if now - it.arrival_s <= slo + 1e-12:
                    m.rec.minute_good[k] += 1
                    good += 1
            m.in_system -= len(r.batch)
            m.policy.observe(BatchResult(m.spec.name, r.variant, len(r.batch), now - r.started, now,
                                         device_type=m.spec.device_type, late_rows=len(r.batch) - good))
            r.batch = ()
            if r.draining:
                m.hold(now)
                m.replicas.remove(r)
        elif kind == _READY:
            if payload in m.replicas:
                payload.ready = True
        elif kind == _WAKE:
            if m.wake_at is None or now < m.wake_at - 1e-12:
                continue
            m.wake_at = None
        pump(m, mi, now)

    ctl.placement.finish(duration)  # a hook with its own clock (sim/harvest.py) runs to the end
    for m in models:
        m.hold(duration)
        for it in m.queue:  # never served
            m.rec.minute_total[min(int(it.arrival_s // cfg.minute_s), n_min - 1)] += 1
    records = [m.rec for m in models]
    return {"summary": summarize(records, duration, cfg.sla), "records": records, "duration_s": duration,
            "placement": ctl.placement.report()}


def _check_up(ctl: Controller, models: list[_Model], arrivals: list, gw_of: list, cfg: SimConfig,
              now: float) -> list[tuple[int, int]]:
    """The up-checks of the models whose arrivals over their window (ending ``report_lag_s`` ago)
    exceed their trigger: ``[(model, granted target)]`` for those whose target changed."""
    fired, snaps = [], []
    t1 = now - cfg.report_lag_s
    for i, (m, times) in enumerate(zip(models, arrivals)):
        trig, w = ctl.recheck_rps[i], ctl.recheck_window_s[i]
        t0 = t1 - w
        if trig == math.inf or t0 < 0:
            continue
        lo, hi = np.searchsorted(times, [t0, t1])
        if hi - lo <= trig * w:
            continue
        counts = np.bincount(gw_of[i][lo:hi], minlength=cfg.gateways)
        s = m.spec
        live = [r for r in m.replicas if not r.draining]
        snaps.append(ScalingSnapshot(s.name, len(live), sum(1 for r in live if r.ready), s.service,
                                     float(m.in_system),
                                     tuple(RateWindow(f"gw{g}", t0, t1, float(c), 1.0 / cfg.gateways)
                                           for g, c in enumerate(counts.tolist())),
                                     s.min_replicas, s.max_replicas, None))
        fired.append(i)
    if not fired:
        return []
    targets = [sum(1 for r in m.replicas if not r.draining) for m in models]
    grants = ctl.check_up(now, fired, snaps, targets)
    return [(i, g) for i, g in zip(fired, grants) if g != targets[i]]


def _resize(m: _Model, target: int, now: float, startup_s: float, on_start) -> None:
    live = [r for r in m.replicas if not r.draining]
    if target == len(live):
        return
    m.hold(now)
    if target > len(live):
        for _ in range(target - len(live)):
            r = _Replica()
            m.replicas.append(r)
            if startup_s <= 0:
                r.ready = True
            else:
                on_start(now + startup_s, r)
        return
    drop = len(live) - target
    order = ([r for r in reversed(live) if not r.ready] + [r for r in live if r.ready and not r.batch]
             + [r for r in live if r.batch])
    for r in order[:drop]:
        if r.batch:
            r.draining = True
        else:
            m.replicas.remove(r)
