"""Data types of the placement policy: the snapshot it reads, its config, state and decision.

Everything here is a frozen record; the policies in ``autoscaler.placement.policy`` are pure functions
``decide(snapshot, config, state, now_s) -> (PlacementDecision, PlacementState)``.

Units are in the names: memory in MiB (integers, so capacity checks are exact), times in
seconds, work in GPU-seconds.

>>> g = Gpu("g0", "T4", 16384)
>>> t = ReplicaTarget("digits", "small", "T4", count=1, memory_mib=1024)
>>> snap = PlacementSnapshot(gpus=(g,), targets=(t,))
>>> snap.gpu("g0").gpu_type
'T4'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# ---------------------------------------------------------------- snapshot


@dataclass(frozen=True, slots=True)
class Gpu:
    """One typed GPU (or emulated GPU resource) in the inventory."""

    gpu_id: str
    gpu_type: str  # e.g. "T4", "A100"; Ray resource name is gpu_<type>
    memory_mib: int


@dataclass(frozen=True, slots=True)
class ReplicaTarget:
    """The autoscaler's wish: ``count`` replicas of (model, variant) on ``gpu_type``.

    ``gpu_type=None`` lets placement choose the type (best profile throughput per unit cost).
    """

    model: str
    variant: str
    gpu_type: str | None
    count: int
    memory_mib: int  # device memory one replica needs


@dataclass(frozen=True, slots=True)
class Replica:
    """A running (or starting) inference replica; one replica uses (part of) one GPU."""

    replica_id: str
    model: str
    variant: str
    gpu_id: str
    memory_mib: int


@dataclass(frozen=True, slots=True)
class TrainingJob:
    """A training job, queued (``gpu_ids == ()``) or running on ``gpu_ids`` (a gang, one type).

    Progress is in iterations; ``total_iterations=None`` means the duration is unknown
    (AITurbo's unpredictable jobs), which switches the cost model to attained service (Tiresias).
    """

    job_id: str
    num_gpus: int
    memory_mib: int  # per GPU
    iteration_time_s: float  # seconds per iteration on the job's GPUs
    iterations_done: int = 0
    checkpoint_iteration: int = 0  # iteration of the latest valid checkpoint (0 = none)
    checkpoint_interval_iterations: int = 100  # the job checkpoints every this many iterations
    checkpoint_write_s: float = 0.1  # time to write one checkpoint
    total_iterations: int | None = None  # None: unknown duration
    attained_gpu_s: float = 0.0  # GPU-seconds of service received so far (all runs)
    submit_time_s: float = 0.0
    gpu_type: str | None = None  # required GPU type; None = any
    gpu_ids: tuple[str, ...] = ()  # where it runs now; () = queued
    started_s: float | None = None  # when its current run started
    preempting: bool = False  # asked to stop, still holding its GPUs (grace period)

    @property
    def running(self) -> bool:
        return bool(self.gpu_ids)

    @property
    def remaining_iterations(self) -> int | None:
        if self.total_iterations is None:
            return None
        return max(self.total_iterations - self.iterations_done, 0)


ThroughputKey = tuple[str, str, str]  # (model, variant, gpu type)


@dataclass(frozen=True)
class PlacementSnapshot:
    """What placement sees at one instant.

    ``replica_throughput_rps`` is Gavel's throughput matrix for inference: requests/s one replica of
    (model, variant) sustains on a GPU type within its SLO (see ``placement_cost.throughputs_from_profile``);
    a missing entry counts as 1.0 (all types equal).
    """

    gpus: tuple[Gpu, ...]
    targets: tuple[ReplicaTarget, ...] = ()
    replicas: tuple[Replica, ...] = ()
    jobs: tuple[TrainingJob, ...] = ()  # queued and running
    replica_throughput_rps: Mapping[ThroughputKey, float] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "replica_throughput_rps", MappingProxyType(dict(self.replica_throughput_rps)))
        ids = [g.gpu_id for g in self.gpus]
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate gpu ids in the inventory")

    def gpu(self, gpu_id: str) -> Gpu:
        for g in self.gpus:
            if g.gpu_id == gpu_id:
                return g
        raise KeyError(gpu_id)

    def throughput(self, model: str, variant: str, gpu_type: str) -> float:
        return float(self.replica_throughput_rps.get((model, variant, gpu_type), 1.0))


# ---------------------------------------------------------------- config


class PlacementConfig(BaseModel):
    """Knobs of the placement policies (validated once at the edge; policies see this object)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_cost_per_hour: dict[str, float] = Field(
        default_factory=dict, description="Price of one GPU of each type per hour (Gavel's cost); missing = default."
    )
    default_gpu_cost_per_hour: float = Field(default=1.0, gt=0, description="Price of a GPU type not listed.")
    max_replicas_per_gpu: int = Field(default=1, ge=1, description="Inference replicas one GPU may hold.")
    pack_small_replicas: bool = Field(
        default=True, description="Allow a small replica beside a training job on one GPU (AntMan/Gandiva)."
    )
    pack_max_replica_memory_mib: int = Field(
        default=2048, ge=0, description="A replica needing at most this much memory counts as small."
    )
    substitute_types: bool = Field(
        default=True,
        description="When a target's GPU type is exhausted, place throughput-equivalent replicas on "
        "other types, best throughput per cost first.",
    )
    preempt_grace_s: float = Field(
        default=1.0,
        gt=0,
        description="Time a preempted job gets to checkpoint at an iteration boundary before it is killed.",
    )
    restart_overhead_s: float = Field(
        default=10.0, ge=0, description="Time a preempted job needs to restart and reload its checkpoint."
    )
    cost_tie_gpu_s: float = Field(
        default=30.0,
        gt=0,
        description="Preemption costs within this many GPU-seconds tie; ties are broken by "
        "remaining work (predictable jobs) and attained service (unknown ones).",
    )
    training_headroom_gpus: int = Field(
        default=0, ge=0, description="Idle GPUs per type kept free of training so small scale-ups need no preemption."
    )
    static_inference_gpus: dict[str, int] = Field(
        default_factory=dict, description="static policy: GPUs of each type reserved for inference."
    )
    static_inference_fraction: float = Field(
        default=0.5, ge=0, le=1, description="static policy: share of each type for inference when not listed."
    )
    blind_choice: Literal["most-recent", "random"] = Field(
        default="most-recent", description="cost-blind policy: which running job it preempts."
    )
    seed: int = Field(default=0, description="Seed of the cost-blind random choice (with the round number).")

    @model_validator(mode="after")
    def _positive_costs(self) -> PlacementConfig:
        bad = {k: v for k, v in self.gpu_cost_per_hour.items() if v <= 0}
        if bad:
            raise ValueError(f"gpu_cost_per_hour must be positive, got {bad}")
        return self

    def cost_per_hour(self, gpu_type: str) -> float:
        return self.gpu_cost_per_hour.get(gpu_type, self.default_gpu_cost_per_hour)


# ---------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class PlacementState:
    """What a policy remembers between calls: the round number and preemptions still in flight."""

    round: int = 0
    preempt_requested_s: Mapping[str, float] = field(default_factory=dict)  # job id -> when asked

    def __post_init__(self):
        object.__setattr__(self, "preempt_requested_s", MappingProxyType(dict(self.preempt_requested_s)))


# ---------------------------------------------------------------- decision

ReplicaReason = Literal["idle-gpu", "shared-gpu", "packed-beside-training", "after-preemption", "substitute-type"]
StopReason = Literal["scale-in", "no-target", "substitute-not-needed"]
TrainingReason = Literal["idle-gpus", "resume"]
PreemptReason = Literal["reclaim-for-inference", "partition"]


@dataclass(frozen=True, slots=True)
class PreemptionCost:
    """What preempting a job costs, in GPU-seconds; ``key`` orders candidates (lowest first)."""

    lost_gpu_s: float  # work redone after the restart (partial iteration, or since the last checkpoint)
    restart_gpu_s: float  # restart + checkpoint write overhead
    remaining_gpu_s: float | None  # predictable jobs: work left; None = unknown duration
    attained_gpu_s: float
    key: tuple[float, ...]

    @property
    def total_gpu_s(self) -> float:
        return self.lost_gpu_s + self.restart_gpu_s


@dataclass(frozen=True, slots=True)
class StartReplica:
    model: str
    variant: str
    gpu_id: str
    memory_mib: int
    reason: ReplicaReason
    after_preempt: str | None = None  # start once this job has released the GPU
    beside_job: str | None = None  # packed beside this training job


@dataclass(frozen=True, slots=True)
class StopReplica:
    replica_id: str
    gpu_id: str
    reason: StopReason


@dataclass(frozen=True, slots=True)
class StartTraining:
    job_id: str
    gpu_ids: tuple[str, ...]
    reason: TrainingReason  # "resume" when the job has a checkpoint to resume from


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: str
    gpu_ids: tuple[str, ...]
    reason: PreemptReason
    grace_s: float
    cost: PreemptionCost


@dataclass(frozen=True, slots=True)
class Unplaced:
    """Replicas of a target that could not be placed (capacity exhausted)."""

    model: str
    variant: str
    gpu_type: str | None
    count: int
    reason: str


@dataclass(frozen=True, slots=True)
class PlacementDecision:
    """One round's decision. A driver applies it in order: stop replicas, preempt jobs, start replicas
    (those with ``after_preempt`` once that job has freed its GPUs), then start training."""

    policy: str
    stop_replicas: tuple[StopReplica, ...] = ()
    preempt: tuple[Preempt, ...] = ()
    start_replicas: tuple[StartReplica, ...] = ()
    start_training: tuple[StartTraining, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.stop_replicas or self.preempt or self.start_replicas or self.start_training)
