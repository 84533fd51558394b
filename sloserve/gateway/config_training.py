"""The ``training`` settings: preemptible training jobs on the GPUs inference leaves idle (a part of
:class:`sloserve.gateway.config.Settings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sloserve.autoscaler.placement.types import PlacementConfig
from sloserve.training.job import DEMO_ENTRY, ENTRY_RE


class TrainingSettings(BaseModel):
    """Preemptible training on the GPUs inference leaves idle (sloserve/training/controller.py; Ray backend only)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=False,
        description="Run the harvest controller and serve /v2/training (needs backend ray); with several gateway "
        "workers every one serves it and one at a time places the jobs.",
    )
    jobs_dir: Path = Field(
        default=Path(".sloserve/training"),
        description="Training jobs and their checkpoints. Every gateway that names the same directory serves the "
        "same jobs, and the one holding the lock on its .leader file (flock) places them; gateways on several "
        "hosts need it on shared storage whose locks all of them see (NFSv4, a cluster file system).",
    )
    grace_s: float = Field(
        default=1.0, gt=0, description="A preempted job gets this long to checkpoint and stop before it is killed."
    )
    auto_fill: bool = Field(
        default=True, description="Start queued jobs and resume preempted ones on idle GPUs; False only preempts."
    )
    interval_s: float = Field(default=0.5, gt=0, le=60, description="Seconds between placement rounds.")
    policy: Literal["cost-aware", "cost-blind", "static"] = Field(
        default="cost-aware", description="Placement policy (sloserve/autoscaler/placement/policy.py)."
    )
    gpu_memory_mib: int = Field(default=16384, ge=1, description="Memory of one (emulated) GPU, for placement.")
    queue: Literal["las", "fifo", "srtf", "predictive"] = Field(
        default=PlacementConfig.model_fields["training_queue"].default,  # one default, the policy's
        description="Order of the jobs on harvested GPUs: las (Tiresias' 2D-LAS, with a starvation guard), "
        "fifo, srtf (least remaining GPU-seconds first, for jobs that declare their length), predictive "
        "(performance models: docs/placement.md, 'The predictive queue').",
    )
    tenant_shares: dict[str, float] = Field(
        default_factory=dict,
        description="Most of the harvested GPUs each tenant may hold, e.g. {team-a: 0.5, '*': 0.25} ('*' = "
        "every tenant not listed); a tenant at its share waits.",
    )
    entries: list[str] = Field(
        default_factory=lambda: [DEMO_ENTRY],
        description="The training functions (package.module:function) jobs may name; any other entry is "
        "refused with a 403 before anything is imported. The gateway runs them as itself: list only code "
        "you trust.",
    )
    max_jobs: int = Field(
        default=100,
        ge=1,
        le=100_000,
        description="Most jobs kept at once, finished, failed and cancelled ones included; a submit past it is "
        "a 409 until jobs are cancelled and their files removed (retain_ended_s).",
    )
    max_config_bytes: int = Field(
        default=65536,
        ge=2,
        le=16 << 20,
        description="Largest job config, as compact JSON; a bigger one is a 400.",
    )
    keep_checkpoints: int = Field(
        default=2,
        ge=1,
        le=1000,
        description="Checkpoints kept per job across its runs: each start or resume removes all but the "
        "newest this many that verify (newer corrupt ones stay, named in the job's status).",
    )
    retain_ended_s: float = Field(
        default=86400.0,
        ge=0,
        description="Finished and cancelled jobs' files (spec, status, checkpoints) are removed this long "
        "after they ended; 0 removes a cancelled job's files at once.",
    )

    @field_validator("entries")
    @classmethod
    def _entries(cls, v: list[str]) -> list[str]:
        bad = [e for e in v if not ENTRY_RE.match(e)]
        if bad:
            raise ValueError(f"training.entries: {bad[0][:120]!r} is not package.module:function")
        return v
