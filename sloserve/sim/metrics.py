"""What a simulation records, per model, and the summary both modes report.

Minutes are counted by request arrival. A minute with no request is neither met nor missed
(``minutes_sla_met_fraction`` counts only minutes with traffic). ``replica_seconds`` counts a
replica from the moment it is requested (its start-up holds the GPU) until it is released.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ModelRecord:
    name: str
    n_minutes: int
    minute_s: float = 60.0
    minute_total: np.ndarray = field(init=False)
    minute_good: np.ndarray = field(init=False)
    replica_seconds: float = 0.0
    scale_events: int = 0
    shed: float = 0.0
    fallback: float = 0.0  # requests answered by the cheaper fallback variant
    series_t: list = field(default_factory=list)
    series_rate: list = field(default_factory=list)  # true rate (rps)
    series_target: list = field(default_factory=list)
    series_ready: list = field(default_factory=list)

    def __post_init__(self):
        self.minute_total = np.zeros(self.n_minutes)
        self.minute_good = np.zeros(self.n_minutes)

    def tick(self, t: float, rate: float, target: int, ready: int) -> None:
        if self.series_target and target != self.series_target[-1]:
            self.scale_events += 1
        self.series_t.append(t)
        self.series_rate.append(rate)
        self.series_target.append(target)
        self.series_ready.append(ready)


def summarize(records: list[ModelRecord], duration_s: float, sla: float = 0.99) -> dict:
    total = sum(float(r.minute_total.sum()) for r in records)
    good = sum(float(r.minute_good.sum()) for r in records)
    met = seen = 0
    per_model = {}
    for r in records:
        mask = r.minute_total > 0.5
        ok = r.minute_good[mask] >= sla * r.minute_total[mask] - 1e-9
        met += int(ok.sum())
        seen += int(mask.sum())
        per_model[r.name] = {
            "requests": float(r.minute_total.sum()),
            "slo_attainment": float(r.minute_good.sum() / r.minute_total.sum()) if r.minute_total.sum() else 1.0,
            "minutes_sla_met_fraction": float(ok.mean()) if mask.any() else 1.0,
            "replica_seconds": r.replica_seconds,
            "scale_events": r.scale_events,
            "shed": r.shed,
            "fallback_share": r.fallback / r.minute_total.sum() if r.minute_total.sum() else 0.0,
        }
    return {
        "requests": total,
        "slo_attainment": good / total if total else 1.0,
        "minutes_sla_met_fraction": met / seen if seen else 1.0,
        "minutes_with_traffic": seen,
        "replica_seconds": sum(r.replica_seconds for r in records),
        "goodput_rps": good / duration_s if duration_s > 0 else math.nan,
        "scale_events": sum(r.scale_events for r in records),
        "fallback_share": sum(r.fallback for r in records) / total if total else 0.0,
        "per_model": per_model,
    }
