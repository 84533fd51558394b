"""A stop asked for before the server can take it: SIGTERM/SIGINT from the first line of `sloserve serve`.

Python's default SIGTERM action ends the process at once (exit -15, nothing cleaned up, nothing said),
and the server's own handlers are installed only once its settings are read, its modules imported and
its repository loaded, which takes seconds on a slow host. `hold()` is called first thing: a signal
before the server takes over is only noted, and the server (or the workers' supervisor) reads
`requested()` when it does and stops before starting Ray or any worker.
"""

from __future__ import annotations

import signal

_requested = False


def _note(signum: int, frame: object) -> None:
    global _requested
    _requested = True


def hold() -> None:
    """Note SIGTERM and SIGINT instead of acting on them, until the server installs its own handlers."""
    signal.signal(signal.SIGTERM, _note)
    signal.signal(signal.SIGINT, _note)


def requested() -> bool:
    """Whether a SIGTERM or SIGINT came while held."""
    return _requested
