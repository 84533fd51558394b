"""The ``slo`` policy's settings: a typed model validated once (a bad value names its key)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SLOSettings(BaseModel):
    """The ``slo`` policy's knobs (docs/batching.md explains each rule they tune)."""

    model_config = ConfigDict(extra="forbid")

    calibrate: bool = Field(default=True, description="Correct the profile online from observed batches.")
    min_gain: float = Field(
        default=0.05, ge=0, description="Wait for a larger batch only if it raises throughput by at least this share."
    )
    max_wait_ms: float | None = Field(
        default=None,
        ge=0,
        description="Longest the oldest request is held to grow a batch (None: up to its latest feasible start).",
    )
    min_wait_ms: float = Field(default=0.1, ge=0, description="Shorter waits are not worth a timer.")
    safety_ms: float = Field(default=0.0, ge=0, description="Slack kept between a planned dispatch and a deadline.")
    spill_derate: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Share of a variant's profiled throughput it "
        "is trusted with before a cheaper variant takes the overflow.",
    )
    restore_headroom: float = Field(
        default=0.25,
        ge=0,
        lt=1,
        description="Headroom the arrival rate must leave before a better variant is restored.",
    )
    restore_hold_ms: float = Field(default=500.0, ge=0, description="How long that headroom must hold.")
    rate_window_ms: float = Field(default=1000.0, gt=0, description="Window of the arrival-rate estimate.")
    predict_busy: bool = Field(
        default=False,
        description="Trust the policy's own predicted finishes of busy "
        "replicas when shedding (the live driver does not report them).",
    )
    wait_load: float = Field(
        default=0.5,
        ge=0,
        description="Wait to grow a batch only above this share of what the "
        "current batch size sustains on one replica.",
    )
    shed_quantile: Literal["p50", "p99"] = Field(default="p50", description="Latency quantile shedding uses.")
    size_quantile: Literal["p50", "p99"] = Field(default="p99", description="Latency quantile batches are sized with.")
    late_target: float = Field(
        default=0.01, ge=0, le=1, description="Share of rows answered late that triggers a cheaper variant."
    )
    late_window_ms: float = Field(default=1000.0, gt=0, description="Window of the lateness count.")
    late_min_rows: int = Field(default=32, ge=1, description="Rows in the window before lateness counts.")
    overload_memory_ms: float = Field(
        default=10000.0, ge=0, description="How long the rate a variant failed at is remembered (0: not at all)."
    )
    calibration_recent: int = Field(
        default=8, ge=0, description="Recent batches that floor the calibrated latency (0: no floor)."
    )
