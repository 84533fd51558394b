"""The model repository's config schema: a model's tensors, variants, SLO and batching (``config.json``,
or a Triton ``config.pbtxt`` translated into the same), and :class:`ModelProblem`, what a model folder
that cannot be served is refused with."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sloserve.models.datatypes import V2_TO_NUMPY

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    """Reject names that could escape the repository (``..``, ``/``, absolute paths)."""
    if not NAME_RE.match(name) or ".." in name:
        raise ValueError(f"invalid {kind} name {name!r}: use letters, digits, '_', '-', '.' (no '..', no '/')")
    return name


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Tensor name as the ONNX graph and the V2 protocol know it.")
    datatype: str = Field(description="V2 datatype: FP32, INT64, ...")
    shape: tuple[int, ...] = Field(description="Shape without the batch dimension; -1 = any.")

    @field_validator("datatype")
    @classmethod
    def _known_datatype(cls, v: str) -> str:
        if v not in V2_TO_NUMPY:
            raise ValueError(f"unknown V2 datatype {v!r}; known: {sorted(V2_TO_NUMPY)}")
        return v


class VariantConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Variant directory name, e.g. small / medium / large.")
    accuracy: float = Field(ge=0.0, le=1.0, description="Measured held-out accuracy (0..1).")
    cost_flops: float = Field(ge=0.0, description="Compute per row (multiply-adds x2).")
    params: int = Field(default=0, ge=0, description="Number of weights.")

    @field_validator("name")
    @classmethod
    def _safe(cls, v: str) -> str:
        return check_name("variant", v)


class QueuePolicy(BaseModel):
    """Triton's ``ModelQueuePolicy`` (a ``dynamic_batching`` queue's timeout and size)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_us: int = Field(default=0, ge=0, description="0: requests never time out in the queue.")
    allow_timeout_override: bool = False
    max_queue_size: int = Field(default=0, ge=0, description="0: unbounded.")


class DynamicBatching(BaseModel):
    """Triton's ``dynamic_batching``: a config.pbtxt's block as written, or config.json's
    ``dynamic_batching`` key in the same shape (the gateway honours both alike)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_queue_delay_us: int = Field(default=0, ge=0)
    preferred_batch_sizes: tuple[int, ...] = ()
    preserve_ordering: bool = False
    priority_levels: int = Field(default=0, ge=0)
    default_priority_level: int = Field(default=0, ge=0)
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: dict[int, QueuePolicy] = Field(default_factory=dict)


class InstanceGroup(BaseModel):
    """One of Triton's ``instance_group`` entries: ``count`` instances of a kind (on ``gpus``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    kind: Literal["KIND_AUTO", "KIND_CPU", "KIND_GPU"] = "KIND_AUTO"
    count: int = Field(default=1, ge=1)
    gpus: tuple[int, ...] = ()


class TritonSettings(BaseModel):
    """What a Triton model's config.pbtxt says that sloserve's own config has no field for
    (``sloserve/models/triton.py`` fills it: ``LoadedModel.triton``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_filename: str = Field(default="model.onnx", description="default_model_filename of every version.")
    version_policy: Literal["latest", "all", "specific"] = "latest"
    variant_fallback: bool = Field(
        default=False,
        description="A request naming no version may be served by another version than the default one "
        "(sloserve's accuracy variants); False: only by the default one, as Triton serves the latest.",
    )
    instance_groups: tuple[InstanceGroup, ...] = ()
    reshape: dict[str, tuple[int, ...]] = Field(
        default_factory=dict,
        description="Tensor name -> its config 'dims' (batch dimension excluded), for the tensors whose "
        "'reshape' differs: the model (and sloserve's 'shape') takes the reshape.",
    )
    batch_dimension: bool = Field(
        default=True, description="False: config.pbtxt's max_batch_size is 0 (the first dimension is fixed at 1)."
    )
    ignored: tuple[str, ...] = Field(default=(), description="Keys of config.pbtxt accepted but not honoured.")

    @field_validator("model_filename")
    @classmethod
    def _safe(cls, v: str) -> str:
        return check_name("default_model_filename", v)

    def replicas(self) -> int | None:
        """Replicas per version from ``instance_group``: the groups' counts added up (None: no group)."""
        return sum(g.count for g in self.instance_groups) or None

    def on_cpu(self) -> bool:
        """Every ``instance_group`` is ``KIND_CPU``: the model computes on the CPU even where a GPU is
        visible. ``KIND_GPU`` and ``KIND_AUTO`` leave it to the server's ``device`` setting."""
        return bool(self.instance_groups) and all(g.kind == "KIND_CPU" for g in self.instance_groups)


