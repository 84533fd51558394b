"""Debian packages the tools need (Prometheus, perf_analyzer's libb64), installed with apt-get when
missing: as root, or through password-less sudo."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable


class PackageUnavailable(RuntimeError):
    """A Debian package is missing and cannot be installed here; the message says how to install it."""


def ensure_package(package: str, present: Callable[[], bool]) -> None:
    """Install Debian's ``package`` unless ``present()`` says it is there; raise
    :class:`PackageUnavailable` with the reason and the command to run by hand when that fails."""
    if present():
        return
    sudo: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise PackageUnavailable(
                f"{package} is not installed and cannot be installed: not root and no sudo. "
                f"Install it with `apt-get install --no-install-recommends {package}`."
            )
        sudo = ["sudo", "-n"]
    apt = shutil.which("apt-get")
    if apt is None:
        raise PackageUnavailable(f"{package} is not installed and cannot be installed: no apt-get on this machine.")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log = []
    for cmd in ([*sudo, apt, "update", "-q"], [*sudo, apt, "install", "-y", "-q", "--no-install-recommends", package]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        log.append(f"$ {' '.join(cmd)}\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
        if r.returncode != 0:
            raise PackageUnavailable(f"{package} is not installed and installing it failed:\n" + "\n".join(log))
    if not present():
        raise PackageUnavailable(f"apt-get installed {package} but it is still not usable:\n" + "\n".join(log))
