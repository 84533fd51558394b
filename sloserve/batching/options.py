"""Serving options: the (variant, device type) pairs a model with replicas on several device types
serves from, and the one place their keys are spelled.

A model on one device type keeps plain variant names as its keys (``"large"``) everywhere: the
batcher's slots, the policy's ranks, the metrics. A model on several device types keys each
option ``"<variant>@<device_type>"`` (``"large@t4"``); :func:`option_key` builds such a key and
:func:`split_key` takes one apart, so no other code parses the string.

:func:`plan_options` orders a model's options for the policy (most accurate variant first; per
variant its device types in the gateway's order, by default fastest at one row first) and drops the **dominated** ones from the
fallback chain: on one device type, an option less accurate than another and not faster than it at
any profiled batch size is never a useful fallback (an INT8 graph on a GPU is often slower than the
FP32 one). A dropped option is still served, to a request that pins its variant: ``served`` lists
every option (the fallback chain, then the dropped ones), and :meth:`OptionPlan.of_variant` with
``pinned=True`` gives a variant's options whether dropped or not, in the same type order.

>>> option_key("large", "t4"), split_key("large@t4", "cpu"), split_key("large", "cpu")
('large@t4', ('large', 't4'), ('large', 'cpu'))
>>> lat = {("large", "t4"): 2.0, ("large", "cpu"): 5.0, ("small", "t4"): 3.0, ("small", "cpu"): 1.0}
>>> p = plan_options(["large", "small"], {"large": 0.9, "small": 0.8}, ["cpu", "t4"],
...                  lambda v, d, n: lat[(v, d)] * n, [1, 8])
>>> p.keys, p.dropped
(('large@t4', 'large@cpu', 'small@cpu'), (('small@t4', 'large@t4'),))
>>> p.of_variant("small"), p.of_variant("small", pinned=True), p.served[-1]
(('small@cpu',), ('small@cpu', 'small@t4'), 'small@t4')
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sloserve.batching.profile import ProfileTable

SEP = "@"

# (variant, device type, rows) -> seconds, or None when that pair has no profile of its own
PairLatency = Callable[[str, str, int], float | None]
# (variant, its device types) -> the types in the order they serve it, best first
TypeOrder = Callable[[str, Sequence[str]], Sequence[str]]


def option_key(variant: str, device_type: str) -> str:
    """The key of (``variant``, ``device_type``) for a model served on several device types."""
    if SEP in variant or SEP in device_type:
        raise ValueError(f"variant and device type names must not contain {SEP!r}: {variant!r}, {device_type!r}")
    return f"{variant}{SEP}{device_type}"


def split_key(key: str, default_device: str) -> tuple[str, str]:
    """(variant, device type) of a key: a plain variant name runs on ``default_device``."""
    variant, sep, device = key.partition(SEP)
    return (variant, device) if sep else (key, default_device)


def variant_of(key: str) -> str:
    """The variant a key serves (the key itself for a model on one device type)."""
    return key.partition(SEP)[0]


def is_option_key(key: str) -> bool:
    return SEP in key


@dataclass(frozen=True, slots=True)
class OptionPlan:
    """A multi-type model's options: ``keys``, the fallback chain as the policy ranks it (best
    first); ``dropped`` as (dominated key, the key that dominates it); ``pinned_order``: each
    variant's options in type order, dropped or not (empty: ``keys`` then the dropped, in order)."""

    keys: tuple[str, ...]
    dropped: tuple[tuple[str, str], ...] = ()
    pinned_order: tuple[str, ...] = ()

    @property
    def served(self) -> tuple[str, ...]:
        """Every option that has replicas: the fallback chain, then the dropped ones (pinned only)."""
        return self.keys + tuple(d for d, _ in self.dropped if d not in self.keys)

    def of_variant(self, variant: str, pinned: bool = False) -> tuple[str, ...]:
        """``variant``'s options in type order: in the fallback chain, or (``pinned``) all of them,
        for a request that names the variant."""
        if not pinned:
            return tuple(k for k in self.keys if variant_of(k) == variant)
        order = self.pinned_order or self.served
        return tuple(k for k in order if variant_of(k) == variant)

    def device_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(split_key(k, "")[1] for k in self.served))


def plan_options(
    variants: Sequence[str],
    accuracy: Mapping[str, float],
    device_types: Sequence[str],
    latency: PairLatency,
    batch_sizes: Sequence[int],
    type_order: TypeOrder | None = None,
) -> OptionPlan:
    """Order and prune the options of ``variants`` (most accurate first) on ``device_types``.

    Per variant, device types go in ``type_order(variant, types)`` (the gateway's: best requests/s
    per unit of cost first, the order the autoscaler sizes them in), by default fastest first by
    ``latency(variant, type, 1)`` (a pair without a profile of its own last, in the order given). An option (v, d) is dropped when a more accurate
    variant u on the same type d has a profile and ``latency(u, d, b) <= latency(v, d, b)`` at every
    size of ``batch_sizes``: serving v there never buys time u would not (it stays in ``served``, for
    a request pinning v). Options without a profile of their own are never dropped (nothing says
    they are slower)."""
    ranked = sorted(variants, key=lambda v: -accuracy.get(v, 0.0))
    dropped: list[tuple[str, str]] = []
    kept: dict[str, list[str]] = {}
    every: dict[str, list[str]] = {}
    for i, v in enumerate(ranked):
        if type_order is not None:
            every[v] = list(type_order(v, device_types))
        else:
            one_row = {d: latency(v, d, 1) for d in device_types}
            every[v] = sorted(
                device_types, key=lambda d: (math.inf if (r := one_row[d]) is None else r, device_types.index(d))
            )
        types = []
        for d in device_types:
            own = [latency(v, d, b) for b in batch_sizes]
            dominator = None
            if all(x is not None for x in own):
                for u in ranked[:i]:
                    if accuracy.get(u, 0.0) <= accuracy.get(v, 0.0):
                        continue
                    theirs = [latency(u, d, b) for b in batch_sizes]
                    if all(t is not None and o is not None and t <= o for t, o in zip(theirs, own, strict=True)):
                        dominator = u
                        break
            if dominator is not None:
                dropped.append((option_key(v, d), option_key(dominator, d)))
                continue
            types.append(d)
        kept[v] = [d for d in every[v] if d in types]
    keys = tuple(option_key(v, d) for v in ranked for d in kept[v])
    return OptionPlan(keys, tuple(dropped), tuple(option_key(v, d) for v in ranked for d in every[v]))


def plan_from_profiles(
    table: ProfileTable,
    model: str,
    accuracy: Mapping[str, float],
    device_types: Sequence[str],
    max_batch_size: int,
    type_order: TypeOrder | None = None,
) -> OptionPlan:
    """:func:`plan_options` on the model's own profiles (median latency, at every batch size up to
    ``max_batch_size`` that any of its profiles measured); a pair without a profile file of its own
    is never dropped, and ranks last among its variant's types."""
    sizes = sorted(
        {b for (m, _, _), c in table.curves.items() if m == model for b in c.batch_sizes if b <= max_batch_size}
    ) or [1]

    def lat(v: str, d: str, rows: int) -> float | None:
        c = table.curves.get((model, v, d))
        return None if c is None else c.at(rows, "p50")

    return plan_options(list(accuracy), accuracy, device_types, lat, sizes, type_order)
