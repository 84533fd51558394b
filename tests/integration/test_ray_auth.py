"""The embedded Ray takes only clients holding its token (sloserve/gateway/backends/ray_local.py,
``owner_only_token``): a local process with a wrong token, or with authentication off, cannot join the
cluster (and so cannot run code in it), and the token file is readable by its owner only."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
JOIN = "import ray, sys; ray.init(address=sys.argv[1]); print('JOINED', flush=True)"


def join(address: str, wait_s: float = 20.0, **env: str) -> tuple[str, str]:
    """A Ray driver that tries to join ``address``: (stdout, stderr) once it ends, or after ``wait_s``
    (a refused client keeps retrying: it is stopped then)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    base["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # the embedded Ray is on 127.0.0.1 (as its log says)
    p = subprocess.Popen(
        [sys.executable, "-c", JOIN, address], env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = p.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    return out.decode(errors="replace"), err.decode(errors="replace")


def test_a_client_without_the_token_cannot_join_the_embedded_ray(ray_server):
    m = re.search(r"started a local Ray at (\S+)", ray_server.output(None))
    assert m, ray_server.output()
    address = m.group(1)
    for env in ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, {"RAY_AUTH_MODE": "disabled"}):
        out, err = join(address, **env)
        assert "JOINED" not in out, (env, out)
        assert "InvalidAuthToken" in err or "Authentication token" in err, (env, err[-1500:])
    token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    out, err = join(address, 120.0, RAY_AUTH_MODE="token")  # the owner's own processes, as the gateway's workers
    assert "JOINED" in out, err[-1500:]
