"""Preemptible training jobs: a real training loop that checkpoints atomically and stops at an
iteration boundary when asked. No Ray here (the actor wrapper is ``training_actor``), so unit
tests and the simulator can import it.

The job trains a one-hidden-layer MLP with minibatch SGD on scikit-learn's digits (or a synthetic
Gaussian-blob problem). Minibatch ``i`` is drawn from ``default_rng([seed, i])``, so a job resumed
from the checkpoint of iteration ``k`` computes exactly what an uninterrupted job computes from
``k`` on: preemption costs only the iterations after the last checkpoint, bit for bit.

>>> import tempfile
>>> spec = TrainingSpec(job_id="demo", dataset="synthetic", total_iterations=30, checkpoint_every=10)
>>> r = TrainingRunner(spec, tempfile.mkdtemp()).run()
>>> r.status, r.iteration, r.checkpoint_iteration
('finished', 30, 30)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autoscaler.training.checkpoint import (
    MidWriteHook,
    clean_temp,
    load_latest,
    write_checkpoint,
    write_json_atomic,
)

_log = logging.getLogger(__name__)

Status = Literal["queued", "running", "preempted", "finished", "cancelled", "failed"]  # a job's state
RunStatus = Literal["finished", "preempted", "stopped"]  # how one run() ended


class TrainingSpec(BaseModel):
    """One training job: what it trains, how long, how often it checkpoints, what it needs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Unique job name.")
    dataset: Literal["digits", "synthetic"] = Field(default="digits", description="Training data.")
    hidden: int = Field(default=64, ge=1, le=4096, description="Hidden units of the MLP.")
    lr: float = Field(default=0.1, gt=0, le=100, description="SGD learning rate.")
    batch_size: int = Field(default=64, ge=1, le=65536, description="Rows per minibatch.")
    total_iterations: int | None = Field(default=2000, ge=1, le=10**9, description="None: run until cancelled.")
    checkpoint_every: int = Field(default=50, ge=1, le=10**7, description="Checkpoint every this many iterations.")
    iteration_delay_s: float = Field(
        default=0.0, ge=0, le=60, description="Extra time per iteration (emulates a heavier model on an emulated GPU)."
    )
    seed: int = Field(default=0, ge=0, lt=2**63, description="Seed of the weights and the minibatch order.")
    num_gpus: int = Field(default=1, ge=1, le=64, description="GPUs the job needs (a gang of one type).")
    gpu_type: str = Field(
        default="T4",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$",
        description="GPU type; Ray resource gpu_<type> when emulated.",
    )
    memory_mib: int = Field(default=2048, ge=0, le=1 << 20, description="Device memory per GPU.")


def load_data(dataset: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if dataset == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        return (x / 16.0).astype(np.float32), y.astype(np.int64)
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(10, 64))
    y = rng.integers(0, 10, size=2000)
    return (centers[y] + rng.normal(size=(2000, 64))).astype(np.float32), y.astype(np.int64)


def init_params(spec: TrainingSpec, n_in: int, n_out: int = 10) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([spec.seed, 2**31])
    return {
        "w1": (rng.normal(size=(n_in, spec.hidden)) * np.sqrt(2 / n_in)).astype(np.float32),
        "b1": np.zeros(spec.hidden, np.float32),
        "w2": (rng.normal(size=(spec.hidden, n_out)) * np.sqrt(1 / spec.hidden)).astype(np.float32),
        "b2": np.zeros(n_out, np.float32),
    }


def sgd_step(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, lr: float) -> float:
    """One minibatch of SGD on softmax cross-entropy; updates ``p`` in place, returns the loss."""
    h = np.maximum(x @ p["w1"] + p["b1"], 0)
    z = h @ p["w2"] + p["b2"]
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    prob = e / e.sum(axis=1, keepdims=True)
    n = len(y)
    loss = float(-np.log(prob[np.arange(n), y] + 1e-12).mean())
    g = prob
    g[np.arange(n), y] -= 1
    g /= n
    gw2, gb2 = h.T @ g, g.sum(0)
    gh = (g @ p["w2"].T) * (h > 0)
    gw1, gb1 = x.T @ gh, gh.sum(0)
    for k, gk in (("w1", gw1), ("b1", gb1), ("w2", gw2), ("b2", gb2)):
        p[k] -= lr * gk.astype(np.float32)
    return loss


@dataclass(frozen=True, slots=True)
class RunResult:
    status: RunStatus  # stopped: max_iterations reached (tests emulate a crash with it)
    iteration: int
    checkpoint_iteration: int
    resumed_from: int  # 0 = fresh start
    loss: float | None
    accuracy: float | None = None


class PreemptSignal:
    """Set from any thread (a Ray actor method, a signal handler); read at iteration boundaries."""

    def __init__(self):
        self._event = threading.Event()

    def request(self) -> None:
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()


