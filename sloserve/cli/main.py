"""``sloserve``: serve | models build | profile | bench | sim | loadtest | train."""

from __future__ import annotations

import argparse
import sys

from sloserve.cli import bench, loadtest, models, serve, sim, train


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sloserve", description="SLO-aware inference serving gateway (KServe V2)")
    sub = p.add_subparsers(dest="cmd", required=True)
    for command in (serve, models, bench, sim, loadtest, train):
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
