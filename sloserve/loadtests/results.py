"""What the benchmarks and attack tools share at their end: a result written as JSON, and a spread."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def write_result(doc: Any, out: str | Path | None) -> None:
    """``doc`` as indented JSON in ``out`` (its folder made as needed), said on stderr; nothing when
    ``out`` is unset."""
    if not out:
        return
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank).

    >>> pct([3.0, 1.0, 2.0], 0.99), pct([3.0, 1.0, 2.0], 0.0)
    (3.0, 1.0)
    """
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def spread(xs: list[float]) -> dict[str, float]:
    """Median, 99th percentile and maximum of ``xs`` (not empty)."""
    return {"p50": statistics.median(xs), "p99": pct(xs, 0.99), "max": max(xs)}
