"""Write the Grafana dashboards of deploy/grafana/dashboards/ (run after editing this file).

    python deploy/grafana/build_dashboards.py

The JSON files are the artefact (import them into Grafana, or mount them with the provisioning
files beside them); this script keeps the four dashboards consistent: one datasource variable,
one `$model` variable, units in every panel, and only the metric names of docs/operations.md.
tests/integration/test_prometheus.py runs every expression below against a real Prometheus.
"""

from __future__ import annotations

import json
from pathlib import Path

from board import BAD, PCT, RI, Board, M  # beside this file

OUT = Path(__file__).resolve().parent / "dashboards"


def overview() -> Board:
    b = Board(
        "sloserve-overview",
        "sloserve / overview",
        "Traffic, SLO attainment, availability and load of every model served by the sloserve gateways.",
    )
    b.panel(
        "Requests/s", [(f"sum(rate(sloserve_requests_total{{{M}}}[{RI}]))", "requests/s")], "reqps", "stat", w=4, h=4
    )
    b.panel(
        "SLO attainment (5m)",
        [
            (
                'sum(rate(sloserve_slo_requests_total{met="true",' + M + "}[5m])) / "
                f"sum(rate(sloserve_slo_requests_total{{{M}}}[5m]))",
                "attainment",
            )
        ],
        "percentunit",
        "stat",
        w=4,
        h=4,
        defaults={
            "decimals": 2,
            **PCT,
            "thresholds": {
                "mode": "absolute",
                "steps": [
                    {"color": "red", "value": None},
                    {"color": "orange", "value": 0.95},
                    {"color": "green", "value": 0.99},
                ],
            },
        },
    )
    b.panel(
        "Availability (5m)",
        [
            (
                "1 - ((sum(rate(sloserve_requests_total{" + BAD + "," + M + "}[5m])) or vector(0))"
                f" / sum(rate(sloserve_requests_total{{{M}}}[5m])))",
                "availability",
            )
        ],
        "percentunit",
        "stat",
        w=4,
        h=4,
        defaults={"decimals": 3, **PCT},
    )
    b.panel(
        "p99 latency",
        [
            (
                f"histogram_quantile(0.99, sum by (le) (rate(sloserve_request_duration_seconds_bucket{{{M}}}[{RI}])))",
                "p99",
            )
        ],
        "s",
        "stat",
        w=4,
        h=4,
    )
    b.panel(
        "SLO budget burn (1h)",
        [(f"max(model:sloserve_slo_misses:ratio_rate1h{{{M}}}) / 0.01", "burn rate")],
        "x",
        "stat",
        w=4,
        h=4,
        description="How many times faster than sustainable the worst model burns "
        "its 1% SLO-miss budget; the fast-burn page fires at 14.4.",
    )
    b.panel("Rows queued", [(f"sum(sloserve_queue_rows{{{M}}})", "rows")], "short", "stat", w=4, h=4)
    b.row("Traffic and SLOs")
    b.panel(
        "Requests/s by model", [(f"sum by (model) (rate(sloserve_requests_total{{{M}}}[{RI}]))", "{{model}}")], "reqps"
    )
    b.panel(
        "SLO attainment by model (5m)",
        [(f"model:sloserve_slo_attainment:ratio_rate5m{{{M}}}", "{{model}}")],
        "percentunit",
        defaults=PCT,
    )
    b.panel(
        "Latency p99 by model",
        [
            (
                f"histogram_quantile(0.99, sum by (model, le) (rate("
                f"sloserve_request_duration_seconds_bucket{{{M}}}[{RI}])))",
                "{{model}} p99",
            ),
            (
                f"histogram_quantile(0.50, sum by (model, le) (rate("
                f"sloserve_request_duration_seconds_bucket{{{M}}}[{RI}])))",
                "{{model}} p50",
            ),
        ],
        "s",
    )
    b.panel("Outcomes/s", [(f"sum by (outcome) (rate(sloserve_requests_total{{{M}}}[{RI}]))", "{{outcome}}")], "reqps")
    b.panel(
        "SLO budget burn rate (1h, 6h)",
        [
            (f"model:sloserve_slo_misses:ratio_rate1h{{{M}}} / 0.01", "{{model}} 1h"),
            (f"model:sloserve_slo_misses:ratio_rate6h{{{M}}} / 0.01", "{{model}} 6h"),
        ],
        "x",
    )
    b.panel(
        "Availability budget burn rate (1h, 6h)",
        [
            (f"model:sloserve_request_errors:ratio_rate1h{{{M}}} / 0.001", "{{model}} 1h"),
            (f"model:sloserve_request_errors:ratio_rate6h{{{M}}} / 0.001", "{{model}} 6h"),
        ],
        "x",
    )
    b.row("Load")
    b.panel(
        "Shed and refused/s by reason",
        [(f"sum by (model, reason) (rate(sloserve_shed_total{{{M}}}[{RI}]))", "{{model}} {{reason}}")],
        "reqps",
        description="Requests the batcher shed because they could no longer meet their deadline, or refused "
        "(queue full). Empty while nothing is shed.",
    )
    b.panel("Rows queued by model", [(f"sum by (model) (sloserve_queue_rows{{{M}}})", "{{model}}")], "short")
    b.panel(
        "Mean batch size", [(f"model_variant:sloserve_batch_rows:mean_1m{{{M}}}", "{{model}}/{{variant}}")], "short"
    )
    b.panel(
        "GPUs by use",
        [("sum by (use) (sloserve_gpus)", "{{use}}")],
        "short",
        description="Ray/placement deployments only (sloserve_gpus).",
        options={"stacking": {"mode": "normal"}},
    )
    return b


