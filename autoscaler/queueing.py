"""A queueing model of batched service: how many replicas meet an SLO percentile at a rate.

Model (documented in docs/simulator.md): a replica runs a batch of ``b`` rows in ``D(b)``
seconds (the profile's p99). With ``c`` replicas fed from one deadline-ordered queue, batches
are the jobs of an M/D/c queue with arrival rate ``rate/b`` and service time ``D(b)``. A request
waits ``W`` for a replica and then ``D(b)`` for its batch, so the SLO holds for a share ``p`` of
requests when ``D(b) + W_p <= slo`` with ``P(W > t) ~= C(c, a) * exp(-2 (c/D - rate/b) t)``
(Erlang C, with the decay rate doubled for deterministic service, after Kingman). The SLO
policy adapts ``b`` to the rate, so the model takes the best ``b``; that is "the batch size the
SLO policy would pick at that rate".

Everything here is pure; capacities are cached per (service, replicas) because the same few
profile classes are asked about again and again.

>>> from batching.profile import Curve
>>> s = ServiceModel(Curve((1, 64), (0.002, 0.034), (0.002, 0.034)), slo_s=0.05, max_batch_size=64)
>>> replicas_needed(s, 0.0), replicas_needed(s, 100.0) >= 1
(0, True)
"""

from __future__ import annotations

import bisect
import math
from functools import lru_cache

from autoscaler.types import ServiceModel

_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits in an M/M/c queue with offered load ``a`` (Erlangs)."""
    if a <= 0:
        return 0.0
    if a >= c:
        return 1.0
    if c > 400:  # Halfin-Whitt: accurate when c is large
        beta = (c - a) / math.sqrt(a)
        phi = math.exp(-beta * beta / 2) / math.sqrt(2 * math.pi)
        big_phi = 0.5 * (1 + math.erf(beta / math.sqrt(2)))
        return 1.0 / (1.0 + beta * big_phi / max(phi, 1e-300)) if beta < 37 else 0.0
    b = 1.0
    for n in range(1, c + 1):  # Erlang B recursion, stable in floating point
        b = a * b / (n + a * b)
    rho = a / c
    return b / (1 - rho * (1 - b))


def wait_quantile_s(c: int, service_s: float, batch_rate: float, p: float) -> float:
    """The ``p`` quantile of the wait for a replica in the M/D/c batch queue (inf if overloaded)."""
    if batch_rate <= 0:
        return 0.0
    slack = c / service_s - batch_rate
    if slack <= 0:
        return math.inf
    pw = erlang_c(c, batch_rate * service_s)
    if pw <= 1 - p:
        return 0.0
    return math.log(pw / (1 - p)) / (2 * slack)


def candidate_batches(service: ServiceModel) -> tuple[int, ...]:
    """Batch sizes worth considering: those whose own latency fits in the SLO."""
    out = [b for b in _BATCHES if b <= service.max_batch_size and service.curve.at(b) < service.slo_s]
    if service.max_batch_size not in _BATCHES and service.curve.at(service.max_batch_size) < service.slo_s:
        out.append(service.max_batch_size)
    return tuple(sorted(out))


def tail_latency_s(service: ServiceModel, replicas: int, rate: float, batch: int) -> float:
    """Predicted ``slo_percentile`` latency of requests at ``rate`` on ``replicas`` with batch ``batch``."""
    d = service.curve.at(batch)
    return d + wait_quantile_s(replicas, d, rate / batch, service.slo_percentile)


def best_batch(service: ServiceModel, replicas: int, rate: float) -> tuple[int, float]:
    """The batch size with the lowest predicted tail latency at ``rate``, and that latency."""
    best = (1, math.inf)
    for b in candidate_batches(service):
        t = tail_latency_s(service, replicas, rate, b)
        if t < best[1]:
            best = (b, t)
    return best


@lru_cache(maxsize=65536)
def capacity_rps(service: ServiceModel, replicas: int) -> float:
    """The highest rate ``replicas`` replicas serve with the SLO met for ``slo_percentile`` of requests."""
    if replicas <= 0:
        return 0.0
    best = 0.0
    for b in candidate_batches(service):
        d = service.curve.at(b)
        lo, hi = 0.0, replicas * b / d
        if tail_latency_s(service, replicas, lo + 1e-9, b) > service.slo_s:
            continue
        for _ in range(40):
            mid = (lo + hi) / 2
            if tail_latency_s(service, replicas, mid, b) <= service.slo_s:
                lo = mid
            else:
                hi = mid
        best = max(best, lo)
    return best


@lru_cache(maxsize=4096)
def _capacity_list(service: ServiceModel, upto: int) -> tuple[float, ...]:
    return tuple(capacity_rps(service, c) for c in range(upto + 1))


def replicas_needed(service: ServiceModel, rate: float, max_replicas: int = 100_000) -> int:
    """The fewest replicas whose tail latency meets the SLO at ``rate`` (capped at ``max_replicas``)."""
    if rate <= 0:
        return 0
    upto = 8
    while True:
        caps = _capacity_list(service, upto)
        if caps[-1] >= rate or upto >= max_replicas:
            i = bisect.bisect_left(caps, rate)
            return min(i, max_replicas) if i < len(caps) else max_replicas
        upto = min(upto * 2, max_replicas)


def per_replica_throughput_rps(service: ServiceModel) -> float:
    """Requests/s one replica serves within the SLO (Gavel's throughput entry for placement)."""
    return capacity_rps(service, 1)


def late_fraction(service: ServiceModel, replicas: int, rate: float) -> float:
    """Predicted share of requests that miss the SLO at a steady ``rate`` on ``replicas`` (fluid mode)."""
    if rate <= 0:
        return 0.0
    if replicas <= 0:
        return 1.0
    best = 1.0
    for b in candidate_batches(service):
        d = service.curve.at(b)
        batch_rate = rate / b
        slack = replicas / d - batch_rate
        if slack <= 0:
            continue
        budget = service.slo_s - d
        if budget < 0:
            continue
        frac = erlang_c(replicas, batch_rate * d) * math.exp(-2 * slack * budget)
        best = min(best, frac)
        if best == 0.0:
            break
    return best
