"""The pure side of ``sloserve bench perf``: the two temporary repositories' configs, perf_analyzer's CSV
report read into numbers, medians over rounds, the ratios between systems, and the markdown tables.

Nothing here starts a process or opens a socket (tests/unit/loadtests/test_bench_perf.py)."""

from __future__ import annotations

import csv
import io
import json
import statistics
from typing import Any

# ---- the two repositories ---------------------------------------------------------------------------


def triton_config(model: str, max_batch_size: int, slo_ms: float | None = None) -> str:
    """A Triton ``config.pbtxt`` for one ONNX file: ONNX Runtime, the batch dimension first, Triton's
    dynamic batcher with its defaults. Inputs and outputs are left out: sloserve completes them from
    the graph, as Triton's auto-complete does. ``slo_ms`` (a parameter of sloserve's own) keeps the
    latency objective of the native layout's ``config.json``, so that the two sloserve systems differ
    by their layout only."""
    lines = [
        f'name: "{model}"',
        'platform: "onnxruntime_onnx"',
        f"max_batch_size: {int(max_batch_size)}",
        "dynamic_batching { }",
    ]
    if slo_ms is not None:
        lines.append(f'parameters {{ key: "slo_ms" value {{ string_value: "{slo_ms:g}" }} }}')
    return "\n".join(lines) + "\n"


def native_config(source: dict[str, Any], model: str, variant: str) -> dict[str, Any]:
    """sloserve's ``config.json`` serving one variant: ``source``'s tensors, batch limit, SLO and
    description, its entry for ``variant`` (or a bare one) as the only variant and the default."""
    cfg = {k: v for k, v in source.items() if k not in ("dynamic_batching",)}
    entries = [v for v in source.get("variants", []) if v.get("name") == variant]
    cfg.update(name=model, variants=entries[:1] or [{"name": variant}], default_variant=variant)
    return cfg


def relabel_profile(doc: dict[str, Any], model: str, variant: str) -> dict[str, Any]:
    """A latency profile (``<variant>/profiles/<device>.json``) for another (model, variant) key: the same
    curve, so that both layouts start the ``slo`` policy from the same measurements."""
    return {**doc, "model": model, "variant": variant}


def readiness_body(inputs: list[dict[str, Any]]) -> bytes:
    """A V2 JSON request of one row of zeros for ``inputs`` (config.json's tensor specs); a variable
    dimension gets size 1. Only to see a system answer: perf_analyzer sends its own random data."""
    tensors = []
    for t in inputs:
        shape = [1, *(d if d > 0 else 1 for d in t["shape"])]
        n = 1
        for d in shape:
            n *= d
        zero: Any = "" if t["datatype"] == "BYTES" else (False if t["datatype"] == "BOOL" else 0)
        tensors.append({"name": t["name"], "shape": shape, "datatype": t["datatype"], "data": [zero] * n})
    return json.dumps({"inputs": tensors}, separators=(",", ":")).encode()


# ---- perf_analyzer's CSV ----------------------------------------------------------------------------

# perf_analyzer's column -> our key (times in microseconds, as perf_analyzer writes them)
CSV_COLUMNS = {
    "Concurrency": "concurrency",
    "Inferences/Second": "infer_per_s",
    "Client Send": "client_send_us",
    "Network+Server Send/Recv": "network_server_us",
    "Server Queue": "server_queue_us",
    "Server Compute Input": "server_compute_input_us",
    "Server Compute Infer": "server_compute_infer_us",
    "Server Compute Output": "server_compute_output_us",
    "Client Recv": "client_recv_us",
    "p50 latency": "p50_us",
    "p90 latency": "p90_us",
    "p95 latency": "p95_us",
    "p99 latency": "p99_us",
    "Avg latency": "avg_us",
    "request/response": "request_response_us",
    "response wait": "response_wait_us",
}


def parse_csv(text: str) -> list[dict[str, float]]:
    """The rows of perf_analyzer's ``-f`` report (its first block, up to a blank line), one per measured
    concurrency, keyed as :data:`CSV_COLUMNS` says, with derived figures: latencies in ms
    (``p50_ms`` ... ``p99_ms``, ``avg_ms``) and, when the server reports statistics,
    ``server_compute_us`` (input + infer + output). Unknown columns are kept under their own name;
    cells that are not numbers are left out."""
    block: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            if block:
                break
            continue
        block.append(line)
    rows = []
    for raw in csv.DictReader(io.StringIO("\n".join(block))):
        row: dict[str, float] = {}
        for col, cell in raw.items():
            if col is None or cell is None:
                continue
            try:
                row[CSV_COLUMNS.get(col.strip(), col.strip())] = float(cell)
            except ValueError:
                continue
        for q in ("p50", "p90", "p95", "p99", "avg"):
            if f"{q}_us" in row:
                row[f"{q}_ms"] = row[f"{q}_us"] / 1e3
        parts = ("server_compute_input_us", "server_compute_infer_us", "server_compute_output_us")
        if all(p in row for p in parts):
            row["server_compute_us"] = sum(row[p] for p in parts)
        rows.append(row)
    return rows


# ---- medians, ratios, tables ------------------------------------------------------------------------

