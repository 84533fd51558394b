"""``sloserve bench``: registered here; the implementations live in loadtests/bench/.

``bench`` has sub-commands; each adds itself in :func:`register` below with its own arguments and
handler (``closed``: wrk closed loop; ``slo``: open loop under an SLO).
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


def _import_slo():
    _import_closed()  # makes loadtests importable
    from loadtests.bench import slo
    return slo


def _closed(args: argparse.Namespace) -> int:
    return _import_closed().main_args(args)


def _slo(args: argparse.Namespace) -> int:
    return _import_slo().main_args(args)


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmarks against Triton, MLServer and Ray Serve (closed loop, SLO)")
    bsub = b.add_subparsers(dest="bench_cmd", required=True, metavar="{closed,slo}")

    closed = _import_closed()
    c = bsub.add_parser("closed", help="closed loop with wrk: N requests in flight, systems interleaved",
                        description=closed.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    closed.add_arguments(c)
    c.set_defaults(func=_closed)

    slo = _import_slo()
    o = bsub.add_parser("slo", help="open loop under a latency SLO: attainment, goodput, max rate at 99%%",
                        description=slo.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    slo.add_arguments(o)
    o.set_defaults(func=_slo)
