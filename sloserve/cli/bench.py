"""``sloserve bench``: registered here; the implementations live in sloserve/loadtests/bench/.

``bench`` has sub-commands; each adds itself in :func:`register` below with its own arguments and
handler (``closed``: wrk closed loop; ``slo``: open loop under an SLO; ``perf``: Triton's perf_analyzer,
closed loop, against sloserve on a Triton and on its own repository layout and Triton itself).
"""

from __future__ import annotations

import argparse


def _closed(args: argparse.Namespace) -> int:
    from sloserve.loadtests.bench import closed

    return closed.main_args(args)


def _slo(args: argparse.Namespace) -> int:
    from sloserve.loadtests.bench import slo

    return slo.main_args(args)


def _perf(args: argparse.Namespace) -> int:
    from sloserve.loadtests.bench import perf

    return perf.main_args(args)


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench", help="benchmarks against Triton, MLServer and Ray Serve (closed loop, SLO, perf_analyzer)"
    )
    bsub = b.add_subparsers(dest="bench_cmd", required=True, metavar="{closed,slo,perf}")

    from sloserve.loadtests.bench import closed, perf, slo

    c = bsub.add_parser(
        "closed",
        help="closed loop with wrk: N requests in flight, systems interleaved",
        description=closed.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    closed.add_arguments(c)
    c.set_defaults(func=_closed)

    o = bsub.add_parser(
        "slo",
        help="open loop under a latency SLO: attainment, goodput, max rate at 99%%",
        description=slo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    slo.add_arguments(o)
    o.set_defaults(func=_slo)

    f = bsub.add_parser(
        "perf",
        help="closed loop with Triton's perf_analyzer: sloserve (Triton and native layouts) against Triton",
        description=perf.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    perf.add_arguments(f)
    f.set_defaults(func=_perf)
