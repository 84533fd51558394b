"""Latency models as policies use them: O(1) table lookups of p99 seconds by (variant, rows).

A policy gets its latency knowledge from one of three sources, resolved once here:

* a :class:`~sloserve.batching.calibration.Calibrator` (a profile corrected online; the default),
* a :class:`~sloserve.batching.profile.ProfileTable` (used as is),
* a callable ``latency_fn(variant, rows) -> seconds`` (tests, the simulator, analytic models).

A key is a variant, or for a model on several device types an option key ``"<variant>@<type>"``
(``sloserve.batching.options``): the profile and the calibrator are read for that variant on that type; a
plain variant on ``device_type``. A callable gets the key as it is.

Tables are built lazily per variant for rows ``0..max_batch_size`` (``table[0] == 0``), made
non-decreasing (a bigger batch never finishes sooner), and rebuilt when the calibrator has seen
``refresh_every`` new batches (at once when it flags a jump in latency, ``Calibrator.urgent``), so
a policy decision costs a list index, never a curve walk.

>>> m = LatencyModel(lambda v, n: 0.001 + 0.0005 * n, max_batch_size=8)
>>> m.latency_s("v", 4), m.max_rows_within("v", 0.0021)
(0.003, 2)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sloserve.batching.calibration import Calibrator
from sloserve.batching.options import is_option_key, split_key
from sloserve.batching.profile import ProfileTable
from sloserve.batching.types import BatchResult

LatencyFn = Callable[[str, int], float]
LatencySource = Calibrator | ProfileTable | LatencyFn | str | Path | None


class LatencyModel:
    def __init__(
        self,
        source: LatencySource,
        max_batch_size: int,
        *,
        model: str = "",
        device_type: str = "cpu",
        quantile: str = "p99",
        calibrate: bool = True,
        refresh_every: int = 8,
        recent: int = 8,
    ):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if isinstance(source, (str, Path)):
            source = ProfileTable.load(source)
        if source is None:
            source = ProfileTable({})
        if isinstance(source, ProfileTable) and calibrate:
            source = Calibrator(source, recent=recent)
        self.source = source
        self.calibrator = source if isinstance(source, Calibrator) else None
        self.max_batch_size = max_batch_size
        self.model = model
        self.device_type = device_type
        self.quantile = quantile
        self.refresh_every = max(1, refresh_every)
        self._tables: dict[str, list[float]] = {}
        self._built_at = 0
        self._urgent_at = 0
        self._next_better: dict[tuple[str, float], list[int]] = {}

    # ---- raw source -----------------------------------------------------------------------
    def _raw(self, variant: str, rows: int) -> float:
        src = self.source
        if isinstance(src, Calibrator | ProfileTable):
            v, device = split_key(variant, self.device_type)
            return src.latency_s(self.model, v, device, rows, self.quantile)
        return float(src(variant, rows))

    def _maybe_refresh(self) -> None:
        cal = self.calibrator
        if cal is not None and (cal.version - self._built_at >= self.refresh_every or cal.urgent != self._urgent_at):
            self._tables.clear()
            self._next_better.clear()
            self._built_at = cal.version
            self._urgent_at = cal.urgent

    def table(self, variant: str) -> list[float]:
        """p99 seconds for rows 0..max_batch_size (index = rows), non-decreasing."""
        t = self._tables.get(variant)
        if t is None:
            t = [0.0]
            hi = 0.0
            for n in range(1, self.max_batch_size + 1):
                hi = max(hi, self._raw(variant, n))
                t.append(hi)
            self._tables[variant] = t
        return t

    # ---- queries --------------------------------------------------------------------------
    def latency_s(self, variant: str, rows: int) -> float:
        t = self.table(variant)
        if rows < len(t):
            return t[rows]
        return self._raw(variant, rows)

    def max_rows_within(self, variant: str, budget_s: float) -> int:
        """Largest rows <= max_batch_size whose latency fits in ``budget_s`` (0 if not even one)."""
        if budget_s <= 0:
            return 0
        return bisect.bisect_right(self.table(variant), budget_s) - 1

    def throughput_rps(self, variant: str, rows: int) -> float:
        return rows / self.latency_s(variant, rows)

    def next_better(self, variant: str, rows: int, min_gain: float) -> int:
        """Smallest batch > ``rows`` whose rows/s beat ``rows``'s by ``min_gain`` (max+1 if none)."""
        key = (variant, min_gain)
        nb = self._next_better.get(key)
        if nb is None:
            t = self.table(variant)
            n = self.max_batch_size
            tput = [0.0] + [i / t[i] for i in range(1, n + 1)]
            suffix = [0.0] * (n + 2)
            for i in range(n, 0, -1):
                suffix[i] = max(suffix[i + 1], tput[i])
            nb = [n + 1] * (n + 1)
            for r in range(1, n + 1):
                goal = tput[r] * (1.0 + min_gain)
                if suffix[r + 1] <= goal:
                    continue
                b = r + 1
                while tput[b] <= goal:
                    b += 1
                nb[r] = b
            nb[0] = 1
            self._next_better[key] = nb
        return nb[rows] if rows < len(nb) else self.max_batch_size + 1

    def observe(self, result: BatchResult) -> None:
        if self.calibrator is not None and result.model == self.model:
            if is_option_key(result.variant):  # the calibrator keys on the pair the key names
                v, device = split_key(result.variant, self.device_type)
                result = replace(result, variant=v, device_type=device)
            self.calibrator.observe(result)
            self._maybe_refresh()
