"""Screenshots of the main SLO queries in Prometheus' own web UI (graph view), with headless Chromium.

Run it while ``make dashboards`` runs (it prints the Prometheus URL), after a few minutes of load::

    python -m sloserve.loadtests.screenshots --prometheus http://127.0.0.1:PORT --out docs/img

One PNG per query of :data:`sloserve.loadtests.dashboards.QUERIES`, ``<out>/dashboards-<name>.png``, each kept
under ``--max-kib`` (a larger one is an error, so that docs/ stays small). Chromium is Debian's
``chromium`` package (``apt-get install -y --no-install-recommends chromium``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sloserve.loadtests.dashboards import QUERIES, graph_url, http_get

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium_command(
    chromium: str, out: Path, url: str, width: int, height: int, profile_dir: Path, as_root: bool
) -> list[str]:
    """Headless Chromium writing a ``width`` x ``height`` screenshot of ``url`` to ``out``. The virtual
    time budget lets the UI's JavaScript fetch the range query and draw the graph before the shot."""
    cmd = [
        chromium,
        "--headless",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile_dir}",
        f"--window-size={width},{height}",
        "--virtual-time-budget=15000",
        f"--screenshot={out}",
    ]
    if as_root:  # Chromium refuses to run as root with its sandbox on
        cmd.insert(1, "--no-sandbox")
    return [*cmd, url]


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit(
        "screenshots: no Chromium on PATH; install Debian's: apt-get install -y --no-install-recommends chromium"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sloserve.loadtests.screenshots", description=__doc__.split("\n\n")[0])
    p.add_argument("--prometheus", required=True, help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    p.add_argument("--out", default="docs/img", help="directory for the PNGs")
    p.add_argument("--range", default="5m", help="graph range (Prometheus' range_input)")
    p.add_argument("--width", type=int, default=1100)
    p.add_argument("--height", type=int, default=620)
    p.add_argument("--max-kib", type=int, default=200, help="fail on a PNG larger than this")
    p.add_argument("--only", default="", help="comma-separated query names (default: all)")
    a = p.parse_args(argv)
    base = a.prometheus.rstrip("/")
    if http_get(f"{base}/-/ready", 3.0)[0] != 200:
        print(f"screenshots: Prometheus is not ready at {base} (is `make dashboards` running?)", file=sys.stderr)
        return 2
    chromium = find_chromium()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = set(filter(None, a.only.split(",")))
    too_big = []
    with tempfile.TemporaryDirectory(prefix="sloserve-chromium-") as profile:
        for q in QUERIES:
            if wanted and q.name not in wanted:
                continue
            png = out_dir / f"dashboards-{q.name}.png"
            cmd = chromium_command(
                chromium,
                png.resolve(),
                graph_url(base, q.expr, a.range),
                a.width,
                a.height,
                Path(profile),
                os.geteuid() == 0,
            )
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if r.returncode != 0 or not png.is_file():
                print(f"screenshots: {q.name}: chromium failed ({r.returncode}):\n{r.stderr[-2000:]}", file=sys.stderr)
                return 1
            kib = png.stat().st_size / 1024
            print(f"{png} ({kib:.0f} KiB): {q.title}")
            if kib > a.max_kib:
                too_big.append(f"{png} is {kib:.0f} KiB (over {a.max_kib}): try a smaller --width/--height")
    if too_big:
        print("screenshots: " + "\n".join(too_big), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
