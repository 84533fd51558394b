"""Where a successful request's time went (queued, computing) and how many requests wait, as
sloserve metrics: what Triton's ``nv_inference_queue_duration_us``, ``nv_inference_compute_*`` and
``nv_inference_pending_request_count`` are derived from (``sloserve/gateway/triton_metrics.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Gauge, Histogram


class RequestPhases:
    def __init__(self, registry: CollectorRegistry, buckets: Sequence[float]):
        self.queue = Histogram(
            "sloserve_request_queue_seconds",
            "Time an answered request waited in the batching queue, by model and the variant that ran it.",
            ["model", "variant"],
            buckets=buckets,
            registry=registry,
        )
        self.compute = Histogram(
            "sloserve_request_compute_seconds",
            "Replica compute time of an answered request's batch, by model and the variant that ran it.",
            ["model", "variant"],
            buckets=buckets,
            registry=registry,
        )
        self.pending = Gauge(
            "sloserve_queue_requests", "Requests waiting in the batching queue.", ["model"], registry=registry
        )
        self._h: dict[tuple[str, str], tuple[Histogram, Histogram]] = {}

    def observe(self, model: str, variant: str, queue_s: float, compute_s: float) -> None:
        hs = self._h.get((model, variant))
        if hs is None:
            hs = self._h[(model, variant)] = (self.queue.labels(model, variant), self.compute.labels(model, variant))
        hs[0].observe(queue_s)
        hs[1].observe(compute_s)

    def watch_queue(self, model: str, count: Callable[[], int]) -> None:
        """Read ``model``'s queued requests at scrape time."""
        self.pending.labels(model).set_function(count)
