"""Write requirements-gpu.txt: every version the sloserve image installs (``sloserve[gpu]`` and all it
pulls in), resolved by pip for the image's Python 3.11 on Linux x86_64. Run from the repository root on
such a host after changing pyproject.toml's dependencies:

    python deploy/kuberay/lock.py            # rewrites deploy/kuberay/requirements-gpu.txt
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
HEADER = """\
# Every version the sloserve image installs: 'sloserve[gpu]' and everything it pulls in, for Python 3.11
# on Linux x86_64 (rayproject/ray:2.60.0-py311-gpu). The Dockerfile installs with `pip install -c` this
# file. Written by `python deploy/kuberay/lock.py`; tests/unit/deploy/test_image_lock.py checks that it
# satisfies pyproject.toml.
"""


def main() -> None:
    if sys.version_info[:2] != (3, 11) or sys.platform != "linux":
        raise SystemExit("resolve on Linux with Python 3.11, the image's")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
            + ["--report", str(report), ".[gpu]"],
            check=True,
        )
        items = json.loads(report.read_text())["install"]
    pins = sorted(
        (i["metadata"]["name"], i["metadata"]["version"]) for i in items if i["metadata"]["name"] != "sloserve"
    )
    lines = [f"{name}=={version}" for name, version in sorted(pins, key=lambda p: p[0].lower())]
    (HERE / "requirements-gpu.txt").write_text(HEADER + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
