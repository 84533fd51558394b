"""Atomic, verified checkpoints for training jobs.

Protocol (docs/placement.md): a checkpoint is written to a temporary file in the checkpoint
directory (``.ckpt-<iteration>.<pid>.tmp``), flushed and fsync'ed, renamed over its final name
``ckpt-<iteration>.ckpt`` (atomic on POSIX), and the directory is fsync'ed so the rename itself
survives a crash. A reader only looks at final names, newest first, and accepts a file only when
its magic, length and SHA-256 match; temporary files are torn writes of a crashed writer and are
removed by ``clean_temp``. Older checkpoints are pruned only after a newer one is durable, so at
every instant at least one complete checkpoint exists once the first is written.

File layout: ``MAGIC`` (8 bytes) | header length (8 bytes, big-endian) | header JSON
(``iteration``, ``sha256``, ``payload_bytes``, ``meta``) | payload (``numpy.savez`` bytes).

>>> import tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> _ = write_checkpoint(d, 10, {"w": np.ones(3)}, {"loss": 0.5})
>>> c = load_latest(d)
>>> c.iteration, c.arrays["w"].tolist(), c.meta["loss"]
(10, [1.0, 1.0, 1.0], 0.5)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"SLOCKPT1"
FINAL_RE = re.compile(r"^ckpt-(\d{10})\.ckpt$")
TEMP_RE = re.compile(r"^\.ckpt-\d+\.\d+\.tmp$")

# called with the temp path after part of the payload is written (tests make a crash land there)
MidWriteHook = Callable[[Path], None]


class CorruptCheckpoint(ValueError):
    pass


@dataclass(frozen=True)
class Checkpoint:
    iteration: int
    arrays: Mapping[str, np.ndarray]
    meta: Mapping[str, object]
    path: Path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode(iteration: int, arrays: Mapping[str, np.ndarray], meta: Mapping[str, object]) -> tuple[bytes, bytes]:
    """(prefix: magic + length + header, payload)."""
    buf = io.BytesIO()
    # Any: numpy's stubs (>= 2.1) would match a name against savez's own ``allow_pickle`` keyword,
    # which numpy 1.26 (supported) does not have; every key here names an array.
    named: dict[str, Any] = {k: np.asarray(v) for k, v in arrays.items()}
    np.savez(buf, **named)
    payload = buf.getvalue()
    header = json.dumps(
        {
            "iteration": int(iteration),
            "sha256": hashlib.sha256(payload).hexdigest(),
            "payload_bytes": len(payload),
            "meta": dict(meta),
        },
        sort_keys=True,
    ).encode()
    return MAGIC + len(header).to_bytes(8, "big") + header, payload


def decode(data: bytes, path: Path) -> Checkpoint:
    if len(data) < 16 or data[:8] != MAGIC:
        raise CorruptCheckpoint(f"{path}: bad magic or too short")
    n = int.from_bytes(data[8:16], "big")
    try:
        header = json.loads(data[16 : 16 + n])
    except ValueError as e:
        raise CorruptCheckpoint(f"{path}: unreadable header") from e
    payload = data[16 + n :]
    if len(payload) != header.get("payload_bytes") or hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise CorruptCheckpoint(f"{path}: length or checksum mismatch")
    with np.load(io.BytesIO(payload), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return Checkpoint(int(header["iteration"]), arrays, header.get("meta", {}), path)


def write_checkpoint(
    directory: str | os.PathLike,
    iteration: int,
    arrays: Mapping[str, np.ndarray],
    meta: Mapping[str, object] | None = None,
    keep: int = 2,
    mid_write_hook: MidWriteHook | None = None,
) -> Path:
    """Write one checkpoint atomically and durably; keep the newest ``keep`` ones. Returns its path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    prefix, payload = encode(iteration, arrays, meta or {})
    tmp = d / f".ckpt-{iteration}.{os.getpid()}.tmp"
    final = d / f"ckpt-{iteration:010d}.ckpt"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(prefix)
            half = len(payload) // 2
            f.write(payload[:half])
            if mid_write_hook is not None:
                f.flush()
                mid_write_hook(tmp)
            f.write(payload[half:])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(d)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    for old in list_checkpoints(d)[keep:]:
        old.unlink(missing_ok=True)
    return final


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Final checkpoint files, newest (highest iteration) first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if FINAL_RE.match(p.name)), key=lambda p: p.name, reverse=True)


def clean_temp(directory: str | os.PathLike) -> list[Path]:
    """Remove torn temporary files left by a crashed writer; returns what was removed."""
    d = Path(directory)
    if not d.is_dir():
        return []
    gone = [p for p in d.iterdir() if TEMP_RE.match(p.name)]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


def load_latest(
    directory: str | os.PathLike, on_corrupt: Callable[[Path, Exception], None] | None = None
) -> Checkpoint | None:
    """The newest checkpoint whose checksum verifies, or None. Corrupt files are skipped (reported
    through ``on_corrupt``), never deleted: a person may want to look at them."""
    for path in list_checkpoints(directory):
        try:
            return decode(path.read_bytes(), path)
        except (CorruptCheckpoint, OSError, ValueError, KeyError) as e:
            if on_corrupt is not None:
                on_corrupt(path, e)
    return None


def write_json_atomic(path: str | os.PathLike, doc: Mapping[str, object]) -> None:
    """Small status files (job state, progress) with the same temp-fsync-rename protocol."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(dict(doc), f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    _fsync_dir(p.parent)
