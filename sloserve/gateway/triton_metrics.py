"""Triton's ``nv_inference_*`` metrics, derived at scrape time from sloserve's own ``/metrics``.

Served on their own port when ``triton_metrics`` is set (Triton's convention: 8002, ``/metrics``), for
the dashboards and alerts written against Triton. Every value is computed from the exposition sloserve's
``/metrics`` answers in the same scrape (every worker's, with ``workers`` > 1, summed over the
``worker`` label), so the two cannot disagree:

=========================================  ===============================================================
Triton                                     sloserve
=========================================  ===============================================================
nv_inference_request_success               sloserve_requests_total{outcome="ok"}
nv_inference_request_failure{reason}       sloserve_requests_total{outcome!="ok"} (reason from outcome)
nv_inference_count                         sloserve_batch_rows_sum
nv_inference_exec_count                    sloserve_batch_rows_count
nv_inference_request_duration_us           sloserve_request_duration_seconds_sum x 1e6
nv_inference_queue_duration_us             sloserve_request_queue_seconds_sum x 1e6
nv_inference_compute_infer_duration_us     sloserve_request_compute_seconds_sum x 1e6
nv_inference_compute_input_duration_us     0 (a replica's compute is one span, counted as infer)
nv_inference_compute_output_duration_us    0
nv_inference_pending_request_count         sloserve_queue_requests
=========================================  ===============================================================

Labels: ``model``, and ``version``: the variant that ran the request (a Triton-layout model's variants are
its version numbers); a failure before any variant ran, and the queue (a queued request has no variant
yet), have ``version=""``. Requests for models that are not served are not counted, as in Triton.
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# sloserve's outcome label -> Triton's failure reason
_REASONS = {
    "shed": "REJECTED",
    "rejected": "REJECTED",
    "unavailable": "REJECTED",
    "queue_timeout": "REJECTED",
    "queue_full": "REJECTED",
    "cancelled": "CANCELED",
    "error": "BACKEND",
    "timeout": "BACKEND",
}

_FAMILIES = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds"),
    ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds"),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
    ("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution"),
)

Key = tuple[tuple[str, str], ...]


def _version(variant: str) -> str:
    return "" if variant in ("none", "") else variant


def triton_values(sloserve_text: str) -> dict[str, dict[Key, float]]:
    """Triton's families from sloserve's exposition: family -> sorted label pairs -> value."""
    out: dict[str, dict[Key, float]] = {name: defaultdict(float) for name, _, _ in _FAMILIES}
    seen: set[tuple[str, str]] = set()  # (model, version) that ran something

    def add(family: str, value: float, **labels: str) -> None:
        out[family][tuple(sorted(labels.items()))] += value

    for fam in text_string_to_metric_families(sloserve_text):
        for s in fam.samples:
            lb = s.labels
            model = lb.get("model")
            if model is None or model == "unknown":
                continue
            version = _version(lb.get("variant", ""))
            name = s.name
            if name == "sloserve_requests_total":
                outcome = lb.get("outcome", "")
                if outcome == "ok":
                    add("nv_inference_request_success", s.value, model=model, version=version)
                    seen.add((model, version))
                else:
                    reason = _REASONS.get(outcome, "OTHER")
                    add("nv_inference_request_failure", s.value, model=model, version=version, reason=reason)
            elif name == "sloserve_batch_rows_sum":
                add("nv_inference_count", s.value, model=model, version=version)
            elif name == "sloserve_batch_rows_count":
                add("nv_inference_exec_count", s.value, model=model, version=version)
            elif name == "sloserve_request_duration_seconds_sum":
                add("nv_inference_request_duration_us", s.value * 1e6, model=model, version=version)
            elif name == "sloserve_request_queue_seconds_sum":
                add("nv_inference_queue_duration_us", s.value * 1e6, model=model, version=version)
            elif name == "sloserve_request_compute_seconds_sum":
                add("nv_inference_compute_infer_duration_us", s.value * 1e6, model=model, version=version)
            elif name == "sloserve_queue_requests":
                add("nv_inference_pending_request_count", s.value, model=model, version="")
    for model, version in seen:
        for family in ("nv_inference_compute_input_duration_us", "nv_inference_compute_output_duration_us"):
            add(family, 0.0, model=model, version=version)
    return {k: dict(v) for k, v in out.items()}


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def triton_exposition(sloserve_text: str) -> bytes:
    """The text Triton's metrics port answers (counters without ``_total``, as Triton writes them)."""
    values = triton_values(sloserve_text)
    lines: list[str] = []
    for name, kind, doc in _FAMILIES:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        for key, value in sorted(values[name].items()):
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in key)
            lines.append(f"{name}{{{labels}}} {round(value)}")
    return ("\n".join(lines) + "\n").encode()
