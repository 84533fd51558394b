"""A queueing model of batched service: how many replicas meet an SLO percentile at a rate.

Each of ``c`` replicas takes, whenever it frees, the requests queued for it (up to the largest
batch that can still meet the deadlines) -- what the SLO batching policy does. At a per-replica
rate ``r = rate / c`` the batch size settles where a batch holds the arrivals of one batch time:
``b* = r * D50(b*)`` ("the batch size the SLO policy would pick at that rate"). Batch sizes
fluctuate around it as an AR(1) process (``b' = r * D(b) + Poisson noise``), so their standard
deviation is ``sqrt(b* / (1 - phi^2))`` with ``phi = r * D'(b*)``. A request waits for a replica
to free (about ``D / c``, staggered replicas) and then for its own batch, so at the SLO percentile

    latency_p ~= (1 + 1/c) * D99(b* + z_p * sd)

and ``c`` replicas suffice when that is within the SLO (and ``b*`` within the batch cap).
docs/simulator.md compares this with the request-level simulator and with the M/D/c model we
tried first (it treated fixed-size batches as jobs and over-provisioned about 2x).

>>> from sloserve.batching.profile import Curve
>>> s = ServiceModel(Curve((1, 64), (0.002, 0.034), (0.002, 0.034)), slo_s=0.05, max_batch_size=64)
>>> replicas_needed(s, 0.0), replicas_needed(s, 100.0)
(0, 1)
"""

from __future__ import annotations

import bisect
import math
from functools import lru_cache
from statistics import NormalDist

from sloserve.autoscaler.types import ServiceModel

_ND = NormalDist()


@lru_cache(maxsize=64)
def _z(p: float) -> float:
    return _ND.inv_cdf(p)


def steady_batch(service: ServiceModel, per_replica_rps: float) -> float | None:
    """``b*`` with ``b* = r * D50(b*)`` (None when the replica cannot keep up even at the cap)."""
    if per_replica_rps <= 0:
        return 0.0
    curve, cap = service.curve, service.max_batch_size
    b = 1.0
    for _ in range(200):
        nb = max(per_replica_rps * curve.at(b, "p50"), 1.0)
        if nb > cap:
            return None
        if abs(nb - b) < 1e-6:
            return nb
        b = nb
    return b if per_replica_rps * curve.at(b, "p50") <= b + 1e-3 else None


def batch_spread(service: ServiceModel, per_replica_rps: float, b: float) -> float:
    """Standard deviation of the batch size around ``b`` (AR(1) with Poisson innovations)."""
    d = service.curve
    slope = (d.at(b + 1.0, "p50") - d.at(max(b - 1.0, 1.0), "p50")) / (b + 1.0 - max(b - 1.0, 1.0))
    phi = min(per_replica_rps * slope, 0.999)
    return math.sqrt(max(b, 1.0) / (1 - phi * phi))


def tail_latency_s(service: ServiceModel, replicas: int, rate: float) -> float:
    """Predicted ``slo_percentile`` latency at ``rate`` on ``replicas`` (inf when overloaded)."""
    if rate <= 0:
        return service.curve.at(1)
    if replicas <= 0:
        return math.inf
    r = rate / replicas
    b = steady_batch(service, r)
    if b is None:
        return math.inf
    bp = b + _z(service.slo_percentile) * batch_spread(service, r, b)
    if bp > service.max_batch_size + 1e-9:  # the tail batch would not fit: a backlog builds
        return math.inf
    return (1 + 1 / replicas) * service.curve.at(max(bp, 1.0), "p99")


@lru_cache(maxsize=65536)
def capacity_rps(service: ServiceModel, replicas: int) -> float:
    """The highest rate ``replicas`` replicas serve with the SLO met for ``slo_percentile`` of requests."""
    if replicas <= 0 or tail_latency_s(service, replicas, 1e-6) > service.slo_s:
        return 0.0
    cap = service.max_batch_size
    lo, hi = 0.0, replicas * cap / service.curve.at(cap, "p50")
    for _ in range(40):
        mid = (lo + hi) / 2
        if tail_latency_s(service, replicas, mid) <= service.slo_s:
            lo = mid
        else:
            hi = mid
    return lo


_CAPS: dict[int, tuple[ServiceModel, list[float]]] = {}  # id(service) -> (service, capacities by c)


def _capacities(service: ServiceModel, upto: int) -> list[float]:
    """Capacities for 0..upto replicas, grown on demand; keyed by identity (hashing a curve is slow)."""
    entry = _CAPS.get(id(service))
    if entry is None or entry[0] is not service:
        entry = _CAPS[id(service)] = (service, [0.0])
    caps = entry[1]
    while len(caps) <= upto:
        caps.append(capacity_rps(service, len(caps)))
    return caps


def replicas_needed(service: ServiceModel, rate: float, max_replicas: int = 100_000) -> int:
    """The fewest replicas whose tail latency meets the SLO at ``rate`` (capped at ``max_replicas``)."""
    if rate <= 0:
        return 0
    caps = _capacities(service, 8)
    while caps[-1] < rate and len(caps) - 1 < max_replicas:
        caps = _capacities(service, min(2 * (len(caps) - 1), max_replicas))
    i = bisect.bisect_left(caps, rate)
    return min(i, max_replicas)


def capacity_of(service: ServiceModel, replicas: int) -> float:
    """``capacity_rps(service, replicas)`` from the per-service list :func:`replicas_needed` uses."""
    return _capacities(service, replicas)[replicas] if replicas > 0 else 0.0


def per_replica_throughput_rps(service: ServiceModel) -> float:
    """Requests/s one replica serves within the SLO (Gavel's throughput entry for placement)."""
    return capacity_rps(service, 1)


def max_throughput_rps(service: ServiceModel, replicas: int) -> float:
    """Raw service capacity (largest batches back to back), SLO aside: what a backlog drains at."""
    cap = service.max_batch_size
    return replicas * cap / service.curve.at(cap, "p50")


def late_fraction(service: ServiceModel, replicas: int, rate: float, _memo: dict | None = None) -> float:
    """Predicted share of requests that miss the SLO at a steady ``rate`` on ``replicas`` (fluid mode).

    ``_memo`` (a dict kept by a caller that asks for many rates and replica counts of one service)
    keeps the steady batch per per-replica rate and the largest on-time batch per replica count:
    the same numbers, computed once."""
    if rate <= 0:
        return 0.0
    if replicas <= 0:
        return 1.0
    r = rate / replicas
    if _memo is None:
        _memo = {}
    key = ("b", r)
    if key not in _memo:
        _memo[key] = (steady_batch(service, r),)
    b = _memo[key][0]
    if b is None:
        return 1.0
    key = ("lo", replicas)
    if key not in _memo:
        _memo[key] = _largest_on_time_batch(service, replicas)
    lo = _memo[key]
    if lo is None:
        return 1.0
    key = ("sd", r)
    if key not in _memo:
        _memo[key] = batch_spread(service, r, b)
    return 1.0 - _ND.cdf((lo - b) / _memo[key])


def _largest_on_time_batch(service: ServiceModel, replicas: int) -> float | None:
    """The largest batch whose latency (with the wait for a replica) still meets the SLO (None: not even one)."""
    budget = service.slo_s / (1 + 1 / replicas)
    lo, hi = 0.0, float(service.max_batch_size)
    if service.curve.at(1, "p99") > budget:
        return None
    for _ in range(30):
        mid = (lo + hi) / 2
        if service.curve.at(max(mid, 1.0), "p99") <= budget:
            lo = mid
        else:
            hi = mid
    return lo
