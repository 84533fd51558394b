"""``sloserve loadtest``: a headless Locust run (``sloserve/loadtests/run.py``, beside the locustfiles)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from sloserve.loadtests import run

    run.register(sub)
