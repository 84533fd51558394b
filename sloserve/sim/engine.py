"""Request-level discrete-event simulation: every request, the real batching policy, in virtual time.

Events (a heap ordered by time, then sequence number, so runs are deterministic under a seed):
an arrival, a batch completion, a replica becoming ready, a batching policy's ``Wait(until)``
wake-up, and an autoscaling round every ``tick_s``. After each event touching a model the driver
calls the model's batching policy ``plan(QueueView, now)`` until it answers ``Wait`` -- the same
calls the live ``sloserve.batching.batcher`` makes -- and samples each batch's latency from the profile
(log-normal through its p50 and p99).

>>> from sloserve.sim.arrivals import poisson
>>> from sloserve.sim.profiles import default_profiles, service_for
>>> from sloserve.sim.control import ModelSpec
>>> svc = service_for(default_profiles(), "gpt2-gen", "t4", slo_ms=1000)
>>> spec = ModelSpec("m", poisson(20.0, 120.0), svc, "t4")
>>> out = simulate_requests([spec], "oracle", SimConfig(seed=1))
>>> out["summary"]["slo_attainment"] > 0.9
True
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sloserve.autoscaler.burst import BinCounts
from sloserve.autoscaler.registry import make_autoscaler
from sloserve.autoscaler.types import RateWindow
from sloserve.batching.policy import make_policy
from sloserve.batching.replay import VirtualQueue
from sloserve.batching.types import BatchResult, Dispatch, QueuedItem, Shed
from sloserve.sim.control import Controller, ModelSpec, Observation
from sloserve.sim.metrics import ModelRecord, summarize
from sloserve.sim.placement import FixedPool, PlacementHook

VARIANT = "default"
FALLBACK = "fallback"
_ARRIVE, _DONE, _READY, _WAKE, _TICK = 0, 1, 2, 3, 4
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


def batching_policy_for(cfg: SimConfig, spec: ModelSpec):
    name = cfg.batching or "slo"
    curves = _curves(spec)
    context = {
        "max_batch_size": spec.service.max_batch_size,
        "default_variant": VARIANT,
        "latency_fn": lambda variant, rows: curves[variant].at(rows, "p99"),
        "model": spec.name,
        "device_type": spec.device_type,
        "variants": list(curves),
    }
    if len(curves) > 1:  # rank the variants for the policy: the primary first
        context["accuracy"] = {VARIANT: 1.0, FALLBACK: 0.5}
    return make_policy(name, **context, **cfg.batching_kwargs)


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
        self.curves = _curves(spec)
        # every replica holds every variant (the fallback beside the primary): one set of slots for both
        self.vq = VirtualQueue(
            policy, spec.name, spec.service.max_batch_size, shared=len(self.curves) > 1, strict=False
        )
        self.replicas: list[_Replica] = []
        self.wake_at: float | None = None
        self.in_system = 0
        self.last_change = 0.0
        self.ongoing_acc = 0.0
        self.gw_counts = [0] * gateways
        self.gw_bins = [BinCounts() for _ in range(gateways)]  # per-second counts: how clumped the arrivals are
        self.alloc_since = 0.0
        self.allowed = tuple(self.curves)
        self.slots: _Slots | None = None  # set by simulate_requests

    def account(self, now: float) -> None:
        self.ongoing_acc += self.in_system * (now - self.last_change)
        self.last_change = now

    def hold(self, now: float) -> None:  # replica-seconds up to now, before the count changes
        self.rec.replica_seconds += len(self.replicas) * (now - self.alloc_since)
        self.alloc_since = now


class _Slots:
    """A model's replicas as its :class:`~sloserve.batching.replay.VirtualQueue` sees them: a batch starts on a
    ready, idle replica and lasts a latency drawn from the variant's profile (log-normal through its p50
    and p99); its completion is an event of the simulation's heap."""

    def __init__(self, m: _Model, mi: int, rng: np.random.Generator, push, minute_s: float):
        self.m, self.mi, self.rng, self.push, self.minute_s = m, mi, rng, push, minute_s

    def _idle(self, now: float) -> list[_Replica]:
        return [r for r in self.m.replicas if r.ready and not r.draining and r.busy_until <= now and not r.batch]

    def state(self, now: float):
        curves = self.m.curves
        busy = [r.busy_until for r in self.m.replicas if r.batch]
        return dict.fromkeys(curves, len(self._idle(now))), dict.fromkeys(curves, busy)

    def start(self, d: Dispatch, items: list[QueuedItem], now: float) -> bool:
        idle = self._idle(now)
        if not idle:
            return False
        m = self.m
        rows = sum(it.size for it in items)
        curve = m.curves.get(d.variant, m.spec.service.curve)
        if d.variant == FALLBACK:
            m.rec.fallback += rows
        p50 = curve.at(rows, "p50")
        sigma = math.log(max(curve.at(rows, "p99") / p50, 1.0)) / _Z99
        lat = p50 * math.exp(sigma * float(self.rng.standard_normal()))
        r = idle[0]
        r.busy_until = now + lat
        r.started = now
        r.batch = tuple(items)
        r.variant = d.variant
        self.push(now + lat, _DONE, self.mi, r)
        return True

    def shed(self, d: Shed, items: list[QueuedItem], now: float) -> None:
        m = self.m
        for it in items:
            m.rec.minute_total[int(it.arrival_s // self.minute_s)] += 1
            m.rec.shed += 1
        m.account(now)
        m.in_system -= len(items)


def simulate_requests(
    specs: list[ModelSpec], autoscaler: str, cfg: SimConfig, placement: PlacementHook | None = None, progress=None
) -> dict[str, Any]:
    """Simulate every request of ``specs`` under ``autoscaler``; returns summary, records, timing."""
    if any(s.group for s in specs):
        raise ValueError("a model on several device types (sloserve/sim/typesize.py lanes) runs in fluid mode only")
    ctl = Controller(
        make_autoscaler(autoscaler, **cfg.autoscaler_kwargs.get(autoscaler, {})), specs, placement or FixedPool()
    )
    return _RequestSim(specs, cfg, ctl).run(progress)


class _RequestSim:
    """One request-level run: the event heap, the models, their arrivals."""

    def __init__(self, specs: list[ModelSpec], cfg: SimConfig, ctl: Controller):
        self.specs, self.cfg, self.ctl = specs, cfg, ctl
        self.rng = np.random.default_rng(cfg.seed)
        self.duration = max(s.arrivals.duration_s for s in specs)
        self.n_min = math.ceil(self.duration / cfg.minute_s)
        self.models = [
            _Model(s, batching_policy_for(cfg, s), ModelRecord(s.name, self.n_min, cfg.minute_s), cfg.gateways)
            for s in specs
        ]
        self.heap: list = []
        self.seq = 0
        for mi, m in enumerate(self.models):
            m.slots = _Slots(m, mi, self.rng, self.push, cfg.minute_s)
        self.arrivals = []
        for mi, (s, m) in enumerate(zip(specs, self.models, strict=True)):
            times = s.arrivals.sample_times(self.rng)
            self.arrivals.append(times)
            if len(times):
                self.push(float(times[0]), _ARRIVE, mi, 0)
            for _ in range(s.initial_replicas):
                r = _Replica()
                r.ready = True
                m.replicas.append(r)
        self.gw_of = [self.rng.integers(0, cfg.gateways, len(t)) for t in self.arrivals]
        self.push(0.0, _TICK, -1)
        self.next_id = 0
        self.last_tick = 0.0

    def push(self, t, kind, mi, payload=None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, mi, payload))

    def pump(self, m: _Model, mi: int, now: float) -> None:
        assert m.slots is not None  # set for every model in __init__
        until = m.vq.run(m.slots, now)
        if until is not None and until > now and (m.wake_at is None or until < m.wake_at):
            m.wake_at = until
            self.push(until, _WAKE, mi)

    def run(self, progress=None) -> dict[str, Any]:
        end = self.duration + 5 * max(s.service.slo_s for s in self.specs)
        while self.heap:
            now, _, kind, mi, payload = heapq.heappop(self.heap)
            if now > end:
                break
            if kind == _TICK:
                self.tick(now)
                if progress is not None:
                    progress(now)
                continue
            m = self.models[mi]
            if kind == _ARRIVE:
                self.arrive(m, mi, payload, now)
            elif kind == _DONE:
                self.done(m, payload, now)
            elif kind == _READY:
                if payload in m.replicas:
                    payload.ready = True
            elif kind == _WAKE:
                if m.wake_at is None or now < m.wake_at - 1e-12:
                    continue
                m.wake_at = None
            self.pump(m, mi, now)
        return self.result()

    def tick(self, now: float) -> None:
        """An autoscaling round: the gateways' windows and the models' state to the controller."""
        cfg, obs = self.cfg, []
        for m, s in zip(self.models, self.specs, strict=True):
            m.account(now)
            span = max(now - self.last_tick, 1e-9)
            wins = (
                tuple(
                    RateWindow(f"gw{g}", self.last_tick, now, c, 1.0 / cfg.gateways, m.gw_bins[g].dispersion(now))
                    for g, c in enumerate(m.gw_counts)
                )
                if now > self.last_tick
                else ()
            )
            m.gw_counts = [0] * cfg.gateways
            for b in m.gw_bins:
                b.reset(now)
            ready = sum(1 for r in m.replicas if r.ready and not r.draining)
            target = sum(1 for r in m.replicas if not r.draining)
            obs.append(
                Observation(
                    target,
                    ready,
                    m.ongoing_acc / span,
                    wins,
                    s.arrivals.peak_rate(now, now + cfg.startup_s + cfg.tick_s),
                )
            )
            m.ongoing_acc = 0.0
        grants = self.ctl.round(now, obs)
        delays = self.ctl.placement.start_delay_s  # e.g. waiting for a preempted GPU, as in fluid mode
        for mi, (m, g) in enumerate(zip(self.models, grants, strict=True)):
            _resize(
                m, g, now, cfg.startup_s + delays.get(m.spec.name, 0.0), lambda t, r, i=mi: self.push(t, _READY, i, r)
            )
            m.rec.tick(now, m.spec.arrivals.rate_at(now), g, obs[mi].ready)
            self.pump(m, mi, now)
        self.last_tick = now
        if now + cfg.tick_s <= self.duration:
            self.push(now + cfg.tick_s, _TICK, -1)

    def arrive(self, m: _Model, mi: int, i: int, now: float) -> None:
        m.account(now)
        m.vq.add(QueuedItem(self.next_id, now, now + m.spec.service.slo_s, 1, 0, m.allowed))
        self.next_id += 1
        m.in_system += 1
        g = int(self.gw_of[mi][i])
        m.gw_counts[g] += 1
        m.gw_bins[g].add(now)
        if i + 1 < len(self.arrivals[mi]):
            self.push(float(self.arrivals[mi][i + 1]), _ARRIVE, mi, i + 1)

    def done(self, m: _Model, r: _Replica, now: float) -> None:
        """A batch finished: count its requests by minute, tell the policy, free (or drop) the replica."""
        m.account(now)
        slo = m.spec.service.slo_s
        good = 0
        for it in r.batch:
            k = int(it.arrival_s // self.cfg.minute_s)
            m.rec.minute_total[k] += 1
            if now - it.arrival_s <= slo + 1e-12:
                m.rec.minute_good[k] += 1
                good += 1
        m.in_system -= len(r.batch)
        m.policy.observe(
            BatchResult(
                m.spec.name,
                r.variant,
                len(r.batch),
                now - r.started,
                now,
                device_type=m.spec.device_type,
                late_rows=len(r.batch) - good,
            )
        )
        r.batch = ()
        if r.draining:
            m.hold(now)
            m.replicas.remove(r)

    def result(self) -> dict[str, Any]:
        self.ctl.placement.finish(self.duration)  # a hook with its own clock (sloserve/sim/harvest.py) runs to the end
        for m in self.models:
            m.hold(self.duration)
            for it in m.vq.items:  # never served
                m.rec.minute_total[min(int(it.arrival_s // self.cfg.minute_s), self.n_min - 1)] += 1
        records = [m.rec for m in self.models]
        return {
            "summary": summarize(records, self.duration, self.cfg.sla),
            "records": records,
            "duration_s": self.duration,
            "placement": self.ctl.placement.report(),
        }


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
    order = (
        [r for r in reversed(live) if not r.ready]
        + [r for r in live if r.ready and not r.batch]
        + [r for r in live if r.batch]
    )
    for r in order[:drop]:
        if r.batch:
            r.draining = True
        else:
            m.replicas.remove(r)
