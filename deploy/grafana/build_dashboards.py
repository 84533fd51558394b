"""Write the Grafana dashboards of deploy/grafana/dashboards/ (run after editing this file).

    python deploy/grafana/build_dashboards.py [--out FOLDER]

The dashboards are built with Grafana's own typed builders (``grafana-foundation-sdk``), so the
JSON follows Grafana's dashboard schema by construction; the JSON files are the artefact (import
them into Grafana, or mount them with the provisioning files beside them). This script keeps the
four dashboards consistent: one datasource variable, one `$model` variable, units in every panel,
exemplars on the latency panels, and only the metric names of docs/operations.md.
tests/unit/test_dashboards.py checks that the committed files are what this script writes;
tests/integration/test_prometheus.py runs every expression below against a real Prometheus.
"""

from __future__ import annotations

import json
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm
from panels import (  # beside this file
    BAD,
    OUT,
    RI,
    M,
    board,
    latency_heatmap,
    series,
    single,
)


def overview() -> db.Dashboard:
    return board(
        "sloserve-overview",
        "sloserve / overview",
        "Traffic, SLO attainment, availability and load of every model served by the sloserve gateways.",
        [
            single("Requests/s", (f"sum(rate(sloserve_requests_total{{{M}}}[{RI}]))", "requests/s"), "reqps"),
            single(
                "SLO attainment (5m)",
                (
                    'sum(rate(sloserve_slo_requests_total{met="true",' + M + "}[5m])) / "
                    f"sum(rate(sloserve_slo_requests_total{{{M}}}[5m]))",
                    "attainment",
                ),
                "percentunit",
                pct=True,
                decimals=2,
                steps=[(None, "red"), (0.95, "orange"), (0.99, "green")],
            ),
            single(
                "Availability (5m)",
                (
                    "1 - ((sum(rate(sloserve_requests_total{" + BAD + "," + M + "}[5m])) or vector(0))"
                    f" / sum(rate(sloserve_requests_total{{{M}}}[5m])))",
                    "availability",
                ),
                "percentunit",
                pct=True,
                decimals=3,
            ),
            single(
                "p99 latency",
                (
                    "histogram_quantile(0.99, sum by (le) "
                    f"(rate(sloserve_request_duration_seconds_bucket{{{M}}}[{RI}])))",
                    "p99",
                ),
                "s",
            ),
            single(
                "SLO budget burn (1h)",
                (f"max(model:sloserve_slo_misses:ratio_rate1h{{{M}}}) / 0.01", "burn rate"),
                "x",
                description="How many times faster than sustainable the worst model burns "
                "its 1% SLO-miss budget; the fast-burn page fires at 14.4.",
            ),
            single("Rows queued", (f"sum(sloserve_queue_rows{{{M}}})", "rows"), "short"),
            "Traffic and SLOs",
            series(
                "Requests/s by model",
                [(f"sum by (model) (rate(sloserve_requests_total{{{M}}}[{RI}]))", "{{model}}")],
                "reqps",
            ),
            series(
                "SLO attainment by model (5m)",
                [(f"model:sloserve_slo_attainment:ratio_rate5m{{{M}}}", "{{model}}")],
                "percentunit",
                pct=True,
            ),
            series(
                "Latency p99 by model",
                [
                    (
                        f"histogram_quantile({q}, sum by (model, le) (rate("
                        f"sloserve_request_duration_seconds_bucket{{{M}}}[{RI}])))",
                        f"{{{{model}}}} p{int(float(q) * 100)}",
                    )
                    for q in ("0.99", "0.50")
                ],
                "s",
            ),
            series(
                "Outcomes/s",
                [(f"sum by (outcome) (rate(sloserve_requests_total{{{M}}}[{RI}]))", "{{outcome}}")],
                "reqps",
            ),
            series(
                "SLO budget burn rate (1h, 6h)",
                [
                    (f"model:sloserve_slo_misses:ratio_rate{w}{{{M}}} / 0.01", f"{{{{model}}}} {w}")
                    for w in ("1h", "6h")
                ],
                "x",
            ),
            series(
                "Availability budget burn rate (1h, 6h)",
                [
                    (f"model:sloserve_request_errors:ratio_rate{w}{{{M}}} / 0.001", f"{{{{model}}}} {w}")
                    for w in ("1h", "6h")
                ],
                "x",
            ),
            "Load",
            series(
                "Shed and refused/s by reason",
                [(f"sum by (model, reason) (rate(sloserve_shed_total{{{M}}}[{RI}]))", "{{model}} {{reason}}")],
                "reqps",
                description="Requests the batcher shed because they could no longer meet their deadline, or "
                "refused (queue full). Empty while nothing is shed.",
            ),
            series("Rows queued by model", [(f"sum by (model) (sloserve_queue_rows{{{M}}})", "{{model}}")], "short"),
            series(
                "Mean batch size",
                [(f"model_variant:sloserve_batch_rows:mean_1m{{{M}}}", "{{model}}/{{variant}}")],
                "short",
            ),
            series(
                "GPUs by use",
                [("sum by (use) (sloserve_gpus)", "{{use}}")],
                "short",
                description="Ray/placement deployments only (sloserve_gpus).",
                stacked=True,
            ),
        ],
    )