SUMMARY_KEYS = (
    "infer_per_s",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "avg_ms",
    "server_queue_us",
    "server_compute_us",
    "gen_cores",
    "gen_cpu_us_per_infer",
    "server_cores",
    "server_cpu_us_per_infer",
    "other_cores",
)
RATIO_KEYS = ("infer_per_s", "p50_ms", "p99_ms")


def summarise(records: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """protocol -> concurrency (a string: JSON keys) -> system -> the median over rounds of each of
    :data:`SUMMARY_KEYS` it has, with ``rounds_ok`` and ``rounds_failed``. ``records`` are the
    measurements, each naming its ``system``, ``protocol`` and ``concurrency`` (an ``error`` when it failed)."""
    cells: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    for r in records:
        cells.setdefault(r["protocol"], {}).setdefault(str(r["concurrency"]), {}).setdefault(r["system"], []).append(r)
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for proto, by_c in cells.items():
        for c, by_s in sorted(by_c.items(), key=lambda kv: int(kv[0])):
            for system, recs in by_s.items():
                good = [r for r in recs if "error" not in r]
                med: dict[str, Any] = {}
                for k in SUMMARY_KEYS:
                    vals = [r[k] for r in good if r.get(k) is not None]
                    if vals:
                        med[k] = round(statistics.median(vals), 4)
                med["rounds_ok"], med["rounds_failed"] = len(good), len(recs) - len(good)
                out.setdefault(proto, {}).setdefault(c, {})[system] = med
    return out


def is_triton(system: str) -> bool:
    return system == "triton" or system.startswith("triton-")


def ratio_pairs(systems: list[str]) -> list[tuple[str, str]]:
    """(numerator, denominator) pairs: every sloserve system against Triton (its best configuration in
    the cell when several ran), and the Triton layout against the native one."""
    pairs = [(s, "triton") for s in systems if s.startswith("sloserve")]
    if "sloserve-triton" in systems and "sloserve-native" in systems:
        pairs.append(("sloserve-triton", "sloserve-native"))
    return pairs if any(is_triton(s) for s in systems) else [p for p in pairs if p[1] != "triton"]


def ratios(summary: dict[str, dict[str, dict[str, dict[str, Any]]]], systems: list[str]) -> dict[str, Any]:
    """protocol -> concurrency -> ``"A/B"`` -> {key: median(A) / median(B)} for :data:`RATIO_KEYS`;
    ``triton`` in a pair is the Triton configuration with the highest median throughput in that
    cell (``triton_best`` names it). Ratios of medians; a cell where either side has no figure is left out."""
    out: dict[str, Any] = {}
    for proto, by_c in summary.items():
        for c, by_s in by_c.items():
            tritons = {s: m for s, m in by_s.items() if is_triton(s) and m.get("infer_per_s")}
            best = max(tritons, key=lambda s: tritons[s]["infer_per_s"]) if tritons else None
            cell: dict[str, Any] = {"triton_best": best} if best else {}
            for a, b in ratio_pairs(systems):
                den = by_s.get(best) if b == "triton" and best else by_s.get(b)
                num = by_s.get(a)
                if not num or not den:
                    continue
                r = {k: round(num[k] / den[k], 3) for k in RATIO_KEYS if num.get(k) and den.get(k)}
                if r:
                    cell[f"{a}/{b}"] = r
            out.setdefault(proto, {})[c] = cell
    return out


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def markdown(summary: dict[str, Any], ratio: dict[str, Any], systems: list[str]) -> str:
    """Two markdown tables: each system's medians per protocol and concurrency, then the ratios of medians."""
    lines = [
        "| protocol | concurrency | system | infer/s | p50 / p90 / p95 / p99 (ms) | server queue / compute (us) "
        "| server cores | perf_analyzer cores | other cores | rounds ok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for proto, by_c in summary.items():
        for c, by_s in by_c.items():
            for s in systems:
                m = by_s.get(s)
                if m is None:
                    continue
                lat = " / ".join(_f(m.get(f"p{q}_ms"), ".2f") for q in (50, 90, 95, 99))
                srv = f"{_f(m.get('server_queue_us'), '.0f')} / {_f(m.get('server_compute_us'), '.0f')}"
                lines.append(
                    f"| {proto} | {c} | {s} | {_f(m.get('infer_per_s'), ',.0f')} | {lat} | {srv} "
                    f"| {_f(m.get('server_cores'), '.2f')} | {_f(m.get('gen_cores'), '.2f')} "
                    f"| {_f(m.get('other_cores'), '.2f')} | {m['rounds_ok']}/{m['rounds_ok'] + m['rounds_failed']} |"
                )
    pairs = [f"{a}/{b}" for a, b in ratio_pairs(systems)]
    if pairs:
        lines += [
            "",
            "| protocol | concurrency | triton's best | " + " | ".join(f"{p}: infer/s, p50, p99" for p in pairs) + " |",
            "|---|---|---|" + "---|" * len(pairs),
        ]
        for proto, by_c in ratio.items():
            for c, cell in by_c.items():
                cols = []
                for p in pairs:
                    r = cell.get(p, {})
                    cols.append(", ".join(_f(r.get(k), ".3f") for k in RATIO_KEYS))
                lines.append(f"| {proto} | {c} | {cell.get('triton_best') or '-'} | " + " | ".join(cols) + " |")
    return "\n".join(lines)