class ModelConfig(BaseModel):
    """One model: its tensors, batching limits, SLO and accuracy variants."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    versions: tuple[str, ...] = Field(default=("1",), description="Versions served (metadata).")
    platform: str = "onnxruntime_onnx"
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = Field(default=64, ge=1, le=4096)
    slo_ms: float = Field(
        default=50.0,
        gt=0,
        description="The model's latency objective: what the autoscaler sizes for and what requests that name "
        "no slo_ms are counted against (they are served best-effort).",
    )
    variants: tuple[VariantConfig, ...] = Field(min_length=1)
    default_variant: str | None = Field(
        default=None, description="Variant used when a request asks for none (default: most accurate)."
    )
    batching: dict = Field(
        default_factory=dict,
        description="Batching policy name and its keyword arguments (default: the server's default_policy).",
    )
    dynamic_batching: DynamicBatching | None = Field(
        default=None,
        description="Triton's queue policy (a config.pbtxt's dynamic_batching, or the same keys in config.json): "
        "priority_levels, default_priority_level, default_queue_policy and priority_queue_policy (timeout_action "
        "REJECT or DELAY, default_timeout_us, allow_timeout_override, max_queue_size). max_queue_delay_us and "
        "preferred_batch_sizes are the 'fixed' batching policy's defaults; other policies choose their own.",
    )
    description: str = ""

    @field_validator("name")
    @classmethod
    def _safe(cls, v: str) -> str:
        return check_name("model", v)

    def max_request_elements(self, max_rows: int | None = None) -> int | None:
        """Elements in the largest request the model accepts (``max_batch_size`` rows of every input,
        or ``max_rows`` if fewer), or None when an input has a variable dimension or holds BYTES."""
        rows = min(self.max_batch_size, max_rows or self.max_batch_size)
        n = 0
        for t in self.inputs:
            if t.datatype == "BYTES" or any(d < 0 for d in t.shape):
                return None
            n += rows * math.prod(t.shape)
        return n

    @model_validator(mode="before")
    @classmethod
    def _fixed_from_dynamic_batching(cls, data: object) -> object:
        """The ``fixed`` policy (Triton's dynamic batcher) takes dynamic_batching's queue delay and
        preferred sizes unless ``batching`` gives its own."""
        if not isinstance(data, dict):
            return data
        batching, db = data.get("batching"), data.get("dynamic_batching")
        if not (isinstance(batching, dict) and batching.get("policy") == "fixed" and isinstance(db, dict)):
            return data
        knobs = {"max_queue_delay_ms": db.get("max_queue_delay_us", 0) / 1000.0}
        if db.get("preferred_batch_sizes"):
            knobs["preferred_batch_sizes"] = list(db["preferred_batch_sizes"])
        return {**data, "batching": {**knobs, **batching}}

    @model_validator(mode="after")
    def _cross(self) -> ModelConfig:
        db = self.dynamic_batching
        if db is not None:
            big = [b for b in db.preferred_batch_sizes if not 1 <= b <= self.max_batch_size]
            if big:
                raise ValueError(
                    f"dynamic_batching.preferred_batch_sizes {big} outside 1..max_batch_size ({self.max_batch_size})"
                )
            if db.default_priority_level > db.priority_levels:
                raise ValueError(
                    f"dynamic_batching.default_priority_level {db.default_priority_level} is above priority_levels "
                    f"{db.priority_levels}"
                )
            bad = sorted(k for k in db.priority_queue_policy if not 1 <= k <= db.priority_levels)
            if bad:
                raise ValueError(
                    f"dynamic_batching.priority_queue_policy levels {bad} outside 1..priority_levels ({db.priority_levels})"
                )
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate variant names in {names}")
        if self.default_variant is not None and self.default_variant not in names:
            raise ValueError(f"default_variant {self.default_variant!r} is not one of {names}")
        return self

    @property
    def variants_by_accuracy(self) -> tuple[VariantConfig, ...]:
        return tuple(sorted(self.variants, key=lambda v: (-v.accuracy, v.cost_flops)))

    @property
    def best_variant(self) -> str:
        return self.default_variant or self.variants_by_accuracy[0].name

    def variant(self, name: str) -> VariantConfig:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)


class LoadedModel(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    config: ModelConfig
    root: Path
    override: dict = Field(
        default_factory=dict,
        description="The config.json keys a load through the repository API replaced (a Ray replica, which "
        "reads the folder again, applies them too).",
    )
    triton: TritonSettings | None = Field(
        default=None, description="Set for a model read from a Triton config.pbtxt (its versions are its variants)."
    )

    def onnx_path(self, variant: str) -> Path:
        """The variant's ONNX file: ``<variant>/model.onnx``; for a Triton model
        ``<version>/<default_model_filename>``, or the ``model.onnx`` inside it when that is a folder
        (Triton's ONNX Runtime backend reads such a folder so, external data beside it)."""
        check_name("variant", variant)
        if self.triton is None:
            return self.root / variant / "model.onnx"
        path = self.root / variant / self.triton.model_filename
        return path / "model.onnx" if path.is_dir() else path

    def profile_dir(self, variant: str) -> Path:
        return self.root / variant / "profiles"


class ModelProblem(ValueError):
    """What is wrong with one model folder (its config, its files, config against graph), naming the
    file and the field to fix."""