def per_model() -> db.Dashboard:
    return board(
        "sloserve-model",
        "sloserve / model",
        "One model in depth: variants, latency against the SLO, batching and degradation.",
        [
            "Requests",
            series(
                "Requests/s by variant and outcome",
                [
                    (
                        f"sum by (variant, outcome) (rate(sloserve_requests_total{{{M}}}[{RI}]))",
                        "{{variant}} {{outcome}}",
                    )
                ],
                "reqps",
            ),
            series(
                "Variant share (degradation)",
                [
                    (
                        f'sum by (variant) (rate(sloserve_requests_total{{{M},outcome="ok"}}'
                        f"[{RI}])) / ignoring(variant) group_left sum(rate(sloserve_requests_total"
                        f'{{{M},outcome="ok"}}[{RI}]))',
                        "{{variant}}",
                    )
                ],
                "percentunit",
                pct=True,
                stacked=True,
                description="Share of answered requests per variant: the SLO-aware batcher moves traffic to "
                "cheaper variants when the best one cannot meet deadlines.",
            ),
            "Latency and SLO",
            series(
                "Latency quantiles by variant",
                [
                    (
                        f"histogram_quantile({q}, sum by (variant, le) (rate("
                        f"sloserve_request_duration_seconds_bucket{{{M}}}[{RI}])))",
                        f"{{{{variant}}}} p{int(float(q) * 100)}",
                    )
                    for q in ("0.5", "0.9", "0.99")
                ],
                "s",
            ),
            latency_heatmap(
                "Latency distribution",
                (f"sum by (le) (rate(sloserve_request_duration_seconds_bucket{{{M}}}[{RI}]))", "{{le}}"),
            ),
            series(
                "SLO attainment (5m, 1h)",
                [
                    (f"model:sloserve_slo_attainment:ratio_rate5m{{{M}}}", "{{model}} 5m"),
                    (f"1 - model:sloserve_slo_misses:ratio_rate1h{{{M}}}", "{{model}} 1h"),
                ],
                "percentunit",
                pct=True,
            ),
            series(
                "Error-budget burn rates",
                [(f"model:sloserve_slo_misses:ratio_rate{w}{{{M}}} / 0.01", f"SLO {w}") for w in ("5m", "1h", "6h")]
                + [
                    (f"model:sloserve_request_errors:ratio_rate{w}{{{M}}} / 0.001", f"availability {w}")
                    for w in ("5m", "1h")
                ],
                "x",
                description="1 = the budget lasts exactly the 30-day window; pages at 14.4 (1h) / 6 (6h).",
            ),
            "Batching",
            series(
                "Batch size (mean, p90)",
                [
                    (f"model_variant:sloserve_batch_rows:mean_1m{{{M}}}", "{{variant}} mean"),
                    (
                        "histogram_quantile(0.9, sum by (variant, le) "
                        f"(rate(sloserve_batch_rows_bucket{{{M}}}[{RI}])))",
                        "{{variant}} p90",
                    ),
                ],
                "short",
            ),
            series(
                "Batch compute p99",
                [(f"model_variant:sloserve_batch_compute_seconds:p99_1m{{{M}}}", "{{variant}} compute p99")],
                "s",
            ),
            series("Rows computed/s", [(f"model_variant:sloserve_rows:rate1m{{{M}}}", "{{variant}}")], "short"),
            series("Rows queued", [(f"sum by (model) (sloserve_queue_rows{{{M}}})", "{{model}}")], "short"),
            series(
                "Shed/s by reason",
                [(f"sum by (reason) (rate(sloserve_shed_total{{{M}}}[{RI}]))", "{{reason}}")],
                "reqps",
            ),
            series(
                "Profile drift (observed / profiled p99)",
                [(f"sloserve_profile_drift_ratio{{{M}}}", "{{variant}} on {{device_type}}")],
                "x",
                description="Online profile recalibration; alert SloserveProfileDrift at 1.5.",
            ),
            series(
                "Replicas by variant and device type",
                [
                    (
                        f'max by (variant, device_type) (sloserve_replicas{{{M},state="running"}})',
                        "{{variant}} {{device_type}}",
                    )
                ],
                "short",
            ),
        ],
    )


