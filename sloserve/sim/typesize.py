"""A model on several device types in the autoscaled simulator: one *lane* per type.

A lane is a :class:`~sloserve.sim.control.ModelSpec` named ``"<model>@<type>"`` with that type's service
model and a :class:`~sloserve.autoscaler.typesplit.DemandSplit`: each round its autoscaler sees the model's
whole demand and sizes the lane for its part (best requests/s per unit of cost first, up to each
type's bound), as each (variant, type) deployment does live. Serving follows the same order, the
``slo`` policy's order of a variant's types live (``sloserve.autoscaler.typesplit.rank_types``: best
requests/s per unit of cost first), each lane taking what its ready replicas serve within the SLO,
the rest spilling to the next (:func:`route`); the fluid mode (``sloserve/sim/fluid.py``) drives it.

>>> from sloserve.batching.profile import Curve
>>> from sloserve.autoscaler.types import ServiceModel
>>> from sloserve.autoscaler.typesplit import TypeOption
>>> fast = ServiceModel(Curve((1, 32), (0.001, 0.004), (0.001, 0.004)), 0.05, 32)
>>> slow = ServiceModel(Curve((1, 32), (0.004, 0.016), (0.004, 0.016)), 0.05, 32)
>>> r = route(100.0, [slow, fast], [1, 0])
>>> r
[100.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from sloserve.autoscaler.queueing import capacity_of
from sloserve.autoscaler.types import ServiceModel
from sloserve.autoscaler.typesplit import DemandSplit, TypeOption, rank_types
from sloserve.sim.control import ModelSpec


def lanes(spec: ModelSpec, options: Sequence[TypeOption]) -> list[ModelSpec]:
    """``spec`` as one lane per device type of ``options`` (the same arrivals), in the order that sizes
    and serves them (:func:`~sloserve.autoscaler.typesplit.rank_types`)."""
    opts = tuple(options)
    order = rank_types(opts)
    return [
        replace(
            spec,
            name=f"{spec.name}@{o.device_type}",
            service=o.service,
            device_type=o.device_type,
            max_replicas=min(spec.max_replicas, o.max_replicas),
            split=DemandSplit(opts, o.device_type),
            group=spec.name,
        )
        for o in order
    ]


def route(rate: float, services: Sequence[ServiceModel], ready: Sequence[int]) -> list[float]:
    """The model's ``rate`` over its lanes (in serving order): each takes up to what its ``ready``
    replicas serve within the SLO; what none has room for stays on the first lane with a replica
    (it queues, and is shed or late there), or the first lane when none has one."""
    out = [0.0] * len(services)
    left = max(rate, 0.0)
    for i, (svc, n) in enumerate(zip(services, ready, strict=True)):
        take = min(left, capacity_of(svc, int(n)))
        out[i] = take
        left -= take
    if left > 0 and out:
        i = next((i for i, n in enumerate(ready) if n > 0), 0)
        out[i] += left
    return out


def type_report(summary: Mapping, cost: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """Per lane of a run's summary: replica-seconds, cost (replica-hours x price) and attainment."""
    out = {}
    for name, m in summary["per_model"].items():
        _, _, t = name.rpartition("@")
        if not t:
            continue
        rs = float(m["replica_seconds"])
        out[name] = {
            "replica_seconds": rs,
            "cost": rs / 3600.0 * float(cost.get(t, 1.0)),
            "requests": float(m["requests"]),
            "slo_attainment": float(m["slo_attainment"]),
        }
    return out