def per_model() -> Board:
    b = Board(
        "sloserve-model",
        "sloserve / model",
        "One model in depth: variants, latency against the SLO, batching and degradation.",
    )
    b.row("Requests")
    b.panel(
        "Requests/s by variant and outcome",
        [(f"sum by (variant, outcome) (rate(sloserve_requests_total{{{M}}}[{RI}]))", "{{variant}} {{outcome}}")],
        "reqps",
    )
    b.panel(
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
        defaults=PCT,
        options={"stacking": {"mode": "normal"}},
        description="Share of answered requests per variant: the SLO-aware batcher moves traffic to cheaper "
        "variants when the best one cannot meet deadlines.",
    )
    b.row("Latency and SLO")
    b.panel(
        "Latency quantiles by variant",
        [
            (
                f"histogram_quantile({q}, sum by (variant, le) (rate(sloserve_request_duration_seconds_bucket{{{M}}}"
                f"[{RI}])))",
                f"{{{{variant}}}} p{int(float(q) * 100)}",
            )
            for q in ("0.5", "0.9", "0.99")
        ],
        "s",
    )
    b.panel(
        "Latency distribution",
        [(f"sum by (le) (rate(sloserve_request_duration_seconds_bucket{{{M}}}[{RI}]))", "{{le}}")],
        "reqps",
        "heatmap",
        options={
            "calculate": False,
            "yAxis": {"unit": "s"},
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges"},
        },
        targets_format="heatmap",
    )
    b.panel(
        "SLO attainment (5m, 1h)",
        [
            (f"model:sloserve_slo_attainment:ratio_rate5m{{{M}}}", "{{model}} 5m"),
            (f"1 - model:sloserve_slo_misses:ratio_rate1h{{{M}}}", "{{model}} 1h"),
        ],
        "percentunit",
        defaults=PCT,
    )
    b.panel(
        "Error-budget burn rates",
        [(f"model:sloserve_slo_misses:ratio_rate{w}{{{M}}} / 0.01", f"SLO {w}") for w in ("5m", "1h", "6h")]
        + [(f"model:sloserve_request_errors:ratio_rate{w}{{{M}}} / 0.001", f"availability {w}") for w in ("5m", "1h")],
        "x",
        description="1 = the budget lasts exactly the 30-day window; pages at 14.4 (1h) / 6 (6h).",
    )
    b.row("Batching")
    b.panel(
        "Batch size (mean, p90)",
        [
            (f"model_variant:sloserve_batch_rows:mean_1m{{{M}}}", "{{variant}} mean"),
            (
                f"histogram_quantile(0.9, sum by (variant, le) (rate(sloserve_batch_rows_bucket{{{M}}}[{RI}])))",
                "{{variant}} p90",
            ),
        ],
        "short",
    )
    b.panel(
        "Batch compute p99",
        [(f"model_variant:sloserve_batch_compute_seconds:p99_1m{{{M}}}", "{{variant}} compute p99")],
        "s",
    )
    b.panel("Rows computed/s", [(f"model_variant:sloserve_rows:rate1m{{{M}}}", "{{variant}}")], "short")
    b.panel("Rows queued", [(f"sum by (model) (sloserve_queue_rows{{{M}}})", "{{model}}")], "short")
    b.panel("Shed/s by reason", [(f"sum by (reason) (rate(sloserve_shed_total{{{M}}}[{RI}]))", "{{reason}}")], "reqps")
    b.panel(
        "Profile drift (observed / profiled p99)",
        [(f"sloserve_profile_drift_ratio{{{M}}}", "{{variant}} on {{device_type}}")],
        "x",
        description="Online profile recalibration; alert SloserveProfileDrift at 1.5.",
    )
    b.panel(
        "Replicas by variant and device type",
        [(f'max by (variant, device_type) (sloserve_replicas{{{M},state="running"}})', "{{variant}} {{device_type}}")],
        "short",
    )
    return b


