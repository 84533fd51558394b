"""Variants across device types in virtual time: the ``slo`` policy choosing a (variant, device type)
pair per batch, on a model's real profiles, against the systems that have one choice.

Each serving option (``sloserve.batching.options``) gets its own replicas (``replicas[device type]`` each, as
the gateway deploys one set per option), and :func:`sloserve.batching.replay.replay` drives the same policy
the gateway runs, through the same :class:`~sloserve.batching.replay.VirtualQueue`. A batch's real service
time is drawn log-normal through its pair's profiled p50 and p99 (seeded); the policy sees the
profile and calibrates on what it observes, as live.

Systems compared on one arrival schedule (``systems_for``):

* ``pairs``: every option, the policy picks a pair per batch;
* ``variant:<v>``: one variant on every device type (the policy picks the type only);
* ``pair:<v>@<type>``: one variant on one type.

Effective accuracy is the accuracy of the requests answered on time over all requests (a shed or
late request counts 0), as ``sloserve bench slo`` reports it.

>>> from sloserve.batching.profile import ProfileTable
>>> t = ProfileTable.from_points({("m", "big", "gpu"): ([1, 8], [1.0, 2.0], [1.2, 2.4]),
...                               ("m", "big", "cpu"): ([1, 8], [3.0, 12.0], [3.5, 14.0]),
...                               ("m", "small", "cpu"): ([1, 8], [0.5, 1.0], [0.6, 1.2])})
>>> arrivals = burst_arrivals(200.0, 3.0, 3.0, seed=1)
>>> res = compare(t, "m", {"big": 0.9, "small": 0.7}, {"gpu": 1, "cpu": 1}, arrivals, 0.02, 8)
>>> res["pairs"].attainment >= res["pair:big@gpu"].attainment
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sloserve.autoscaler.typesplit import ordered_plan
from sloserve.batching.options import OptionPlan, split_key, variant_of
from sloserve.batching.policy import make_policy
from sloserve.batching.profile import ProfileTable
from sloserve.batching.replay import Request, replay

_Z99 = 2.3263


@dataclass(frozen=True)
class PairSystem:
    name: str
    keys: tuple[str, ...]  # best first
    replicas: Mapping[str, int]


@dataclass(frozen=True)
class PairResult:
    """One system's run: ``rows`` served per option (on time or not); ``timeline``: per window
    (``window_s``) its start, rows on time per option, and requests (all)."""

    system: str
    requests: int
    on_time: int
    effective_accuracy: float
    rows: Mapping[str, int]
    timeline: list[dict] = field(default_factory=list)

    @property
    def attainment(self) -> float:
        return self.on_time / self.requests if self.requests else 1.0


def burst_arrivals(rate: float, factor: float, duration_s: float, seed: int = 0) -> list[float]:
    """Poisson at ``rate`` for a third of ``duration_s``, ``rate * factor`` for the next third, ``rate``
    again (the shape of ``sloserve bench slo --arrival burst``)."""
    rng = np.random.default_rng(seed)
    third = duration_s / 3
    out: list[float] = []
    for k, r in enumerate((rate, rate * factor, rate)):
        t = k * third
        end = (k + 1) * third
        while True:
            t += rng.exponential(1.0 / r)
            if t >= end:
                break
            out.append(float(t))
    return out


def systems_for(plan: OptionPlan, replicas: Mapping[str, int]) -> list[PairSystem]:
    """``pairs``, then each variant on all its types, then each option alone (``replicas`` per type)."""
    per = {k: replicas[split_key(k, "")[1]] for k in plan.keys}
    out = [PairSystem("pairs", plan.keys, per)]
    for v in dict.fromkeys(variant_of(k) for k in plan.keys):
        keys = plan.of_variant(v)
        out.append(PairSystem(f"variant:{v}", keys, {k: per[k] for k in keys}))
    out += [PairSystem(f"pair:{k}", (k,), {k: per[k]}) for k in plan.keys]
    return out


def run_system(
    system: PairSystem,
    table: ProfileTable,
    model: str,
    accuracy: Mapping[str, float],
    arrivals: Sequence[float],
    slo_s: float,
    max_batch: int,
    seed: int = 0,
    window_s: float = 0.25,
) -> PairResult:
    keys = system.keys
    policy = make_policy(
        "slo",
        max_batch_size=max_batch,
        profile=table,
        model=model,
        variants=list(keys),
        accuracy={k: accuracy[variant_of(k)] for k in keys},
        default_variant=keys[0],
    )
    rng = np.random.default_rng(seed)

    def service(key: str, rows: int) -> float:  # log-normal through the pair's p50 and p99
        v, d = split_key(key, "")
        p50 = table.latency_s(model, v, d, rows, "p50")
        p99 = max(table.latency_s(model, v, d, rows, "p99"), p50 * 1.0001)
        return float(p50 * math.exp(rng.standard_normal() * math.log(p99 / p50) / _Z99))

    reqs = [Request(i, t, slo_s, variants=keys) for i, t in enumerate(arrivals)]
    res = replay(
        policy,
        reqs,
        service,
        dict(system.replicas),
        model=model,
        max_batch_size=max_batch,
        variants=list(keys),
        admission=True,
        strict=False,
    )
    rows: dict[str, int] = dict.fromkeys(keys, 0)
    end = max(arrivals, default=0.0)
    nbins = int(end / window_s) + 1
    bin_on_time: list[dict[str, int]] = [dict.fromkeys(keys, 0) for _ in range(nbins)]
    bin_requests = [0] * nbins
    on_time = 0
    eff = 0.0
    for o in res.outcomes:
        i = min(int(o.arrival_s / window_s), nbins - 1)
        bin_requests[i] += 1
        if o.variant is not None:
            rows[o.variant] += 1
        if o.on_time and o.variant is not None:
            on_time += 1
            eff += accuracy[variant_of(o.variant)]
            bin_on_time[i][o.variant] += 1
    n = len(res.outcomes)
    timeline = [{"t": i * window_s, "on_time": bin_on_time[i], "requests": bin_requests[i]} for i in range(nbins)]
    return PairResult(system.name, n, on_time, eff / n if n else 0.0, rows, timeline)


def compare(
    table: ProfileTable,
    model: str,
    accuracy: Mapping[str, float],
    replicas: Mapping[str, int],
    arrivals: Sequence[float],
    slo_s: float,
    max_batch: int,
    seed: int = 0,
    only: Sequence[str] | None = None,
    cost: Mapping[str, float] | None = None,
) -> dict[str, PairResult]:
    """Every system of :func:`systems_for` (or those named in ``only``) on the same arrivals."""
    plan = ordered_plan(table, model, accuracy, list(replicas), max_batch, slo_s, cost)
    return {
        s.name: run_system(s, table, model, accuracy, arrivals, slo_s, max_batch, seed)
        for s in systems_for(plan, replicas)
        if only is None or s.name in only
    }


def best_of(results: Mapping[str, PairResult], prefix: str) -> PairResult | None:
    """The system named ``prefix...`` with the highest effective accuracy."""
    cands = [r for n, r in results.items() if n.startswith(prefix)]
    return max(cands, key=lambda r: r.effective_accuracy, default=None)


def size_by_throughput(
    table: ProfileTable,
    model: str,
    plan: OptionPlan,
    demand_rps: float,
    slo_s: float,
    max_batch: int,
    cost: Mapping[str, float] | None = None,
    max_per_type: int = 64,
) -> dict[str, int]:
    """Replicas per device type for ``demand_rps`` of the best variant, with Gavel's throughput table
    (``sloserve.autoscaler.placement.cost``): the best variant's types ranked by requests/s of one replica per
    unit of ``cost`` (1 where not given). Every type gets one replica (its options exist for the
    overflow); the demand they leave is filled on the best-ranked type first (up to ``max_per_type``)."""
    from sloserve.autoscaler.placement.cost import throughputs_from_profile

    best = plan.keys[0] if plan.keys else ""
    types = list(plan.device_types())
    tput = throughputs_from_profile(table, [(model, best)], types, {model: slo_s}, max_batch)
    price = {t: (cost or {}).get(t, 1.0) for t in types}
    ranked = sorted(types, key=lambda t: (-tput.get((model, best, t), 0.0) / price[t], types.index(t)))
    out = dict.fromkeys(types, 1)
    left = demand_rps - sum(tput.get((model, best, t), 0.0) for t in types)
    for t in ranked:
        per = tput.get((model, best, t), 0.0)
        if per <= 0 or left <= 0:
            continue
        more = min(max_per_type - 1, math.ceil(left / per))
        out[t] += more
        left -= more * per
    return out
