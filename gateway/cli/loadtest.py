"""``sloserve loadtest``: a headless Locust run (``loadtests/run.py``, beside the locustfiles)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from loadtests import run

    run.register(sub)