def autoscaler() -> db.Dashboard:
    return board(
        "sloserve-autoscaler",
        "sloserve / autoscaler and placement",
        "Replica sizing against load, and which typed GPU runs what. The sloserve_replicas/gpus/autoscaler "
        "series come from the controller; ray_serve_* from Ray's metrics agents (Ray deployments).",
        [
            "Sizing",
            series(
                "Arrival rate: observed vs predicted",
                [
                    (f"sum by (model) (rate(sloserve_requests_total{{{M}}}[{RI}]))", "{{model}} observed"),
                    (f"sloserve_autoscaler_predicted_requests_per_second{{{M}}}", "{{model}} predicted"),
                ],
                "reqps",
            ),
            series(
                "Replicas: running vs desired",
                [
                    (f'max by (model) (sloserve_replicas{{{M},state="running"}})', "{{model}} running"),
                    (f"sum by (model) (sloserve_replicas_desired{{{M}}})", "{{model}} desired"),
                ],
                "short",
            ),
            series(
                "Replicas by model and device type",
                [(f"model_device_type:sloserve_replicas_running:max{{{M}}}", "{{model}} {{device_type}}")],
                "short",
                stacked=True,
            ),
            series("Replicas by state", [(f"max by (state) (sloserve_replicas{{{M}}})", "{{state}}")], "short"),
            series(
                "Scaling decisions/min",
                [
                    (
                        f"sum by (model, direction) (increase(sloserve_autoscaler_decisions_total{{{M}}}[5m])) / 5",
                        "{{model}} {{direction}}",
                    )
                ],
                "short",
            ),
            series(
                "Replica start time p90",
                [
                    (
                        "histogram_quantile(0.9, sum by (device_type, le) (rate("
                        f"sloserve_replica_start_seconds_bucket{{{M}}}[15m])))",
                        "{{device_type}}",
                    )
                ],
                "s",
            ),
            "Placement",
            series(
                "GPUs by device type and use",
                [("sum by (device_type, use) (sloserve_gpus)", "{{device_type}} {{use}}")],
                "short",
                stacked=True,
            ),
            series(
                "GPU busy share",
                [("device_type:sloserve_gpus_busy:ratio", "{{device_type}}")],
                "percentunit",
                pct=True,
            ),
            series(
                "Load per replica (requests/s)",
                [
                    (
                        f"sum by (model) (rate(sloserve_requests_total{{{M}}}[{RI}])) / on (model) "
                        f'max by (model) (sloserve_replicas{{{M},state="running"}})',
                        "{{model}}",
                    )
                ],
                "reqps",
            ),
            "Ray Serve (Ray deployments)",
            series(
                "Ray Serve healthy replicas",
                [("sum by (deployment) (ray_serve_deployment_replica_healthy)", "{{deployment}}")],
                "short",
            ),
            series(
                "Ray Serve autoscaling target replicas",
                [("sum by (deployment) (ray_serve_autoscaling_target_replicas)", "{{deployment}}")],
                "short",
            ),
            series(
                "Ray Serve queries in flight per deployment",
                [("sum by (deployment) (ray_serve_replica_processing_queries)", "{{deployment}}")],
                "short",
            ),
        ],
    )


