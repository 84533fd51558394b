"""The container image installs sloserve from its GPU extra with every version pinned: the lock
(deploy/kuberay/requirements-gpu.txt) satisfies pyproject.toml, holds onnxruntime-gpu and not the CPU
wheel, and the Dockerfile installs nothing outside it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]
KUBERAY = ROOT / "deploy" / "kuberay"
IMAGE_ENV = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux"}
IMAGE_ENV |= {"platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "extra": ""}


def lock() -> dict[str, str]:
    out = {}
    for line in (KUBERAY / "requirements-gpu.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            out[canonicalize_name(name)] = version
    return out


def test_the_lock_satisfies_the_core_dependencies_and_the_gpu_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = lock()
    for spec in project["dependencies"] + project["optional-dependencies"]["gpu"]:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate(IMAGE_ENV):
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements-gpu.txt: run python deploy/kuberay/lock.py"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} is outside {spec}"
    assert "onnxruntime-gpu" in pins and "onnxruntime" not in pins


def test_the_dockerfile_installs_only_under_the_lock():
    text = (KUBERAY / "Dockerfile").read_text()
    installs = re.findall(r"pip install[^\n]*", text)
    assert installs, "the Dockerfile installs sloserve"
    for line in installs:
        assert "-c /home/ray/sloserve/deploy/kuberay/requirements-gpu.txt" in line and "[gpu]" in line, line
    assert "pip uninstall" not in text
