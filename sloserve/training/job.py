"""A training job: the user's own PyTorch training function, its JSON config and the gang it needs.

No Ray and no torch here, so the CLI, the HTTP layer and unit tests can import it. The function
(``entry = "package.module:function"``) is run by Ray Train's ``TorchTrainer`` on ``workers`` Ray
workers, one GPU of ``gpu_type`` each (``sloserve/training/runtime.py``); it reads its config,
resumes from ``session.load()``, calls ``session.should_stop()`` each iteration and
``session.save(...)`` to checkpoint (``sloserve/training/session.py``).

>>> s = TrainingSpec(job_id="j", entry="sloserve.training.demo:train", workers=2, gpu_type="T4")
>>> s.num_gpus, s.entry_parts()
(2, ('sloserve.training.demo', 'train'))
"""

from __future__ import annotations

import importlib
import re
import traceback
from collections.abc import Callable, Collection
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sloserve.autoscaler.placement.perfmodel import GPU_GENERATION, MODEL_CLASSES, known_gpu_type

Status = Literal["queued", "running", "preempted", "finished", "cancelled", "failed"]  # a job's state
PreemptOutcome = Literal["checkpointed", "killed"]

ENTRY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
DEMO_ENTRY = "sloserve.training.demo:train"


class TrainingSpec(BaseModel):
    """One training job: whose code, which config, what gang, and hints for the placement policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Unique job name.")
    entry: str = Field(
        default=DEMO_ENTRY,
        pattern=ENTRY_RE.pattern,
        description="The training function, package.module:function; called with the config on every worker.",
    )
    config: dict[str, Any] = Field(default_factory=dict, description="JSON config passed to the function.")
    workers: int = Field(default=1, ge=1, le=64, description="Gang size: Ray Train workers, one GPU each.")
    min_workers: int | None = Field(
        default=None, ge=1, le=64, description="Elastic: keep running on this many workers (None: the whole gang)."
    )
    gpu_type: str = Field(
        default="T4",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$",
        description="GPU type; Ray resources GPU + accelerator_type:<type> (declared by hand when emulated).",
    )
    memory_mib: int = Field(default=2048, ge=0, le=1 << 20, description="Device memory per GPU (placement).")
    total_iterations: int | None = Field(
        default=None, ge=1, le=10**9, description="The job's declared length in iterations (placement hint)."
    )
    checkpoint_every: int = Field(
        default=50, ge=1, le=10**7, description="Iterations between the function's checkpoints (placement hint)."
    )
    tenant: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Team the job belongs to."
    )
    # the predictive queue's inputs (docs/placement.md, "The predictive queue")
    model_class: str | None = Field(
        default=None,
        description="Class of the model, the performance model's prior (resnet50, resnet18, transformer, lm, "
        "recommendation, a3c, cyclegan); None: no model, the predictive queue orders it by 2D-LAS.",
    )
    target_loss: float | None = Field(
        default=None, gt=0, description="Loss at which the job is done; its fitted loss curve predicts when."
    )
    max_workers: int | None = Field(
        default=None, ge=1, le=64, description="Elastic: the predictive queue may size the gang up to this."
    )
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=10**8,
        description="Finish within this many seconds of submission: admitted as SLO-bound only if the model "
        "says it can (else it runs best-effort, and the answer says so); needs total_iterations.",
    )
    iteration_time_s: float | None = Field(
        default=None, gt=0, le=3600, description="Seconds per iteration on its gang, as profiled (first estimate)."
    )

    @field_validator("model_class")
    @classmethod
    def _known_class(cls, v: str | None) -> str | None:
        if v is not None and v not in MODEL_CLASSES:
            raise ValueError(f"unknown model class {v!r}; known: {sorted(MODEL_CLASSES)}")
        return v

    @model_validator(mode="after")
    def _min_le_workers(self) -> TrainingSpec:
        if self.min_workers is not None and self.min_workers > self.workers:
            raise ValueError(f"min_workers ({self.min_workers}) is more than workers ({self.workers})")
        if self.max_workers is not None and self.max_workers < self.workers:
            raise ValueError(f"max_workers ({self.max_workers}) is less than workers ({self.workers})")
        if self.model_class is not None and not known_gpu_type(self.gpu_type):
            raise ValueError(
                f"gpu_type {self.gpu_type!r} has no speed in the performance model; known: {sorted(GPU_GENERATION)}"
            )
        if self.deadline_s is not None and (self.total_iterations is None or self.model_class is None):
            raise ValueError("deadline_s needs total_iterations and model_class (to check that it can make it)")
        return self

    @property
    def num_gpus(self) -> int:
        return self.workers

    def entry_parts(self) -> tuple[str, str]:
        module, _, fn = self.entry.partition(":")
        return module, fn


class JobRejected(ValueError):
    """A job that can never run as submitted (the message says what to fix): a 400, not a 409."""


class EntryError(JobRejected):
    """The entry cannot be imported or is not a function."""


class EntryNotAllowed(JobRejected):
    """The entry is not on the operator's allow-list (``training.entries``): a 403."""


class JobLimit(ValueError):
    """A cap on jobs is reached (``training.max_jobs``): a 409 until jobs are removed."""


def check_entry_allowed(entry: str, allowed: Collection[str] | None) -> None:
    """Refuse an entry the operator has not listed, before anything is imported; ``allowed`` None
    allows any (the standalone CLI: jobs run as the user who starts them).

    >>> check_entry_allowed("subprocess:run", [DEMO_ENTRY])
    Traceback (most recent call last):
    ...
    sloserve.training.job.EntryNotAllowed: entry 'subprocess:run' is not in training.entries (the training functions this server runs: sloserve.training.demo:train); an operator adds it there
    """
    if allowed is not None and entry not in allowed:
        listed = ", ".join(sorted(allowed)) or "none"
        raise EntryNotAllowed(
            f"entry {entry[:200]!r} is not in training.entries (the training functions this server runs: "
            f"{listed[:1000]}); an operator adds it there"
        )


def resolve_entry(entry: str) -> Callable[[dict], Any]:
    """Import ``package.module:function``; an ``EntryError`` says what to fix.

    >>> resolve_entry("no_such_pkg.mod:train")
    Traceback (most recent call last):
    ...
    sloserve.training.job.EntryError: entry 'no_such_pkg.mod:train': cannot import no_such_pkg.mod (No module named 'no_such_pkg')
    """
    if not ENTRY_RE.match(entry):
        raise EntryError(f"entry {entry!r} is not package.module:function")
    module, _, name = entry.partition(":")
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        raise EntryError(f"entry {entry!r}: cannot import {module} ({e})") from None
    fn = getattr(mod, name, None)
    if not callable(fn):
        raise EntryError(f"entry {entry!r}: {module} has no function {name}")
    return fn


def traceback_tail(exc: BaseException, lines: int = 15) -> str:
    """The last ``lines`` lines of an exception's traceback (what a failed job's status shows)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return "\n".join(text.rstrip().splitlines()[-lines:])


def preempt_then_kill(
    request: Callable[[], None], wait: Callable[[float], bool], kill: Callable[[], None], grace_s: float
) -> PreemptOutcome:
    """Ask a job to checkpoint at its next iteration boundary and stop; if it has not stopped within
    ``grace_s`` (``wait(timeout)`` returns whether it has), kill it. It resumes from its latest
    checkpoint either way."""
    request()
    if wait(grace_s):
        return "checkpointed"
    kill()
    return "killed"