def autoscaler() -> Board:
    b = Board(
        "sloserve-autoscaler",
        "sloserve / autoscaler and placement",
        "Replica sizing against load, and "
        "which typed GPU runs what. The sloserve_replicas/gpus/autoscaler series come from the "
        "controller; ray_serve_* from Ray's metrics agents (Ray deployments).",
    )
    b.row("Sizing")
    b.panel(
        "Arrival rate: observed vs predicted",
        [
            (f"sum by (model) (rate(sloserve_requests_total{{{M}}}[{RI}]))", "{{model}} observed"),
            (f"sloserve_autoscaler_predicted_requests_per_second{{{M}}}", "{{model}} predicted"),
        ],
        "reqps",
    )
    b.panel(
        "Replicas: running vs desired",
        [
            (f'max by (model) (sloserve_replicas{{{M},state="running"}})', "{{model}} running"),
            (f"sum by (model) (sloserve_replicas_desired{{{M}}})", "{{model}} desired"),
        ],
        "short",
    )
    b.panel(
        "Replicas by model and device type",
        [(f"model_device_type:sloserve_replicas_running:max{{{M}}}", "{{model}} {{device_type}}")],
        "short",
        options={"stacking": {"mode": "normal"}},
    )
    b.panel("Replicas by state", [(f"max by (state) (sloserve_replicas{{{M}}})", "{{state}}")], "short")
    b.panel(
        "Scaling decisions/min",
        [
            (
                f"sum by (model, direction) (increase(sloserve_autoscaler_decisions_total{{{M}}}[5m])) / 5",
                "{{model}} {{direction}}",
            )
        ],
        "short",
    )
    b.panel(
        "Replica start time p90",
        [
            (
                f"histogram_quantile(0.9, sum by (device_type, le) (rate("
                f"sloserve_replica_start_seconds_bucket{{{M}}}[15m])))",
                "{{device_type}}",
            )
        ],
        "s",
    )
    b.row("Placement")
    b.panel(
        "GPUs by device type and use",
        [("sum by (device_type, use) (sloserve_gpus)", "{{device_type}} {{use}}")],
        "short",
        options={"stacking": {"mode": "normal"}},
    )
    b.panel(
        "GPU busy share", [("device_type:sloserve_gpus_busy:ratio", "{{device_type}}")], "percentunit", defaults=PCT
    )
    b.panel(
        "Load per replica (requests/s)",
        [
            (
                f"sum by (model) (rate(sloserve_requests_total{{{M}}}[{RI}])) / on (model) "
                f'max by (model) (sloserve_replicas{{{M},state="running"}})',
                "{{model}}",
            )
        ],
        "reqps",
    )
    b.row("Ray Serve (Ray deployments)")
    b.panel(
        "Ray Serve healthy replicas",
        [("sum by (deployment) (ray_serve_deployment_replica_healthy)", "{{deployment}}")],
        "short",
    )
    b.panel(
        "Ray Serve autoscaling target replicas",
        [("sum by (deployment) (ray_serve_autoscaling_target_replicas)", "{{deployment}}")],
        "short",
    )
    b.panel(
        "Ray Serve queries in flight per deployment",
        [("sum by (deployment) (ray_serve_replica_processing_queries)", "{{deployment}}")],
        "short",
    )
    return b


