"""A served model's configuration and statistics in Triton's shapes (the JSON of its
``ModelConfig`` and ``ModelStatistics`` protobuf messages), so tritonclient's ``get_model_config``
and ``get_inference_statistics`` read them unchanged over REST and gRPC alike.

The statistics are what the data plane measures per request and the batcher per batch, nothing
estimated: ``success`` and ``fail`` are the time from arrival to the answer, ``queue`` the time from
arrival to the batch's dispatch, ``compute_infer`` the batch's time on its replica (each request of
a batch counts the whole batch, as Triton counts it). Input and output conversion are not measured
apart from inference: ``compute_input`` and ``compute_output`` stay at zero.

>>> s = ModelStats()
>>> s.success(0.004, 0.001, 0.002, rows=3, now_s=1.0)
>>> s.batch(3, 0.002)
>>> st = s.triton("digits", "1")
>>> st["inference_count"], st["execution_count"], st["inference_stats"]["success"]
(3, 1, {'count': 1, 'ns': 4000000})
"""

from __future__ import annotations

import json
from typing import Any

from sloserve.models.repository import ModelConfig, TritonSettings
from sloserve.models.schema import DynamicBatching, QueuePolicy

# V2 datatype -> Triton's model config DataType (model_config.proto)
TRITON_TYPE = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BF16": "TYPE_BF16",
    "BYTES": "TYPE_STRING",
}


def triton_config(cfg: ModelConfig, policy: str, triton: TritonSettings | None = None) -> dict[str, Any]:
    """``cfg`` as Triton's ``ModelConfig`` JSON. What Triton's schema has no field for (the SLO, the
    accuracy variants, the batching policy) is in ``parameters``, each a ``string_value``. A model with a
    ``dynamic_batching`` block shows it; one read from a Triton config.pbtxt (``triton``) also shows its
    instance groups and file name."""

    def tensors(specs) -> list[dict[str, Any]]:
        return [{"name": t.name, "data_type": TRITON_TYPE[t.datatype], "dims": list(t.shape)} for t in specs]

    versions = [int(v) for v in cfg.versions if v.isdigit()]
    params = {
        "slo_ms": cfg.slo_ms,
        "batching_policy": policy,
        "default_variant": cfg.best_variant,
        "variants": json.dumps(
            [{"name": v.name, "accuracy": v.accuracy, "cost_flops": v.cost_flops} for v in cfg.variants_by_accuracy]
        ),
    }
    out: dict[str, Any] = {
        "name": cfg.name,
        "platform": cfg.platform,
        "backend": "onnxruntime",
        "max_batch_size": cfg.max_batch_size,
        "input": tensors(cfg.inputs),
        "output": tensors(cfg.outputs),
        "parameters": {k: {"string_value": str(v)} for k, v in params.items()},
    }
    if versions:
        out["version_policy"] = {"specific": {"versions": versions}}
    if cfg.dynamic_batching is not None:
        out["dynamic_batching"] = dynamic_batching_config(cfg.dynamic_batching)
    if triton is not None:
        out.update(triton_settings_config(triton))
    return out


def dynamic_batching_config(db: DynamicBatching) -> dict[str, Any]:
    """``dynamic_batching`` in Triton's ``ModelConfig`` JSON."""

    def queue(q: QueuePolicy) -> dict[str, Any]:
        return {
            "timeout_action": q.timeout_action,
            "default_timeout_microseconds": q.default_timeout_us,
            "allow_timeout_override": q.allow_timeout_override,
            "max_queue_size": q.max_queue_size,
        }

    return {
        "preferred_batch_size": list(db.preferred_batch_sizes),
        "max_queue_delay_microseconds": db.max_queue_delay_us,
        "preserve_ordering": db.preserve_ordering,
        "priority_levels": db.priority_levels,
        "default_priority_level": db.default_priority_level,
        "default_queue_policy": queue(db.default_queue_policy),
        "priority_queue_policy": {str(k): queue(v) for k, v in db.priority_queue_policy.items()},
    }


def triton_settings_config(t: TritonSettings) -> dict[str, Any]:
    """The config.pbtxt settings sloserve keeps, in Triton's ``ModelConfig`` JSON."""
    out: dict[str, Any] = {"default_model_filename": t.model_filename}
    if t.instance_groups:
        out["instance_group"] = [
            {"name": g.name, "kind": g.kind, "count": g.count, "gpus": list(g.gpus)} for g in t.instance_groups
        ]
    return out


class _Duration:
    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, seconds: float) -> None:
        self.count += 1
        self.ns += int(seconds * 1e9)

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class ModelStats:
    """One loaded model's counters since it was loaded (a reload starts them again, as in Triton).
    A request's success is a few float additions on the hot path; Triton's integer nanoseconds are
    made when the statistics are read."""

    __slots__ = ("_batches", "_compute_s", "_fail", "_ok", "_ok_s", "_queue_s", "executions", "inferences", "last_s")

    def __init__(self) -> None:
        self._fail = _Duration()
        self._ok = 0  # requests answered
        self._ok_s = self._queue_s = self._compute_s = 0.0
        self._batches: dict[int, _Duration] = {}
        self.inferences = 0  # rows answered
        self.executions = 0  # batches run
        self.last_s = 0.0  # wall-clock time of the last answer

    def success(self, latency_s: float, queue_s: float, compute_s: float, rows: int, now_s: float) -> None:
        self._ok += 1
        self._ok_s += latency_s
        self._queue_s += queue_s
        self._compute_s += compute_s
        self.inferences += rows
        self.last_s = now_s

    def fail(self, latency_s: float) -> None:
        self._fail.add(latency_s)

    def batch(self, rows: int, compute_s: float) -> None:
        self.executions += 1
        d = self._batches.get(rows)
        if d is None:
            d = self._batches[rows] = _Duration()
        d.add(compute_s)

    def triton(self, name: str, version: str) -> dict[str, Any]:
        """Triton's ``ModelStatistics`` JSON."""
        zero = {"count": 0, "ns": 0}
        return {
            "name": name,
            "version": version,
            "last_inference": int(self.last_s * 1e3),
            "inference_count": self.inferences,
            "execution_count": self.executions,
            "inference_stats": {
                "success": {"count": self._ok, "ns": int(self._ok_s * 1e9)},
                "fail": self._fail.as_dict(),
                "queue": {"count": self._ok, "ns": int(self._queue_s * 1e9)},
                "compute_input": dict(zero),
                "compute_infer": {"count": self._ok, "ns": int(self._compute_s * 1e9)},
                "compute_output": dict(zero),
                "cache_hit": dict(zero),
                "cache_miss": dict(zero),
            },
            "batch_stats": [
                {
                    "batch_size": rows,
                    "compute_input": dict(zero),
                    "compute_infer": d.as_dict(),
                    "compute_output": dict(zero),
                }
                for rows, d in sorted(self._batches.items())
            ],
        }
