"""Sub-commands beyond serve/models: bench, profile, sim, loadtest (registered as they land)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from gateway import bench_cli

    bench_cli.register(sub)
