"""A model's demand for one variant split over the device types it runs on (ours).

A variant served on several device types (``models.<m>.device_types``) has a deployment per type,
each sized by swayam on its own profile. If each saw the model's whole demand, every type would
scale to carry all of it. :func:`split_demand` hands each type its part instead:

* the types rank by Gavel's throughput table normalised by price: requests/s of one replica at the
  SLO (``sloserve.autoscaler.placement.cost.throughputs_from_profile``) per unit of ``cost``; name order
  breaks ties;
* the best-ranked type takes the demand first, up to its **bound**: what ``max_replicas`` of its
  replicas serve within the SLO (``sloserve.autoscaler.queueing.capacity_rps``, the queueing model swayam
  sizes with, so a type handed its bound needs exactly ``max_replicas``);
* the next type takes the rest, up to its bound, and so on; demand beyond every bound stays with the
  last type (it scales to its cap; nothing more fits).

Swayam applies the split to the rate it plans for (prediction, head-room and all:
``ScalingSnapshot.split``), so a rising demand fills the cheap-per-throughput type to its bound
before the next type scales, and a falling one releases the costlier type first (its part drops to
zero first; its keep-alive still applies). Only the most accurate variant's deployments split the
model's demand; a cheaper variant's deployment sizes on what it served.

>>> from sloserve.batching.profile import Curve
>>> svc = ServiceModel(Curve((1, 32), (0.002, 0.016), (0.002, 0.016)), slo_s=0.05, max_batch_size=32)
>>> a, b = TypeOption("a", svc, 1000.0, cost=1.0, max_replicas=2), TypeOption("b", svc, 1000.0, cost=3.0)
>>> bound = a.bound_rps
>>> s = split_demand(bound + 100.0, (b, a))
>>> round(s["a"] - bound, 6), round(s["b"], 6)
(0.0, 100.0)
>>> split_demand(50.0, (a, b))
{'a': 50.0, 'b': 0.0}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sloserve.autoscaler.placement.cost import throughputs_from_profile
from sloserve.autoscaler.queueing import capacity_rps
from sloserve.autoscaler.types import ServiceModel
from sloserve.batching.options import OptionPlan, plan_from_profiles
from sloserve.batching.profile import ProfileTable


@dataclass(frozen=True, slots=True)
class TypeOption:
    """One device type of a variant: one replica's service there, its throughput-table entry
    (requests/s of one replica at the SLO), its price per replica (any unit, the same for every
    type) and the most replicas it may run."""

    device_type: str
    service: ServiceModel
    throughput_rps: float
    cost: float = 1.0
    max_replicas: int = 1_000_000

    @property
    def bound_rps(self) -> float:
        """What ``max_replicas`` replicas serve within the SLO (the queueing model's capacity)."""
        return capacity_rps(self.service, self.max_replicas)


def _rank_key(throughput_rps: float, cost: float, device_type: str) -> tuple[float, str]:
    return (-(throughput_rps / cost if cost > 0 else float("inf")), device_type)


def rank_types(options: Sequence[TypeOption]) -> list[TypeOption]:
    """Best requests/s per unit of cost first; name breaks ties."""
    return sorted(options, key=lambda o: _rank_key(o.throughput_rps, o.cost, o.device_type))


def profile_type_order(
    table: ProfileTable, model: str, slo_s: float, max_batch: int, cost: Mapping[str, float] | None = None
) -> Callable[[str, Sequence[str]], list[str]]:
    """The order the gateway serves a variant's device types in, the very order :func:`split_demand`
    sizes them in: best requests/s per unit of cost first, from the throughput table of the model's
    profiles (a type without a profile of its own last). For ``sloserve.batching.options.plan_options``."""

    def order(variant: str, types: Sequence[str]) -> list[str]:
        tput = throughputs_from_profile(table, [(model, variant)], types, {model: slo_s}, max_batch)
        return sorted(
            types,
            key=lambda t: _rank_key(tput.get((model, variant, t), 0.0), float((cost or {}).get(t, 1.0)), t),
        )

    return order


def ordered_plan(
    table: ProfileTable,
    model: str,
    accuracy: Mapping[str, float],
    types: Sequence[str],
    max_batch: int,
    slo_s: float,
    cost: Mapping[str, float] | None = None,
) -> OptionPlan:
    """The model's (variant, device type) options in the order the gateway serves them
    (:func:`profile_type_order`), for the live backends and the simulator alike."""
    order = profile_type_order(table, model, slo_s, max_batch, cost)
    return plan_from_profiles(table, model, accuracy, list(types), max_batch, order)


def split_demand(demand_rps: float, options: Sequence[TypeOption]) -> dict[str, float]:
    """Requests/s per device type: ``demand_rps`` poured into the ranked types up to each bound."""
    out = {o.device_type: 0.0 for o in options}
    ranked = rank_types(options)
    left = max(demand_rps, 0.0)
    for o in ranked:
        take = min(left, o.bound_rps)
        out[o.device_type] = take
        left -= take
    if left > 0 and ranked:
        out[ranked[-1].device_type] += left
    return out


@dataclass(frozen=True, slots=True)
class DemandSplit:
    """What one (variant, device type) deployment needs to size on its part: the variant's types
    and which of them it is (``own``)."""

    options: tuple[TypeOption, ...]
    own: str

    def part(self, demand_rps: float) -> float:
        """This deployment's requests/s of the variant's ``demand_rps``."""
        return split_demand(demand_rps, self.options).get(self.own, 0.0)


def type_options(
    services: Mapping[str, ServiceModel],
    throughputs: Mapping[str, float],
    cost: Mapping[str, float] | None = None,
    max_replicas: Mapping[str, int] | None = None,
) -> tuple[TypeOption, ...]:
    """A variant's :class:`TypeOption` per device type of ``services``, from the throughput table
    (a type missing there ranks last), ``cost`` (1 where not given) and ``max_replicas``."""
    return tuple(
        TypeOption(
            t,
            svc,
            float(throughputs.get(t, 0.0)),
            float((cost or {}).get(t, 1.0)),
            int((max_replicas or {}).get(t, 1_000_000)),
        )
        for t, svc in services.items()
    )