class TrainingRunner:
    """Runs one job in one checkpoint directory (one runner per directory at a time)."""

    def __init__(
        self,
        spec: TrainingSpec,
        directory: str | Path,
        signal: PreemptSignal | None = None,
        sleep: Callable[[float], None] | None = None,
        mid_write_hook: MidWriteHook | None = None,
        mid_write_at_iteration: int | None = None,
    ):
        self.spec = spec
        self.dir = Path(directory)
        self.ckpt_dir = self.dir / "checkpoints"
        self.signal = signal or PreemptSignal()
        self._sleep = sleep or time.sleep
        self._hook, self._hook_at = mid_write_hook, mid_write_at_iteration
        self.x, self.y = load_data(spec.dataset, spec.seed)
        self.params = init_params(spec, self.x.shape[1])
        self.iteration = 0
        self.checkpoint_iteration = 0
        self.resumed_from = 0
        self.loss: float | None = None
        self.corrupt: list[str] = []

    # ------------------------------------------------------------ checkpoints
    def resume(self) -> int:
        """Load the latest valid checkpoint (removing torn temp files first); returns its iteration."""
        clean_temp(self.ckpt_dir)
        c = load_latest(self.ckpt_dir, on_corrupt=self._note_corrupt)
        if c is not None:
            self.params = {k: np.array(v) for k, v in c.arrays.items()}
            self.iteration = self.checkpoint_iteration = self.resumed_from = c.iteration
            self.loss = c.meta.get("loss")  # type: ignore[assignment]
        return self.iteration

    def _note_corrupt(self, path: Path, error: Exception) -> None:
        # Named in status.json (``train list``, the HTTP API) and logged; the file stays for a person.
        self.corrupt.append(f"{path.name}: {error}")
        _log.warning(
            "training job %s: checkpoint %s is corrupt (%s); using an older one", self.spec.job_id, path, error
        )

    def checkpoint(self) -> None:
        hook = self._hook if self._hook_at is not None and self.iteration >= self._hook_at else None
        write_checkpoint(
            self.ckpt_dir,
            self.iteration,
            self.params,
            {"loss": self.loss, "job_id": self.spec.job_id},
            mid_write_hook=hook,
        )
        self.checkpoint_iteration = self.iteration
        self.write_status("running")

    def write_status(self, status: Status) -> None:
        write_json_atomic(
            self.dir / "status.json",
            {
                "job_id": self.spec.job_id,
                "status": status,
                "iteration": self.iteration,
                "checkpoint_iteration": self.checkpoint_iteration,
                "total_iterations": self.spec.total_iterations,
                "loss": self.loss,
                "resumed_from": self.resumed_from,
                "corrupt_checkpoints": self.corrupt,
            },
        )

    # ------------------------------------------------------------ the loop
    def step(self) -> float:
        rng = np.random.default_rng([self.spec.seed, self.iteration])
        idx = rng.integers(0, len(self.y), size=self.spec.batch_size)
        self.loss = sgd_step(self.params, self.x[idx], self.y[idx], self.spec.lr)
        self.iteration += 1
        if self.spec.iteration_delay_s:
            self._sleep(self.spec.iteration_delay_s)
        return self.loss

    def accuracy(self) -> float:
        h = np.maximum(self.x @ self.params["w1"] + self.params["b1"], 0)
        return float(((h @ self.params["w2"] + self.params["b2"]).argmax(1) == self.y).mean())

    def run(self, max_iterations: int | None = None, resume: bool = True) -> RunResult:
        """Train until done, preempted (checkpoint at the boundary, then return) or ``max_iterations``
        more iterations (no checkpoint: used by tests to emulate a crash)."""
        if resume:
            self.resume()
        self.write_status("running")
        total = self.spec.total_iterations
        ran = 0
        while total is None or self.iteration < total:
            if self.signal.requested:
                if self.checkpoint_iteration != self.iteration:
                    self.checkpoint()
                self.write_status("preempted")
                return self._result("preempted")
            if max_iterations is not None and ran >= max_iterations:
                return self._result("stopped")
            self.step()
            ran += 1
            if self.iteration % self.spec.checkpoint_every == 0:
                self.checkpoint()
        if self.checkpoint_iteration != self.iteration:
            self.checkpoint()
        self.write_status("finished")
        return self._result("finished", accuracy=self.accuracy())

    def _result(self, status, accuracy=None) -> RunResult:
        return RunResult(status, self.iteration, self.checkpoint_iteration, self.resumed_from, self.loss, accuracy)


# ------------------------------------------------------------------ preemption protocol

PreemptOutcome = Literal["checkpointed", "killed"]


def preempt_then_kill(
    request: Callable[[], None], wait: Callable[[float], bool], kill: Callable[[], None], grace_s: float
) -> PreemptOutcome:
    """Ask a job to checkpoint at its next iteration boundary and stop; if it has not stopped within
    ``grace_s`` (``wait(timeout)`` returns whether it has), kill it. The mechanism (thread, process,
    Ray actor) supplies the three callables; it resumes from its latest checkpoint either way."""
    request()
    if wait(grace_s):
        return "checkpointed"
    kill()
    return "killed"
