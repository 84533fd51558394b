"""What ``sloserve models variants`` plans and builds: the checked inputs (:class:`Plan`) and each
built variant with what was measured on it (:class:`Variant`). The command (sloserve/modeltools/variants.py)
fills them in; the report (sloserve/modeltools/variants_report.py) reads them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sloserve.models.repository import TensorSpec
from sloserve.models.variants_check import Signature


@dataclass(slots=True)
class Variant:
    """One built variant and what was measured on it."""

    name: str
    path: Path
    kind: str  # fp32 | fp16 | int8 | extra
    accuracy: float = 0.0
    agreement: float = 0.0
    size_bytes: int = 0
    params: int = 0
    cost_flops: float = 0.0
    p50_ms: dict[str, dict[int, float]] = field(default_factory=dict)  # device type -> batch -> ms


@dataclass(frozen=True, slots=True)
class Plan:
    """What ``generate_variants`` will build, every input checked; nothing written yet."""

    name: str
    source: Path
    sig: Signature
    output: TensorSpec
    kinds: tuple[str, ...]
    extras: dict[str, Path]
    x: np.ndarray
    y: np.ndarray
    calib: np.ndarray  # row indices
    held: np.ndarray
    reference: np.ndarray  # the original's classes on the held-out rows
