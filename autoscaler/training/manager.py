"""Submit, list, preempt, resume and cancel training jobs; the CLI and the HTTP endpoint use this.

Jobs live in a directory (one sub-directory per job: ``spec.json``, ``job.json`` with the
manager's view, ``status.json`` with the runner's progress, ``checkpoints/``), so a manager in a
short-lived CLI process and one in the gateway see the same jobs. How a job runs is a
``Launcher``: ``SubprocessLauncher`` (an OS process per job, the default), ``ThreadLauncher``
(in-process, for tests and notebooks) or ``training_actor.RayLauncher`` (a Ray actor on
``gpu_<type>`` resources).

>>> import tempfile
>>> m = TrainingManager(tempfile.mkdtemp(), launcher=ThreadLauncher())
>>> info = m.submit(TrainingSpec(job_id="j1", dataset="synthetic", total_iterations=20, checkpoint_every=10))
>>> m.wait("j1", timeout_s=60).state
'finished'
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import psutil

from autoscaler.training.checkpoint import write_json_atomic
from autoscaler.training.job import (
    PreemptOutcome,
    PreemptSignal,
    TrainingRunner,
    TrainingSpec,
    preempt_then_kill,
)

ROOT = Path(__file__).resolve().parents[1]
JOB_ID_RE = re.compile(TrainingSpec.model_fields["job_id"].metadata[0].pattern)


class JobHandle(Protocol):
    def alive(self) -> bool: ...

    def preempt(self, grace_s: float) -> PreemptOutcome: ...


@runtime_checkable
class _Joinable(Protocol):
    """A handle that can block until its job ends (an in-process thread)."""

    def join(self, timeout_s: float) -> None: ...


class Launcher(Protocol):
    name: str

    def start(self, spec: TrainingSpec, job_dir: Path) -> JobHandle: ...

    def attach(self, record: dict) -> JobHandle | None:
        """A handle for a job started by another manager process (None when it cannot be reached)."""


@dataclass(frozen=True, slots=True)
class JobInfo:
    job_id: str
    state: str  # queued | running | preempted | finished | cancelled | failed
    iteration: int
    checkpoint_iteration: int
    total_iterations: int | None
    loss: float | None
    gpu_type: str
    num_gpus: int
    launcher: str | None
    # checkpoints found corrupt when the job last resumed ("<file>: <why>"); an older good one was used
    corrupt_checkpoints: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ launchers


class _ProcessHandle:
    def __init__(self, pid: int, popen: subprocess.Popen | None = None):
        self.pid, self.popen = pid, popen

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        try:  # a zombie (exited, not yet reaped by a parent that is not us) is not alive
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True

    def _wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def preempt(self, grace_s: float) -> PreemptOutcome:
        def send(sig):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

        outcome = preempt_then_kill(lambda: send(signal.SIGTERM), self._wait, lambda: send(signal.SIGKILL), grace_s)
        self._wait(5.0)
        return outcome


class SubprocessLauncher:
    """One ``python -m autoscaler.training.worker`` process per job, detached from the caller."""

    name = "subprocess"

    def start(self, spec: TrainingSpec, job_dir: Path) -> JobHandle:
        with open(job_dir / "worker.log", "ab") as log:  # the child keeps its own descriptor
            p = subprocess.Popen(
                [sys.executable, "-m", "autoscaler.training.worker", "--job-dir", str(job_dir)],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return _ProcessHandle(p.pid, p)

    def attach(self, record: dict) -> JobHandle | None:
        return _ProcessHandle(record["pid"]) if record.get("pid") else None


class _ThreadHandle:
    def __init__(self, runner: TrainingRunner):
        self.runner = runner
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"train-{runner.spec.job_id}")
        self.error: BaseException | None = None
        self.thread.start()

    def _run(self):
        try:
            self.runner.run()
        except BaseException as e:  # recorded for list()
            self.error = e
            self.runner.write_status("failed")

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout_s: float) -> None:
        self.thread.join(timeout_s)

    def preempt(self, grace_s: float) -> PreemptOutcome:
        # a thread cannot be killed: past the grace period it is abandoned and stops at its next boundary
        def stopped_within(t: float) -> bool:
            self.thread.join(t)
            return not self.alive()

        return preempt_then_kill(self.runner.signal.request, stopped_within, lambda: None, grace_s)


class ThreadLauncher:
    name = "thread"

    def start(self, spec: TrainingSpec, job_dir: Path) -> JobHandle:
        return _ThreadHandle(TrainingRunner(spec, job_dir, signal=PreemptSignal()))

    def attach(self, record: dict) -> JobHandle | None:
        return None


# ------------------------------------------------------------------ the manager


class TrainingManager:
    """The job table over a jobs directory; thread-safe."""

    def __init__(self, jobs_dir: str | os.PathLike, launcher: Launcher | None = None, grace_s: float = 1.0):
        self.dir = Path(jobs_dir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.launcher = launcher or SubprocessLauncher()
        self.grace_s = grace_s
        self._handles: dict[str, JobHandle] = {}
        self._lock = threading.RLock()

    def _job_dir(self, job_id: str) -> Path:
        if not JOB_ID_RE.match(job_id):  # ids come from HTTP paths: never let one leave the jobs dir
            raise KeyError(f"no training job {job_id!r}")
        return self.dir / job_id

    def _record(self, job_id: str) -> dict:
        p = self._job_dir(job_id) / "job.json"
        if not p.exists():
            raise KeyError(f"no training job {job_id!r}")
        return json.loads(p.read_text())

    def _save(self, name: str, **fields) -> None:
        path = self._job_dir(name) / "job.json"
        rec = {**self._record(name), **fields} if path.exists() else {"job_id": name, **fields}
        write_json_atomic(path, rec)

    def _handle(self, job_id: str, rec: dict) -> JobHandle | None:
        h = self._handles.get(job_id)
        if h is None and rec.get("launcher") == self.launcher.name:
            h = self.launcher.attach(rec)
        return h

    def submit(self, spec: TrainingSpec, start: bool = True) -> JobInfo:
        with self._lock:
            d = self._job_dir(spec.job_id)
            if (d / "job.json").exists():
                raise ValueError(f"training job {spec.job_id!r} exists; cancel it or pick another id")
            d.mkdir(parents=True, exist_ok=True)
            write_json_atomic(d / "spec.json", spec.model_dump(mode="json"))
            self._save(spec.job_id, state="queued", launcher=None, pid=None)
            return self.start(spec.job_id) if start else self.get(spec.job_id)

    def start(self, job_id: str) -> JobInfo:
        """Start (or resume from its latest checkpoint) a queued or preempted job."""
        with self._lock:
            info = self.get(job_id)
            if info.state == "running":
                return info
            if info.state in ("finished", "cancelled"):
                raise ValueError(f"training job {job_id!r} is {info.state}")
            spec = TrainingSpec.model_validate_json((self._job_dir(job_id) / "spec.json").read_text())
            h = self.launcher.start(spec, self._job_dir(job_id))
            self._handles[job_id] = h
            self._save(job_id, state="running", launcher=self.launcher.name, pid=getattr(h, "pid", None))
            return self.get(job_id)

    def _stop(self, job_id: str, new_state: str, grace_s: float | None) -> JobInfo:
        with self._lock:
            rec = self._record(job_id)
            h = self._handle(job_id, rec)
            outcome = None
            if h is not None and h.alive():
                outcome = h.preempt(self.grace_s if grace_s is None else grace_s)
            if self.get(job_id).state != "finished":
                self._save(job_id, state=new_state, last_stop=outcome)
            self._handles.pop(job_id, None)
            return self.get(job_id)

    def preempt(self, job_id: str, grace_s: float | None = None) -> JobInfo:
        """Checkpoint and stop; the job stays resumable (``start`` resumes it)."""
        return self._stop(job_id, "preempted", grace_s)

    def cancel(self, job_id: str, grace_s: float | None = None) -> JobInfo:
        return self._stop(job_id, "cancelled", grace_s)

    def get(self, job_id: str) -> JobInfo:
        rec = self._record(job_id)
        d = self._job_dir(job_id)
        spec = json.loads((d / "spec.json").read_text())
        st: dict[str, Any] = json.loads((d / "status.json").read_text()) if (d / "status.json").exists() else {}
        state = rec.get("state", "queued")
        if state == "running":
            h = self._handle(job_id, rec)
            if h is None or not h.alive():  # it ended on its own: finished, failed, or died
                status = st.get("status")
                state = status if status in ("finished", "preempted") else "failed"
        return JobInfo(
            job_id,
            state,
            st.get("iteration", 0),
            st.get("checkpoint_iteration", 0),
            spec.get("total_iterations"),
            st.get("loss"),
            spec["gpu_type"],
            spec["num_gpus"],
            rec.get("launcher"),
            list(st.get("corrupt_checkpoints", [])),
        )

    def handle(self, job_id: str) -> JobHandle | None:
        """The live handle of a job this manager started (None when it runs elsewhere or not at all)."""
        return self._handles.get(job_id)

    def last_stop(self, job_id: str) -> str | None:
        """How the job's last preempt or cancel ended: ``checkpointed``, ``killed`` or None."""
        return self._record(job_id).get("last_stop")

    def list(self) -> list[JobInfo]:
        return [self.get(p.name) for p in sorted(self.dir.iterdir()) if (p / "job.json").exists()]

    def wait(self, job_id: str, timeout_s: float) -> JobInfo:
        """Block until the job is no longer running (or the timeout passes)."""
        h = self._handles.get(job_id)
        if isinstance(h, _Joinable):
            h.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        while (info := self.get(job_id)).state == "running" and time.monotonic() < deadline:
            time.sleep(0.02)
        return info
