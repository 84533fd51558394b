"""``sloserve bench``: registered here; implementations live in gateway/bench/."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    return None
