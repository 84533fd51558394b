"""Verified checkpoint directories for Ray Train jobs, and small atomic status files.

A checkpoint is a directory that Ray Train persists (``ray.train.report(checkpoint=...)``) under
the job's storage path as ``<storage>/<run>/checkpoint_<iteration>``. ``session.save`` writes the
job's files into it plus a manifest, ``sloserve.json``: the iteration, the metrics and the SHA-256 of
every file. A reader accepts a directory only when the manifest parses and every checksum matches;
``latest_good`` walks the checkpoints newest first and names the corrupt ones it skips, so a job
resumes from the previous good one. Ray Train writes a checkpoint directory before it registers it,
so a crash in the middle of an upload leaves a directory that fails verification, never a half-read.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> d = root / "run-1" / checkpoint_dir_name(10); d.mkdir(parents=True)
>>> _ = (d / "state.pt").write_bytes(b"weights")
>>> write_manifest(d, 10, {"loss": 0.5})["iteration"]
10
>>> (d / "state.pt").write_bytes(b"torn") and None
>>> bad = []
>>> latest_good(root, lambda p, e: bad.append(p.name)) is None, bad
(True, ['checkpoint_0000000010'])
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "sloserve.json"
DIR_RE = re.compile(r"^checkpoint_(\d{10})$")
RUN_RE = re.compile(r"^run-(\d+)$")


class CorruptCheckpoint(ValueError):
    pass


@dataclass(frozen=True)
class GoodCheckpoint:
    iteration: int
    path: Path
    metrics: Mapping[str, object]


def checkpoint_dir_name(iteration: int) -> str:
    return f"checkpoint_{iteration:010d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: str | os.PathLike, iteration: int, metrics: Mapping[str, object]) -> dict:
    """Checksum every file in ``directory`` (written by the job) into its ``sloserve.json``."""
    d = Path(directory)
    files = {
        p.relative_to(d).as_posix(): _sha256(p) for p in sorted(d.rglob("*")) if p.is_file() and p.name != MANIFEST
    }
    doc = {"iteration": int(iteration), "metrics": dict(metrics), "files": files}
    (d / MANIFEST).write_text(json.dumps(doc, sort_keys=True))
    return doc


def verify(directory: str | os.PathLike) -> GoodCheckpoint:
    """The checkpoint in ``directory`` if its manifest and every checksum match, else ``CorruptCheckpoint``."""
    d = Path(directory)
    try:
        doc = json.loads((d / MANIFEST).read_text())
        files = doc["files"]
        iteration = int(doc["iteration"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptCheckpoint(f"unreadable manifest {MANIFEST} ({e.__class__.__name__})") from None
    if not files:
        raise CorruptCheckpoint("the manifest lists no files")
    for name, digest in files.items():
        p = d / name
        if not p.is_file():
            raise CorruptCheckpoint(f"{name} is missing")
        if _sha256(p) != digest:
            raise CorruptCheckpoint(f"{name} fails its checksum")
    return GoodCheckpoint(iteration, d, doc.get("metrics", {}))


def list_checkpoints(storage: str | os.PathLike) -> list[Path]:
    """Checkpoint directories of every run of a job, newest first (iteration, then run)."""
    root = Path(storage)
    found = []
    if root.is_dir():
        for run in root.iterdir():
            m = RUN_RE.match(run.name)
            if m and run.is_dir():
                for c in run.iterdir():
                    k = DIR_RE.match(c.name)
                    if k and c.is_dir():
                        found.append(((int(k.group(1)), int(m.group(1))), c))
    return [c for _, c in sorted(found, key=lambda t: t[0], reverse=True)]


def latest_good(
    storage: str | os.PathLike, on_corrupt: Callable[[Path, Exception], None] | None = None
) -> GoodCheckpoint | None:
    """The newest checkpoint that verifies. Corrupt ones are reported and left for a person to look at."""
    for path in list_checkpoints(storage):
        try:
            return verify(path)
        except CorruptCheckpoint as e:
            if on_corrupt is not None:
                on_corrupt(path, e)
    return None


def prune(storage: str | os.PathLike, keep: int) -> list[Path]:
    """Remove every checkpoint older than the newest ``keep`` that verify, across runs, and the run
    directories of earlier runs left without a checkpoint; returns the checkpoints removed. Corrupt
    checkpoints newer than those kept stay, for a person to look at (the job's status names them).
    The newest run directory always stays, so run numbers (``next_run``) keep counting up."""
    import shutil

    good, removed = 0, []
    for path in list_checkpoints(storage):
        if good >= keep:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            continue
        try:
            verify(path)
            good += 1
        except CorruptCheckpoint:
            pass
    root = Path(storage)
    runs = (
        sorted(
            ((int(m.group(1)), p) for p in root.iterdir() if (m := RUN_RE.match(p.name)) and p.is_dir()),
            reverse=True,
        )
        if root.is_dir()
        else []
    )
    for _, run in runs[1:]:
        if not any(DIR_RE.match(c.name) for c in run.iterdir()):
            shutil.rmtree(run, ignore_errors=True)
    return removed


def next_run(storage: str | os.PathLike) -> int:
    """The number of the next Ray Train run of a job (``run-<n>``: one per start or resume)."""
    root = Path(storage)
    runs = [int(m.group(1)) for p in root.iterdir() if (m := RUN_RE.match(p.name))] if root.is_dir() else []
    return max(runs, default=0) + 1


def write_json_atomic(path: str | os.PathLike, doc: Mapping[str, object]) -> None:
    """Small status files (job state, progress): temp file, fsync, rename."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(doc), f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
