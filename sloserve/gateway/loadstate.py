"""A model's state in the repository API (sloserve/gateway/repository.py), and what a reload compares.

``READY``: serving; ``LOADING``: being loaded or reloaded; ``UNLOADING``: taking no new request, the
admitted ones answered; ``UNAVAILABLE``: not loaded (its reason says why). Shared by this gateway's
repository API and the model set several gateways share (sloserve/gateway/modelsync.py).
"""

from __future__ import annotations

import json

from sloserve.models.repository import LoadedModel

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


def fingerprint(model: LoadedModel) -> tuple:
    """What a reload compares: every file of the model folder (path, size, modification time; its
    latency profiles aside) and the config override."""
    files = []
    for p in sorted(model.root.rglob("*")):
        if p.is_file() and "profiles" not in p.relative_to(model.root).parts:
            st = p.stat()
            files.append((str(p.relative_to(model.root)), st.st_size, st.st_mtime_ns))
    return tuple(files), json.dumps(model.override, sort_keys=True)