def training() -> Board:
    b = Board(
        "sloserve-training",
        "sloserve / training harvest",
        "Preemptible training on GPUs that inference does not need: how much it gets, how much preemption costs it.",
        model_var=False,
    )
    b.panel(
        "Training jobs by state",
        [("sum by (state) (sloserve_training_jobs)", "{{state}}")],
        "short",
        options={"stacking": {"mode": "normal"}},
    )
    b.panel(
        "GPUs given to training",
        [
            ('sum by (device_type) (sloserve_gpus{use="training"})', "{{device_type}}"),
            ('sum by (device_type) (sloserve_gpus{use="idle"})', "{{device_type}} idle"),
        ],
        "short",
    )
    b.panel(
        "Training share of GPUs",
        [("device_type:sloserve_gpus_training:ratio", "{{device_type}}")],
        "percentunit",
        defaults=PCT,
    )
    b.panel(
        "Training GPU-hours per hour",
        [(f"sum by (device_type) (rate(sloserve_training_gpu_seconds_total[{RI}]))", "{{device_type}}")],
        "short",
    )
    b.panel(
        "Training steps/s by job", [(f"sum by (job) (rate(sloserve_training_steps_total[{RI}]))", "{{job}}")], "short"
    )
    b.panel(
        "Work retained after preemptions (1h)",
        [("device_type:sloserve_training_work_retained:ratio_rate1h", "{{device_type}}")],
        "percentunit",
        defaults=PCT,
    )
    b.panel(
        "Preemptions/h by reason",
        [("sum by (device_type, reason) (rate(sloserve_preemptions_total[1h])) * 3600", "{{device_type}} {{reason}}")],
        "short",
    )
    b.panel(
        "Reclaim latency: decision to GPU free (p50, p99)",
        [
            (
                f"histogram_quantile(0.5, sum by (le, device_type) (rate(sloserve_training_reclaim_seconds_bucket[{RI}])))",
                "{{device_type}} p50",
            ),
            (
                f"histogram_quantile(0.99, sum by (le, device_type) (rate(sloserve_training_reclaim_seconds_bucket[{RI}])))",
                "{{device_type}} p99",
            ),
        ],
        "s",
        description="How long inference waits for a GPU that training holds: the preemption's checkpoint and release.",
    )
    b.panel(
        "Work lost to preemptions (GPU-hours per hour)",
        [(f"sum by (device_type) (rate(sloserve_training_lost_work_seconds_total[{RI}]))", "{{device_type}}")],
        "short",
    )
    b.panel(
        "Job completion time (p50, p95, 6h)",
        [
            ("histogram_quantile(0.5, sum by (le) (rate(sloserve_training_job_completion_seconds_bucket[6h])))", "p50"),
            (
                "histogram_quantile(0.95, sum by (le) (rate(sloserve_training_job_completion_seconds_bucket[6h])))",
                "p95",
            ),
        ],
        "s",
    )
    b.panel(
        "Checkpoints/h by trigger",
        [("sum by (trigger) (rate(sloserve_training_checkpoints_total[1h])) * 3600", "{{trigger}}")],
        "short",
    )
    b.panel(
        "Inference SLO attainment while harvesting (5m)",
        [("min(model:sloserve_slo_attainment:ratio_rate5m)", "worst model")],
        "percentunit",
        defaults=PCT,
        description="Harvest must never cost inference its SLO: the worst model's attainment.",
    )
    return b


def build() -> dict[str, dict]:
    """Every dashboard as Grafana JSON, keyed by file name."""
    out = {}
    for board in (overview(), per_model(), autoscaler(), training()):
        data = board.json()
        for p in data["panels"]:
            fmt = p.pop("targets_format", None)
            if fmt:
                for t in p["targets"]:
                    t["format"] = fmt
        out[f"{board.uid}.json"] = data
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="write the sloserve Grafana dashboards")
    ap.add_argument("--out", type=Path, default=OUT, help=f"folder (default {OUT})")
    out = ap.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    for name, data in build().items():
        (out / name).write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
