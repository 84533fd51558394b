"""A model's serving options on several device types, as both backends lay them out: the
(variant, device type) pairs in the order they serve in (``sloserve.batching.options``), from the model's
profiles, the types ranked as the autoscaler sizes them (``sloserve.autoscaler.typesplit``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from sloserve.autoscaler.typesplit import ordered_plan
from sloserve.batching.options import OptionPlan
from sloserve.batching.profile import ProfileTable
from sloserve.models.repository import ModelConfig

log = logging.getLogger("sloserve.backend")


def model_plan(
    table: ProfileTable, cfg: ModelConfig, types: Sequence[str], slo_ms: float, cost: Mapping[str, float]
) -> OptionPlan:
    """``cfg``'s options on ``types`` (profile names), each dominated one logged; ``slo_ms`` the
    model's (its override's) SLO, ``cost`` the price per type (1 where not given)."""
    accuracy = {v.name: v.accuracy for v in cfg.variants}
    plan = ordered_plan(table, cfg.name, accuracy, types, cfg.max_batch_size, slo_ms / 1e3, cost)
    for dominated, by in plan.dropped:
        log.info(
            "model %s: option %s leaves the fallback chain (not faster than the more accurate %s; served when "
            "its variant is pinned)",
            cfg.name,
            dominated,
            by,
        )
    return plan
