"""Latency profiles: one frozen table keyed by (model, variant, device type, batch rows).

A profile file (written by ``sloserve profile``) lives at
``<repo>/<model>/<variant>/profiles/<device_type>.json``::

    {"model": "heavy", "variant": "large", "device_type": "cpu-amd-epyc...",
     "batch_sizes": [1, 2, 4, ...], "p50_ms": [...], "p99_ms": [...], "throughput_rps": [...],
     "accuracy": 0.98, "created": "2026-11-21T23:00:00Z", "runtime": {...}}

Between measured batch sizes latency is interpolated linearly; past the largest it is
extrapolated from the last two points; a (model, variant) with no profile for a device type
falls back to the profile of another device type scaled by nothing (a prior, flagged ``foreign``)
and online calibration (``sloserve.batching.calibration``) corrects it.

>>> t = ProfileTable.from_points({("m", "v", "cpu"): ([1, 8], [1.0, 4.0], [1.5, 6.0])}, {("m", "v"): 0.9})
>>> round(t.latency_s("m", "v", "cpu", 4), 6)
0.003429
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Curve:
    """Latency (seconds) against batch rows, for one (model, variant, device type)."""

    batch_sizes: tuple[int, ...]
    p50_s: tuple[float, ...]
    p99_s: tuple[float, ...]

    def __post_init__(self):
        if not self.batch_sizes or len(self.batch_sizes) != len(self.p50_s) or len(self.p50_s) != len(self.p99_s):
            raise ValueError("a curve needs equal, non-empty batch_sizes / p50 / p99")
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)) or self.batch_sizes[0] < 1:
            raise ValueError("batch sizes must be increasing positive integers")

    def at(self, rows: float, quantile: str = "p99") -> float:
        ys = self.p99_s if quantile == "p99" else self.p50_s
        xs = self.batch_sizes
        if rows <= xs[0]:
            return ys[0]
        i = bisect.bisect_left(xs, rows)
        if i < len(xs) and xs[i] == rows:
            return ys[i]
        if i >= len(xs):  # extrapolate from the last two points (or proportionally from one)
            if len(xs) == 1:
                return ys[0] * rows / xs[0]
            x0, x1, y0, y1 = xs[-2], xs[-1], ys[-2], ys[-1]
        else:
            x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(y0 + (y1 - y0) * (rows - x0) / (x1 - x0), 1e-9)


Key = tuple[str, str, str]  # (model, variant, device type)


@dataclass(frozen=True)
class ProfileTable:
    """The one central table of (model, variant, device type) -> latency curve, plus accuracy."""

    curves: Mapping[Key, Curve]
    accuracy: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "curves", MappingProxyType(dict(self.curves)))
        object.__setattr__(self, "accuracy", MappingProxyType(dict(self.accuracy)))

    @classmethod
    def from_points(
        cls,
        points: Mapping[Key, tuple[Iterable[int], Iterable[float], Iterable[float]]],
        accuracy: Mapping[tuple[str, str], float] | None = None,
    ) -> ProfileTable:
        """Build from milliseconds: {(model, variant, device): (batch_sizes, p50_ms, p99_ms)}."""
        curves = {
            k: Curve(tuple(b), tuple(x / 1e3 for x in p50), tuple(x / 1e3 for x in p99))
            for k, (b, p50, p99) in points.items()
        }
        return cls(curves, accuracy or {})

    @classmethod
    def load(cls, repo: str | Path) -> ProfileTable:
        """Read every ``<repo>/<model>/<variant>/profiles/*.json``."""
        curves: dict[Key, Curve] = {}
        accuracy: dict[tuple[str, str], float] = {}
        for path in sorted(Path(repo).glob("*/*/profiles/*.json")):
            doc = json.loads(path.read_text())
            key = (doc["model"], doc["variant"], doc["device_type"])
            curves[key] = Curve(
                tuple(doc["batch_sizes"]), tuple(x / 1e3 for x in doc["p50_ms"]), tuple(x / 1e3 for x in doc["p99_ms"])
            )
            if "accuracy" in doc:
                accuracy[(doc["model"], doc["variant"])] = float(doc["accuracy"])
        return cls(curves, accuracy)

    def device_types(self, model: str, variant: str) -> list[str]:
        return sorted(d for (m, v, d) in self.curves if m == model and v == variant)

    def curve(self, model: str, variant: str, device_type: str) -> Curve | None:
        c = self.curves.get((model, variant, device_type))
        if c is None:  # a foreign profile is a better prior than none; one of the same kind first
            kind = device_type.startswith("cpu-")  # min keeps the first (sorted) of the same kind, else of the rest
            other = min(self.device_types(model, variant), key=lambda d: d.startswith("cpu-") != kind, default=None)
            c = self.curves.get((model, variant, other)) if other is not None else None
        return c

    def has(self, model: str, variant: str) -> bool:
        return bool(self.device_types(model, variant))

    def latency_s(self, model: str, variant: str, device_type: str, rows: int, quantile: str = "p99") -> float:
        c = self.curve(model, variant, device_type)
        if c is None:
            raise KeyError(f"no latency profile for {model}/{variant} on any device type")
        return c.at(rows, quantile)

    def with_curve(self, key: Key, curve: Curve) -> ProfileTable:
        """A new table with one curve replaced (tables are frozen; calibration builds new ones)."""
        curves = dict(self.curves)
        curves[key] = curve
        return ProfileTable(curves, self.accuracy)


def write_profile(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
