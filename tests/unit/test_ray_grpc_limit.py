"""The gateway's default Ray transport sends a whole batch in one gRPC message: importing the replica
module lifts Ray Serve's 4 MiB cap before Ray Serve reads it (unless the operator set it)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = "import sloserve.replica.ray_replica, ray.serve._private.constants as c; print(c.RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH)"


def _probe(env):
    env = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def test_the_grpc_message_cap_is_lifted_unless_set():
    env = dict(os.environ)
    env.pop("RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH", None)
    assert _probe({**env, "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": None}) == 2**31 - 1
    assert _probe({"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": "8388608"}) == 8388608
