"""Submit, list, preempt, resume and cancel training jobs; the CLI and the HTTP endpoint use this.

Jobs live in a directory (one sub-directory per job: ``spec.json``, ``job.json`` with the
manager's view, ``status.json`` with the run's progress, ``storage/`` with Ray Train's runs and
checkpoints), so a manager in a short-lived CLI process and one in the gateway see the same jobs.
How a job runs is a ``Launcher``: ``runtime.RayLauncher`` (a Ray Train run on the connected Ray
cluster: the gateway's harvest controller) or ``SubprocessLauncher`` (``sloserve train`` without a
gateway: an OS process per job that starts a local Ray with the job's GPUs, emulated on a CPU box).

Limits (the gateway passes its ``training`` settings): ``entries``, the training functions a job may
name (checked before anything is imported, at submit and again at every start, so a spec written
into the directory by hand runs no other code); ``max_jobs`` kept at once; ``max_config_bytes`` of
config; ``keep_checkpoints`` per job across its runs (pruned at each start); and ``retain_ended_s``,
after which a finished or cancelled job's directory is removed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil
from pydantic import ValidationError

from sloserve.training.checkpoint import prune, write_json_atomic
from sloserve.training.job import (
    DEMO_ENTRY,
    JobLimit,
    JobRejected,
    PreemptOutcome,
    TrainingSpec,
    check_entry_allowed,
    preempt_then_kill,
    resolve_entry,
)
from sloserve.training.leader import flocked

ROOT = Path(__file__).resolve().parents[2]
JOB_ID_RE = re.compile(TrainingSpec.model_fields["job_id"].metadata[0].pattern)


class JobHandle(Protocol):
    def alive(self) -> bool: ...

    def preempt(self, grace_s: float) -> PreemptOutcome: ...


class Launcher(Protocol):
    name: str

    def check(self, spec: TrainingSpec) -> None:
        """Raise ``ValueError`` naming what to fix when the job can never run here."""

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
    entry: str = ""
    checkpoint: str | None = None  # the last checkpoint: <run>/checkpoint_<iteration> under the job's storage
    preemptions: int = 0
    lost_iterations: int = 0  # work lost to preemptions (iterations past the last checkpoint), all together
    # checkpoints found corrupt when the job last resumed ("<run>/<dir>: <why>"); an older good one was used
    corrupt_checkpoints: list[str] = field(default_factory=list)
    error: str | None = None  # a failed job's traceback tail
    tenant: str | None = None
    min_workers: int | None = None  # elastic: the fewest workers it runs on
    workers: int = 0  # the gang of its current (or last) run
    submitted_at: float | None = None  # wall clock
    finished_at: float | None = None  # wall clock, once finished
    # under the gateway's placement controller (None without one): GPU-seconds of service so far,
    # its place in the training queue (0 = head) and why it waits
    attained_gpu_s: float | None = None
    queue_position: int | None = None
    queue_reason: str | None = None
    # the predictive queue's view: predictable, why, predicted remaining time, held-out errors, order, SLO
    prediction: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ the standalone launcher


def create_time(pid: int) -> float | None:
    """When process ``pid`` started (psutil's clock), or None when there is no such process."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class _ProcessHandle:
    """A job's worker process, started here (``popen``) or by another manager: then only while the
    pid still names the process that was started (its create time, as recorded), so a pid the
    system has since given to another process is never signalled."""

    def __init__(self, pid: int, popen: subprocess.Popen | None = None, created: float | None = None):
        self.pid, self.popen = pid, popen
        self.created = create_time(pid) if popen is not None and created is None else created

    def _same_process(self) -> bool:
        if self.popen is not None:
            return True
        now = create_time(self.pid)
        return now is not None and self.created is not None and abs(now - self.created) < 0.01

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        if not self._same_process():  # gone, or the pid was reused by another process
            return False
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
            time.sleep(0.02)
        return True

    def preempt(self, grace_s: float) -> PreemptOutcome:
        def send(sig):
            if not self._same_process():
                return
            try:
                os.killpg(self.pid, sig)  # its own session: the local Ray it started goes with it
            except ProcessLookupError:
                pass

        outcome = preempt_then_kill(lambda: send(signal.SIGTERM), self._wait, lambda: send(signal.SIGKILL), grace_s)
        self._wait(10.0)
        return outcome


class SubprocessLauncher:
    """One ``python -m sloserve.training.worker`` process per job, detached from the caller; it
    starts a local Ray with the job's GPUs (emulated when the box has none) and runs the job on it."""

    name = "subprocess"

    def check(self, spec: TrainingSpec) -> None:
        resolve_entry(spec.entry)

    def start(self, spec: TrainingSpec, job_dir: Path) -> JobHandle:
        with open(job_dir / "worker.log", "ab") as log:  # the child keeps its own descriptor
            p = subprocess.Popen(
                [sys.executable, "-m", "sloserve.training.worker", "--job-dir", str(job_dir)],
                cwd=os.getcwd(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return _ProcessHandle(p.pid, p)

    def attach(self, record: dict) -> JobHandle | None:
        if not record.get("pid") or record.get("pid_created") is None:
            return None  # no create time recorded: the pid alone may name another process by now
        return _ProcessHandle(int(record["pid"]), created=float(record["pid_created"]))


# ------------------------------------------------------------------ the manager


ENDED = ("finished", "cancelled")  # states a job never leaves: its files go after retain_ended_s
SWEEP_EVERY_S = 30.0
ABANDONED_S = 60.0  # a job directory without job.json this long is a submit that never finished


class TrainingManager:
    """The job table over a jobs directory; thread-safe.

    ``entries``: the training functions jobs may name (None: any, for the standalone CLI, whose jobs
    run as the user who starts them); the other limits are the ``training`` settings of the same
    names (``sloserve/gateway/config.py``)."""

    def __init__(
        self,
        jobs_dir: str | os.PathLike,
        launcher: Launcher | None = None,
        grace_s: float = 1.0,
        *,
        entries: list[str] | tuple[str, ...] | None = (DEMO_ENTRY,),
        max_jobs: int = 100,
        max_config_bytes: int = 65536,
        keep_checkpoints: int = 2,
        retain_ended_s: float = 86400.0,
    ):
        self.dir = Path(jobs_dir).resolve()
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.launcher: Launcher = launcher or SubprocessLauncher()
        self.grace_s = grace_s
        self.entries = None if entries is None else frozenset(entries)
        self.max_jobs, self.max_config_bytes = max_jobs, max_config_bytes
        self.keep_checkpoints, self.retain_ended_s = keep_checkpoints, retain_ended_s
        self._handles: dict[str, JobHandle] = {}
        self._lock = threading.RLock()
        self._swept = -float("inf")

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
        d = self._job_dir(name)
        with flocked(d / ".job.lock"):  # other gateway processes update the same record
            rec = {**self._record(name), **fields} if (d / "job.json").exists() else {"job_id": name, **fields}
            write_json_atomic(d / "job.json", rec)

    def _handle(self, job_id: str, rec: dict) -> JobHandle | None:
        """The handle of the job's current run: the one this manager started, or one attached to a
        run another manager (another gateway process) started."""
        h = self._handles.get(job_id)
        if h is not None and getattr(h, "actor_id", None) not in (None, rec.get("actor_id")):
            self._handles.pop(job_id, None)  # restarted by another manager since: that run is the job's
            h = None
        if h is None and rec.get("launcher") == self.launcher.name:
            h = self.launcher.attach(rec)
        return h

    def spec(self, job_id: str) -> TrainingSpec:
        return TrainingSpec.model_validate_json((self._job_dir(job_id) / "spec.json").read_text())

    def submit(self, spec: TrainingSpec, start: bool = True) -> JobInfo:
        """Queue a job (and start it). ``ValueError`` when it exists; ``JobRejected`` when its entry
        is not allowed (``EntryNotAllowed``) or does not import, its config is over
        ``max_config_bytes``, or it asks for more GPUs of its type than the cluster has;
        ``JobLimit`` when ``max_jobs`` are kept."""
        check_entry_allowed(spec.entry, self.entries)  # before the launcher imports anything
        size = len(json.dumps(spec.config, separators=(",", ":")))
        if size > self.max_config_bytes:
            raise JobRejected(
                f"the job's config is {size} bytes of JSON, over the limit of {self.max_config_bytes} "
                "(training.max_config_bytes)"
            )
        with self._lock:
            d = self._job_dir(spec.job_id)
            exists = ValueError(f"training job {spec.job_id!r} exists; cancel it or pick another id")
            if (d / "job.json").exists():
                raise exists
            self.sweep()
            kept = sum(1 for p in self.dir.iterdir() if (p / "job.json").exists())
            if kept >= self.max_jobs:
                raise JobLimit(
                    f"{kept} training jobs are kept, the limit (training.max_jobs); cancel some: finished and "
                    f"cancelled jobs are removed {self.retain_ended_s:g} s after they end (training.retain_ended_s)"
                )
            self.launcher.check(spec)
            if not self._claim(d):  # another process submitted the same id meanwhile
                raise exists
            write_json_atomic(d / "spec.json", spec.model_dump(mode="json"))
            self._save(
                spec.job_id,
                state="queued",
                launcher=None,
                pid=None,
                preemptions=0,
                lost_iterations=0,
                submitted_at=time.time(),
            )
            return self.start(spec.job_id) if start else self.get(spec.job_id)

    def _claim(self, d: Path) -> bool:
        """Create a job's directory, atomically: of several processes submitting one id, one gets
        True. A directory left without a ``job.json`` for ``ABANDONED_S`` (a submit that crashed, a
        removal cut short) is taken over."""
        for _ in range(2):
            try:
                d.mkdir(mode=0o700)
                return True
            except FileExistsError:
                try:
                    stale = not (d / "job.json").exists() and time.time() - d.stat().st_mtime > ABANDONED_S
                except OSError:
                    stale = True  # removed meanwhile: try again
                if not stale:
                    return False
                shutil.rmtree(d, ignore_errors=True)
        return False

    def start(self, job_id: str, workers: int | None = None, gpu_type: str | None = None) -> JobInfo:
        """Start (or resume from its latest good checkpoint) a queued, preempted or failed job.
        ``workers``: an elastic job's gang for this run, from its ``min_workers`` to its ``workers``
        (the placement controller's choice; default the whole gang). ``gpu_type``: run it from now
        on on GPUs of this type (the checkpoint is device-independent); ``ValueError`` when the
        cluster has none, or while the job runs on another type."""
        with self._lock:
            info = self.get(job_id)
            spec = self.spec(job_id)
            if info.state not in ("running", "finished", "cancelled"):
                try:  # the spec on disk is checked again, before any import: only listed entries run
                    check_entry_allowed(spec.entry, self.entries)
                except JobRejected as e:
                    self._save(job_id, state="failed", error=str(e))
                    raise
            if gpu_type is not None and gpu_type != spec.gpu_type:
                if info.state == "running":
                    raise ValueError(
                        f"training job {job_id!r} is running on {spec.gpu_type}; preempt it before moving it to {gpu_type}"
                    )
                if info.state in ("finished", "cancelled"):
                    raise ValueError(f"training job {job_id!r} is {info.state}")
                try:
                    spec = TrainingSpec.model_validate({**spec.model_dump(mode="json"), "gpu_type": gpu_type})
                except ValidationError as e:  # a malformed type name
                    raise JobRejected(f"gpu_type {gpu_type!r}: {e.errors()[0]['msg']}") from None
                self.launcher.check(spec)
                write_json_atomic(self._job_dir(job_id) / "spec.json", spec.model_dump(mode="json"))
                info = self.get(job_id)
            if info.state == "running":
                return info
            if info.state in ("finished", "cancelled"):
                raise ValueError(f"training job {job_id!r} is {info.state}")
            n = spec.workers if workers is None else workers
            if not (spec.min_workers or spec.workers) <= n <= spec.workers:
                raise ValueError(
                    f"training job {job_id!r} runs on {spec.min_workers or spec.workers} to {spec.workers} workers, not {n}"
                )
            prune(self._job_dir(job_id) / "storage", self.keep_checkpoints)
            h = self.launcher.start(spec.model_copy(update={"workers": n}), self._job_dir(job_id))
            self._handles[job_id] = h
            self._save(
                job_id,
                state="running",
                launcher=self.launcher.name,
                pid=getattr(h, "pid", None),
                pid_created=getattr(h, "created", None),
                actor_id=getattr(h, "actor_id", None),
                started_by=f"{socket.gethostname()}:{os.getpid()}",  # the gateway process that started this run
                error=None,
                workers_now=n,
                started_at=time.time(),
            )
            return self.get(job_id)

    def _stop(self, job_id: str, new_state: str, grace_s: float | None) -> JobInfo:
        with self._lock:
            rec = self._record(job_id)
            h = self._handle(job_id, rec)
            outcome = None
            if h is not None and h.alive():
                before = self.get(job_id).iteration
                live = getattr(h, "progress", None)
                p = live() if live is not None else None
                if p:
                    before = max(before, int(p.get("iteration", 0)))
                outcome = h.preempt(self.grace_s if grace_s is None else grace_s)
                after = self.get(job_id)
                lost = max(before - after.checkpoint_iteration, 0) if outcome == "killed" else 0
                self._save(
                    job_id,
                    preemptions=int(rec.get("preemptions", 0)) + 1,
                    lost_iterations=int(rec.get("lost_iterations", 0)) + lost,
                )
            self._handles.pop(job_id, None)
            keep = ("finished",) if new_state == "cancelled" else ("finished", "failed")
            if outcome is not None or self.get(job_id).state not in keep:
                # stopped by us (a kill leaves no status of its own), or not running at all; a failed
                # job that is cancelled is cancelled (and its files go after retain_ended_s)
                ended = {"ended_at": time.time()} if new_state == "cancelled" else {}
                self._save(job_id, state=new_state, last_stop=outcome, **ended)
            self._handles.pop(job_id, None)
            info = self.get(job_id)
            if info.state == "cancelled" and self.retain_ended_s <= 0:
                self._remove(job_id)
            return info

    def preempt(self, job_id: str, grace_s: float | None = None) -> JobInfo:
        """Checkpoint and stop; the job stays resumable (``start`` resumes it)."""
        return self._stop(job_id, "preempted", grace_s)

    def cancel(self, job_id: str, grace_s: float | None = None) -> JobInfo:
        return self._stop(job_id, "cancelled", grace_s)

    def _remove(self, job_id: str) -> None:
        self._handles.pop(job_id, None)
        d = self._job_dir(job_id)
        (d / "job.json").unlink(missing_ok=True)  # first: a half-removed directory is no job
        shutil.rmtree(d, ignore_errors=True)

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove the directories of finished and cancelled jobs that ended ``retain_ended_s`` ago or
        more (a job's spec, status and checkpoints); returns their ids."""
        now = time.time() if now is None else now
        gone = []
        with self._lock:
            for p in sorted(self.dir.iterdir()):
                if not (p / "job.json").exists() or not JOB_ID_RE.match(p.name):
                    continue
                try:
                    info = self.get(p.name)
                    rec = self._record(p.name)
                except (KeyError, OSError, ValueError):
                    continue
                if info.state not in ENDED:
                    continue
                ended = info.finished_at if info.state == "finished" else rec.get("ended_at")
                if ended is None:
                    ended = (p / "job.json").stat().st_mtime
                if now - float(ended) >= self.retain_ended_s:
                    self._remove(p.name)
                    gone.append(p.name)
        return gone

    def get(self, job_id: str) -> JobInfo:
        rec = self._record(job_id)
        d = self._job_dir(job_id)
        spec = json.loads((d / "spec.json").read_text())
        st: dict[str, Any] = {}
        try:
            st = json.loads((d / "status.json").read_text()) if (d / "status.json").exists() else {}
        except ValueError:
            pass
        state = rec.get("state", "queued")
        error = rec.get("error")
        if state == "running":
            h = self._handle(job_id, rec)
            if h is None or not h.alive():  # it ended on its own: finished, failed, or died
                release = getattr(h, "release", None)
                if release is not None:  # (its driver ends itself once its run ended; this makes sure)
                    release()
                    self._handles.pop(job_id, None)
                status = st.get("status")
                state = status if status in ("finished", "preempted", "failed") else "failed"
                if state == "failed" and not st.get("error"):
                    error = "the job's driver ended without a status (killed, or its Ray cluster went away)"
        if state == "failed":
            error = st.get("error") or error
        return JobInfo(
            job_id,
            state,
            int(st.get("iteration", 0)),
            int(st.get("checkpoint_iteration", 0)),
            spec.get("total_iterations"),
            st.get("loss"),
            spec["gpu_type"],
            spec["workers"],
            rec.get("launcher"),
            entry=spec["entry"],
            checkpoint=st.get("checkpoint"),
            preemptions=int(rec.get("preemptions", 0)),
            lost_iterations=int(rec.get("lost_iterations", 0)),
            corrupt_checkpoints=list(st.get("corrupt_checkpoints", [])),
            error=error if state == "failed" else None,
            tenant=spec.get("tenant"),
            min_workers=spec.get("min_workers"),
            workers=int(rec.get("workers_now") or spec["workers"]),
            submitted_at=rec.get("submitted_at"),
            finished_at=st.get("finished_at") if state == "finished" else None,
        )

    def handle(self, job_id: str) -> JobHandle | None:
        """The handle of a job's current run, started by this manager or by another (attached); None
        when it is not running or cannot be reached."""
        try:
            rec = self._record(job_id)
        except (KeyError, OSError, ValueError):
            return self._handles.get(job_id)
        return self._handle(job_id, rec) if rec.get("state") == "running" else self._handles.get(job_id)

    def hold(self, job_id: str, held: bool) -> None:
        """Mark a job preempted by hand (``held``: placement leaves it until it is resumed by hand),
        in its record, so every gateway process sees it."""
        self._record(job_id)  # KeyError: no such job
        self._save(job_id, held=held)

    def held(self, job_id: str) -> bool:
        try:
            return bool(self._record(job_id).get("held"))
        except (KeyError, OSError, ValueError):
            return False

    def last_stop(self, job_id: str) -> str | None:
        """How the job's last preempt or cancel ended: ``checkpointed``, ``killed`` or None."""
        return self._record(job_id).get("last_stop")

    def list(self) -> list[JobInfo]:
        """Every job (ended ones past ``retain_ended_s`` are swept first, at most every ``SWEEP_EVERY_S``)."""
        if time.monotonic() - self._swept >= SWEEP_EVERY_S:
            self._swept = time.monotonic()
            self.sweep()
        out = []
        for p in sorted(self.dir.iterdir()):
            if (p / "job.json").exists() and JOB_ID_RE.match(p.name):
                try:
                    out.append(self.get(p.name))
                except (KeyError, OSError):  # removed meanwhile
                    pass
        return out

    def wait(self, job_id: str, timeout_s: float) -> JobInfo:
        """Block until the job is no longer running (or the timeout passes)."""
        deadline = time.monotonic() + timeout_s
        while (info := self.get(job_id)).state == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        return info