def training() -> db.Dashboard:
    reclaim = f"sum by (le, device_type) (rate(sloserve_training_reclaim_seconds_bucket[{RI}]))"
    jct = "sum by (le) (rate(sloserve_training_job_completion_seconds_bucket[6h]))"
    return board(
        "sloserve-training",
        "sloserve / training harvest",
        "Preemptible training on GPUs that inference does not need: how much it gets, how much preemption costs it.",
        [
            series(
                "Training jobs by state",
                [("sum by (state) (sloserve_training_jobs)", "{{state}}")],
                "short",
                stacked=True,
            ),
            series(
                "GPUs given to training",
                [
                    ('sum by (device_type) (sloserve_gpus{use="training"})', "{{device_type}}"),
                    ('sum by (device_type) (sloserve_gpus{use="idle"})', "{{device_type}} idle"),
                ],
                "short",
            ),
            series(
                "Training share of GPUs",
                [("device_type:sloserve_gpus_training:ratio", "{{device_type}}")],
                "percentunit",
                pct=True,
            ),
            series(
                "Training GPU-hours per hour",
                [(f"sum by (device_type) (rate(sloserve_training_gpu_seconds_total[{RI}]))", "{{device_type}}")],
                "short",
                description="Harvested GPU time: GPU-seconds given to training per second.",
            ),
            series(
                "Training steps/s by job",
                [(f"sum by (job) (rate(sloserve_training_steps_total[{RI}]))", "{{job}}")],
                "short",
            ),
            series(
                "Work retained after preemptions (1h)",
                [("device_type:sloserve_training_work_retained:ratio_rate1h", "{{device_type}}")],
                "percentunit",
                pct=True,
            ),
            series(
                "Preemptions/h by reason",
                [
                    (
                        "sum by (device_type, reason) (rate(sloserve_preemptions_total[1h])) * 3600",
                        "{{device_type}} {{reason}}",
                    )
                ],
                "short",
            ),
            series(
                "Reclaim latency: decision to GPU free (p50, p99)",
                [
                    (f"histogram_quantile({q}, {reclaim})", f"{{{{device_type}}}} p{int(float(q) * 100)}")
                    for q in ("0.5", "0.99")
                ],
                "s",
                description="How long inference waits for a GPU that training holds: the preemption's "
                "checkpoint and release.",
            ),
            series(
                "Work lost to preemptions (GPU-hours per hour)",
                [
                    (
                        f"sum by (device_type) (rate(sloserve_training_lost_work_seconds_total[{RI}]))",
                        "{{device_type}}",
                    )
                ],
                "short",
            ),
            series(
                "Job completion time (p50, p95, 6h)",
                [(f"histogram_quantile({q}, {jct})", f"p{int(float(q) * 100)}") for q in ("0.5", "0.95")],
                "s",
            ),
            series(
                "Checkpoints/h by trigger",
                [("sum by (trigger) (rate(sloserve_training_checkpoints_total[1h])) * 3600", "{{trigger}}")],
                "short",
            ),
            series(
                "Inference SLO attainment while harvesting (5m)",
                [("min(model:sloserve_slo_attainment:ratio_rate5m)", "worst model")],
                "percentunit",
                pct=True,
                description="Harvest must never cost inference its SLO: the worst model's attainment.",
            ),
        ],
        model_var=False,
    )


def build() -> dict[str, dm.Dashboard]:
    """Every dashboard, keyed by file name."""
    out = {}
    for builder in (overview(), per_model(), autoscaler(), training()):
        d = builder.build()
        out[f"{d.uid}.json"] = d
    return out


def dump(d: dm.Dashboard) -> str:
    """The dashboard as the committed files hold it."""
    return json.dumps(d, cls=JSONEncoder, indent=2) + "\n"


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="write the sloserve Grafana dashboards")
    ap.add_argument("--out", type=Path, default=OUT, help=f"folder (default {OUT})")
    out = ap.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    for name, d in build().items():
        (out / name).write_text(dump(d))
        print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
