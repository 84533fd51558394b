"""What a sloserve server says about a step, read from its Prometheus text before and after: sheds by reason, shed-answer times, batch sizes per variant, its own on-time count."""

from __future__ import annotations

from typing import Any

from sloserve.loadtests.promtext import label_values, prom_sum, samples


def shed_by_reason(before: str | None, after: str | None) -> dict[str, int]:
    r"""Requests the server shed over one step, by ``reason`` (``sloserve_shed_total``: ``admission``,
    ``deadline``, ``overload`` for the lagging loop's door, ...), summed over models.

    >>> shed_by_reason('sloserve_shed_total{model="m",reason="deadline"} 2.0',
    ...                'sloserve_shed_total{model="m",reason="deadline"} 5.0\nsloserve_shed_total{model="m",reason="overload"} 4.0')
    {'deadline': 3, 'overload': 4}
    """
    before, after = before or "", after or ""
    out = {}
    for r in sorted(label_values(after, "sloserve_shed_total", "reason")):
        n = int(prom_sum(after, "sloserve_shed_total", reason=r) - prom_sum(before, "sloserve_shed_total", reason=r))
        if n > 0:
            out[r] = n
    return out


def shed_histogram(text: str | None) -> dict[float, float]:
    """Cumulative bucket counts of ``sloserve_shed_answer_seconds`` (all models and reasons) in a
    scrape: the server's own time from a shed decision to its 503 being written."""
    out: dict[float, float] = {}
    for s in samples(text, "sloserve_shed_answer_seconds_bucket"):
        key = float(s.labels["le"])  # "+Inf" is float("inf")
        out[key] = out.get(key, 0.0) + s.value
    return out


def batch_stats(before: str | None, after: str | None) -> dict[str, dict[str, float]]:
    """Per variant, over one step: batches dispatched, their mean rows, and the share of batches of
    at most 2 rows (the small batches a backlogged deadline queue can collapse into)."""
    before, after = before or "", after or ""

    def delta(name: str, variant: str, **labels: str) -> float:
        return prom_sum(after, name, variant=variant, **labels) - prom_sum(before, name, variant=variant, **labels)

    out = {}
    for v in sorted(label_values(after, "sloserve_batch_rows_count", "variant")):
        n = delta("sloserve_batch_rows_count", v)
        if n <= 0:
            continue
        out[v] = {
            "batches": int(n),
            "mean_rows": round(delta("sloserve_batch_rows_sum", v) / n, 2),
            "share_le_2_rows": round(delta("sloserve_batch_rows_bucket", v, le="2.0") / n, 3),
        }
    return out


def slo_counts(text: str | None) -> dict[str, float]:
    """``sloserve_slo_requests`` summed over models: answered requests by whether they met their
    deadline as the gateway measures it (from its own arrival stamp)."""
    return {met: prom_sum(text or "", "sloserve_slo_requests_total", met=met) for met in ("true", "false")}


def server_on_time(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The share of a step's answers the gateway itself counted on time. Against the client's
    attainment it shows how much lateness the server never sees (socket and event-loop waits
    before the arrival stamp, the answer's way back)."""
    met = after.get("true", 0.0) - before.get("true", 0.0)
    late = after.get("false", 0.0) - before.get("false", 0.0)
    n = met + late
    return {"server_answered": int(n), "server_on_time": round(met / n, 4) if n > 0 else None}


def shed_server_side(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """Per step: how many sheds the server timed, the share answered within 1 ms of the decision,
    and the p50 / p99 as the upper bound of the bucket that holds them."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return {"shed_server_n": 0}

    def q(p: float) -> float | None:
        for le in sorted(delta):
            if delta[le] >= p * total:
                return None if le == float("inf") else round(le * 1e3, 3)
        return None

    return {
        "shed_server_n": int(total),
        "shed_server_under_1ms": round(delta.get(0.001, 0.0) / total, 4),
        "shed_server_p50_le_ms": q(0.5),
        "shed_server_p99_le_ms": q(0.99),
    }
