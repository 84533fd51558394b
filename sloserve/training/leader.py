"""One placement leader among the gateway processes that share a training jobs directory.

Every gateway worker (``sloserve serve --workers N``, or gateways on several hosts over one shared
``training.jobs_dir``) serves the training API over the same jobs on disk, but only one of them
places jobs (starts queued ones, preempts for inference): the holder of an exclusive ``flock`` on
``<jobs_dir>/.leader``. The others try to take it every placement round, so when the leader's process
dies the kernel frees its lock and another worker leads from its next round on. Across hosts the
directory must be shared storage whose locks every host sees (NFSv4 or a cluster file system).

The leader writes what only it knows (its placement report, and per job the attained GPU-seconds
and the queue place) to ``<jobs_dir>/.placement.json`` every round; the other workers answer from
that file, so every worker shows the same.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from sloserve.training.checkpoint import write_json_atomic

LEADER_FILE = ".leader"
SHARED_FILE = ".placement.json"


class LeaderLock:
    """An exclusive, non-blocking ``flock`` on a file: held by at most one open file at a time, in
    this process or any other; released by ``release`` or when the holding process dies."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if no one holds it; True while this object holds it."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        self._fd = fd
        with contextlib.suppress(OSError):  # who leads, for a person looking: the lock is what counts
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


@contextlib.contextmanager
def flocked(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created) while the block runs: a read-modify-write of a
    file that several processes update."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (frees the lock)


class Leadership:
    """The leader lock of a jobs directory and the view its holder shares with the other workers."""

    def __init__(self, jobs_dir: str | os.PathLike):
        d = Path(jobs_dir)
        self.lock = LeaderLock(d / LEADER_FILE)
        self.shared_path = d / SHARED_FILE
        self._cache: tuple[tuple[int, int], dict] | None = None

    @property
    def leads(self) -> bool:
        return self.lock.held

    def try_lead(self) -> bool:
        return self.lock.try_acquire()

    def resign(self) -> None:
        self.lock.release()

    def publish(self, report: dict, jobs: dict[str, dict]) -> None:
        """The leader's report and per-job annotations, for the other workers (atomically replaced)."""
        write_json_atomic(
            self.shared_path, {"leader_pid": os.getpid(), "written_at": time.time(), "report": report, "jobs": jobs}
        )

    def view(self) -> dict:
        """What the leader published last (``{}`` before its first round); read again when the file changed."""
        try:
            st = self.shared_path.stat()
            key = (st.st_mtime_ns, st.st_ino)
            if self._cache is not None and self._cache[0] == key:
                return self._cache[1]
            doc = json.loads(self.shared_path.read_text())
        except (OSError, ValueError):
            return {}
        self._cache = (key, doc)
        return doc
