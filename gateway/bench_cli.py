"""``sloserve bench``: registered here; the implementations live in loadtests/bench/.

``bench`` has sub-commands; each adds itself in :func:`register` below with its own arguments and
handler (``closed`` now; the open-loop ``slo`` benchmark is added the same way).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _import_closed():
    try:
        from loadtests.bench import closed
    except ModuleNotFoundError:  # an editable install made before loadtests/ was packaged
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from loadtests.bench import closed
    return closed


def _closed(args: argparse.Namespace) -> int:
    return _import_closed().main_args(args)


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmarks against Triton, MLServer and Ray Serve (closed loop, SLO)")
    bsub = b.add_subparsers(dest="bench_cmd", required=True, metavar="{closed,...}")

    closed = _import_closed()
    c = bsub.add_parser("closed", help="closed loop with wrk: N requests in flight, systems interleaved",
                        description=closed.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    closed.add_arguments(c)
    c.set_defaults(func=_closed)
