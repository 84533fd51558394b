"""Sub-commands beyond serve/models: bench, profile, sim, loadtest (registered as they land)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from gateway import bench_cli

    bench_cli.register(sub)
    __import__("sim.cli", fromlist=["register"]).register(sub)
    _register_loadtest(sub)
    _register_train(sub)


def _register_train(sub: argparse._SubParsersAction) -> None:
    """``sloserve train submit|list|preempt|resume|cancel``: autoscaler/training_cli.py."""
    from autoscaler import training_cli

    training_cli.register(sub)


def _register_loadtest(sub: argparse._SubParsersAction) -> None:
    """``sloserve loadtest``: lives in loadtests/run.py (beside the locustfiles), loaded by path."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "loadtests" / "run.py"
    if not path.is_file():  # an installed wheel without the source tree
        return
    spec = importlib.util.spec_from_file_location("sloserve_loadtest_run", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.register(sub)
