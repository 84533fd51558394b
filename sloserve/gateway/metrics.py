"""Prometheus metrics of the gateway (catalogue in docs/operations.md).

Label children are cached per (model, variant, outcome) so the hot path does one dict lookup.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from sloserve.gateway.metrics_phases import RequestPhases

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.5,
    5.0,
)
SHED_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.requests = Counter(
            "sloserve_requests",
            "Inference requests by model, variant and outcome.",
            ["model", "variant", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "sloserve_request_duration_seconds",
            "Time from arrival at the gateway to the response, by model and variant.",
            ["model", "variant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.slo = Counter(
            "sloserve_slo_requests",
            "Answered requests by whether they met their deadline.",
            ["model", "met"],
            registry=r,
        )
        self.loop_lag = Gauge(
            "sloserve_event_loop_lag_seconds",
            "The gateway event loop's lag (EWMA of a 5 ms timer probe, run while requests come).",
            registry=r,
        )
        self.queue_depth = Gauge("sloserve_queue_rows", "Rows waiting in the batching queue.", ["model"], registry=r)
        self.batch_size = Histogram(
            "sloserve_batch_rows", "Rows per dispatched batch.", ["model", "variant"], buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_compute = Histogram(
            "sloserve_batch_compute_seconds",
            "Replica compute time per batch.",
            ["model", "variant"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.shed = Counter("sloserve_shed", "Requests refused or shed, by reason.", ["model", "reason"], registry=r)
        self.phases = RequestPhases(r, LATENCY_BUCKETS)  # queue and compute time per request; requests queued
        self.shed_answer = Histogram(
            "sloserve_shed_answer_seconds",
            "Time from a shed or admission refusal decision to its 503 / UNAVAILABLE answer being written.",
            ["model", "reason"],
            buckets=SHED_BUCKETS,
            registry=r,
        )
        self.batch_failures = Counter(
            "sloserve_batch_failures",
            "Batches whose replica failed, by what followed (retried once elsewhere, or failed explicitly).",
            ["model", "variant", "action"],
            registry=r,
        )
        # Metrics of the autoscaler, placement, training harvest and online profiles. They are
        # defined here so every exporter uses one name and one label set; a series appears once the part
        # that owns it sets it (see docs/operations.md, "who exports what").
        self.replicas = Gauge(
            "sloserve_replicas",
            "Replicas by model, variant, device type and state (starting, running, stopping).",
            ["model", "variant", "device_type", "state"],
            registry=r,
        )
        self.batch_slots = Gauge(
            "sloserve_batch_slots",
            "Batches this gateway may have in flight on (model, variant) now: running replicas x pipeline "
            "depth, or, with several gateways on the replicas, the slots its lease holds.",
            ["model", "variant"],
            registry=r,
        )
        self.replica_peak = Gauge(
            "sloserve_replica_peak_batches",
            "Most batches one replica of (model, variant) held at once, from every gateway, as the replicas "
            "said when answering this gateway (at most pipeline_depth: the gateways' leases).",
            ["model", "variant"],
            registry=r,
        )
        self.replica_runtime = Gauge(
            "sloserve_replica_runtime",
            "Replicas by the device (cuda or cpu) and the ONNX Runtime execution provider their sessions "
            "really run on (each replica says so when it loads).",
            ["model", "variant", "device", "provider"],
            registry=r,
        )
        self.replicas_desired = Gauge(
            "sloserve_replicas_desired",
            "Replicas the autoscaler wants.",
            ["model", "variant", "device_type"],
            registry=r,
        )
        self.predicted_rate = Gauge(
            "sloserve_autoscaler_predicted_requests_per_second",
            "Arrival rate the autoscaler predicts over the replica start-up horizon.",
            ["model"],
            registry=r,
        )
        self.scaling_decisions = Counter(
            "sloserve_autoscaler_decisions",
            "Autoscaler decisions by direction (up, down, hold) and reason.",
            ["model", "direction", "reason"],
            registry=r,
        )
        self.replica_start = Histogram(
            "sloserve_replica_start_seconds",
            "Time from placement to a ready replica.",
            ["model", "device_type"],
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
            registry=r,
        )
        self.gpus = Gauge(
            "sloserve_gpus",
            "GPUs by device type and use (inference, training, idle).",
            ["device_type", "use"],
            registry=r,
        )
        self.training_jobs = Gauge(
            "sloserve_training_jobs",
            "Training jobs by state (queued, running, checkpointing, preempted, completed).",
            ["state"],
            registry=r,
        )
        self.training_steps = Counter("sloserve_training_steps", "Training steps completed.", ["job"], registry=r)
        self.training_gpu_seconds = Counter(
            "sloserve_training_gpu_seconds", "GPU time given to training jobs.", ["device_type"], registry=r
        )
        self.training_lost_seconds = Counter(
            "sloserve_training_lost_work_seconds",
            "Training work lost to preemption (time since the last checkpoint).",
            ["device_type"],
            registry=r,
        )
        self.checkpoints = Counter(
            "sloserve_training_checkpoints",
            "Checkpoints written, by trigger (periodic, preemption).",
            ["trigger"],
            registry=r,
        )
        self.training_reclaim = Histogram(
            "sloserve_training_reclaim_seconds",
            "From the placement decision to preempt a training job until its GPUs are free for a replica.",
            ["device_type"],
            buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10),
            registry=r,
        )
        self.training_jct = Histogram(
            "sloserve_training_job_completion_seconds",
            "Training job completion time: from submission until it finished, preemptions and waits included.",
            ["device_type"],
            buckets=(60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400, 259200),
            registry=r,
        )
        self.preemptions = Counter(
            "sloserve_preemptions",
            "Training jobs preempted for inference, by device type and reason.",
            ["device_type", "reason"],
            registry=r,
        )
        self._policies: dict[str, object] = {}
        r.register(_DriftCollector(self._policies))
        # several workers behind one port: a scrape answers for all (sloserve/gateway/metrics_fanin.py)
        self.fanin: Any = None
        self._req: dict[tuple[str, str, str], Counter] = {}
        self._lat: dict[tuple[str, str], Histogram] = {}
        self._slo: dict[tuple[str, bool], Counter] = {}

    async def exposition(self, openmetrics: bool = False) -> bytes:
        """What ``/metrics`` answers: this process's samples, or every worker's with ``workers`` > 1.
        ``openmetrics``: in the OpenMetrics format, which carries the latency histograms' exemplars."""
        if self.fanin is not None:
            return await self.fanin.exposition(openmetrics)
        if openmetrics:
            return generate_openmetrics(self.registry)
        return generate_latest(self.registry)

    def shed_answered(self, model: str, e) -> None:
        """Called by a transport right after writing a shed request's answer."""
        decided = getattr(e, "decided_at", None)
        if decided is not None:
            self.shed_answer.labels(model, e.reason).observe(time.perf_counter() - decided)

    def watch_policies(self, policies: dict[str, object]) -> None:
        """Export the online calibrators' drift of these policies at scrape time (no hot-path cost)."""
        self._policies.update(policies)

    def forget_policy(self, model: str) -> None:
        """``model`` was unloaded: its drift is no longer exported."""
        self._policies.pop(model, None)

    def observe_request(
        self,
        model: str,
        variant: str,
        outcome: str,
        latency_s: float,
        met: bool | None,
        exemplar: dict[str, str] | None = None,
    ) -> None:
        """``exemplar``: a sampled request's ``{"trace_id": ...}``, kept on its latency bucket (OpenMetrics)."""
        key = (model, variant, outcome)
        c = self._req.get(key)
        if c is None:
            c = self._req[key] = self.requests.labels(model, variant, outcome)
        c.inc()
        if outcome == "ok":
            h = self._lat.get((model, variant))
            if h is None:
                h = self._lat[(model, variant)] = self.latency.labels(model, variant)
            h.observe(latency_s, exemplar)
        if met is not None:
            k = (model, met)
            m = self._slo.get(k)
            if m is None:
                m = self._slo[k] = self.slo.labels(model, "true" if met else "false")
            m.inc()

    def batcher_hook(self, model: str):
        depth = self.queue_depth.labels(model)
        sizes: dict[str, Histogram] = {}
        computes: dict[str, Histogram] = {}

        # ``rec`` is the batcher's record for ``kind`` (sloserve.batching.batcher.EventHook): a tuple
        # ("batch": variant, rows, compute_s, reason; "retry"/"batch_failed": variant, rows;
        # "shed": the decision, rows), unpacked here rather than checked on the hot path.
        def hook(kind: str, rec: Any) -> None:
            variant: str
            if kind == "batch":
                rows: int
                compute_s: float
                variant, rows, compute_s, _reason = rec
                h = sizes.get(variant)
                if h is None:
                    h = sizes[variant] = self.batch_size.labels(model, variant)
                    computes[variant] = self.batch_compute.labels(model, variant)
                h.observe(rows)
                computes[variant].observe(compute_s)
            elif kind in ("retry", "batch_failed"):
                variant = rec[0]
                self.batch_failures.labels(model, variant, "retried" if kind == "retry" else "failed").inc()
            elif kind == "shed":
                decision, n = rec
                self.shed.labels(model, decision.reason).inc(n)

        return hook, depth


class _DriftCollector:
    """``sloserve_profile_drift_ratio{model,variant,device_type}``: observed / profiled median batch
    latency from each policy's online calibrator (1 = the profile holds; 2 = twice as slow)."""

    def __init__(self, policies: dict[str, object]):
        self.policies = policies

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        g = GaugeMetricFamily(
            "sloserve_profile_drift_ratio",
            "Observed over profiled median batch latency (1 = the profile holds).",
            labels=["model", "variant", "device_type"],
        )
        for policy in list(self.policies.values()):
            cal = getattr(policy, "calibrator", None)
            if cal is None:
                continue
            for (model, variant, device), ratio in cal.drift().items():
                g.add_metric([model, variant, device], float(ratio))
        yield g
