"""What the live fuzzers sent and what came back: calls per REST operation and per gRPC method,
with the answers counted by HTTP status or gRPC code, and the server errors (5xx; gRPC INTERNAL,
UNKNOWN, DATA_LOSS, or UNIMPLEMENTED from a method the server implements).

tests/integration/conftest.py prints the table at the end of the run and writes it as JSON to
``SLOSERVE_FUZZ_OUT`` when that is set (the figures docs/reliability.md quotes).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import grpc

_REST: defaultdict[str, Counter] = defaultdict(Counter)
_GRPC: defaultdict[str, Counter] = defaultdict(Counter)
_GRPC_BAD: Counter = Counter()
_SERVER_ERRORS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}


def rest(label: str, status: int) -> None:
    """One REST call of operation ``label`` (``POST /v2/...``) answered with ``status``."""
    _REST[label][str(status)] += 1


def grpc_call(method: str, code: grpc.StatusCode, implemented: bool = True) -> bool:
    """One gRPC call of ``method`` answered with ``code`` (a hang is DEADLINE_EXCEEDED; ``implemented``:
    whether the server implements the method). Returns whether that answer is a server error."""
    bad = is_server_error(code, implemented)
    _GRPC[method][code.name] += 1
    _GRPC_BAD[method] += bad
    return bad


def is_server_error(code: grpc.StatusCode, implemented: bool = True) -> bool:
    """INTERNAL, UNKNOWN, DATA_LOSS, a hang (DEADLINE_EXCEEDED: every call has a timeout), or
    UNIMPLEMENTED from a method the server implements."""
    if code in _SERVER_ERRORS or code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    return implemented and code is grpc.StatusCode.UNIMPLEMENTED


def summary() -> dict:
    """``{"rest": {op: {"calls", "5xx", "status": {...}}}, "grpc": {method: {"calls", "server_errors",
    "codes": {...}}}, "total": {...}}``."""
    rest_ops = {
        op: {"calls": sum(c.values()), "5xx": sum(n for s, n in c.items() if s.startswith("5")), "status": dict(c)}
        for op, c in sorted(_REST.items())
    }
    grpc_methods = {
        m: {
            "calls": sum(c.values()),
            "server_errors": _GRPC_BAD[m],
            "codes": dict(c),
        }
        for m, c in sorted(_GRPC.items())
    }
    return {
        "rest": rest_ops,
        "grpc": grpc_methods,
        "total": {
            "rest_operations": len(rest_ops),
            "rest_calls": sum(o["calls"] for o in rest_ops.values()),
            "rest_5xx": sum(o["5xx"] for o in rest_ops.values()),
            "grpc_methods": len(grpc_methods),
            "grpc_calls": sum(m["calls"] for m in grpc_methods.values()),
            "grpc_server_errors": sum(m["server_errors"] for m in grpc_methods.values()),
        },
    }


def lines() -> list[str]:
    """The summary as a table, one line per operation, then the totals."""
    s = summary()
    out = [f"{'calls':>6} {'5xx':>4}  REST operation"]
    out += [f"{o['calls']:>6} {o['5xx']:>4}  {op}" for op, o in s["rest"].items()]
    out.append(f"{'calls':>6} {'err':>4}  gRPC method (codes)")
    out += [
        f"{m['calls']:>6} {m['server_errors']:>4}  {name} {dict(sorted(m['codes'].items()))}"
        for name, m in s["grpc"].items()
    ]
    t = s["total"]
    out.append(
        f"total: {t['rest_calls']} REST calls over {t['rest_operations']} operations, {t['rest_5xx']} 5xx; "
        f"{t['grpc_calls']} gRPC calls over {t['grpc_methods']} methods, {t['grpc_server_errors']} server errors"
    )
    return out


def write(path: str | os.PathLike) -> None:
    Path(path).write_text(json.dumps(summary(), indent=2) + "\n")


def empty() -> bool:
    return not _REST and not _GRPC
