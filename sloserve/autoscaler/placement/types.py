"""Data types of the placement policy: the snapshot it reads, its config, state and decision.

Everything here is a frozen record; the policies in ``sloserve.autoscaler.placement.policy`` are pure functions
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

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sloserve.autoscaler.placement.perfmodel import JobPerf, PredictiveConfig

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
    tenant: str = "default"  # whose job it is (``PlacementConfig.tenant_shares`` caps each tenant)
    min_gpus: int | None = None  # elastic: runs on any gang size from this to num_gpus (None: only num_gpus)
    perf: JobPerf | None = None  # its model class, targets and measurements (the predictive queue's input)

    @property
    def gang(self) -> int:
        """GPUs it holds now (running), else the gang it asks for."""
        return len(self.gpu_ids) if self.gpu_ids else self.num_gpus

    @property
    def fewest(self) -> int:
        """The smallest gang it runs on."""
        return self.num_gpus if self.min_gpus is None else max(1, min(self.min_gpus, self.num_gpus))

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
    training_queue: Literal["las", "fifo", "srtf", "predictive"] = Field(
        default="las",
        description="Order of the training jobs on harvested GPUs (sloserve/autoscaler/placement/queue.py): las = "
        "Tiresias' discretized two-dimensional least attained service; fifo = submit order; srtf = least "
        "remaining GPU-seconds first (jobs that declare their length; the others after, in submit order); "
        "predictive = predictable jobs by predicted remaining service, the others by 2D-LAS, one queue "
        "(sloserve/autoscaler/placement/predictive.py).",
    )
    predictive: PredictiveConfig = Field(
        default_factory=PredictiveConfig, description="predictive queue: performance-model knobs."
    )
    las_thresholds_gpu_s: tuple[float, ...] = Field(
        default=(3250.0,),
        description="las: attained service (GPU-seconds) at which a job moves down to the next queue; "
        "K-1 increasing thresholds make K queues (Tiresias: two queues, 3,250 GPU-s in its simulator).",
    )
    las_starvation_multiple: float = Field(
        default=4.0,
        ge=0,
        description="las: a job waiting longer than this many times its run time (since its last promotion) "
        "goes back to the top queue; 0 turns the guard off.",
    )
    tenant_shares: dict[str, float] = Field(
        default_factory=dict,
        description="Most of the harvested GPUs each tenant may hold, as a share in (0, 1]; '*' sets it for "
        "tenants not listed; a tenant not covered has no cap.",
    )

    @model_validator(mode="after")
    def _positive_costs(self) -> PlacementConfig:
        bad = {k: v for k, v in self.gpu_cost_per_hour.items() if v <= 0}
        if bad:
            raise ValueError(f"gpu_cost_per_hour must be positive, got {bad}")
        th = self.las_thresholds_gpu_s
        if any(t <= 0 for t in th) or any(b <= a for a, b in zip(th, th[1:], strict=False)):
            raise ValueError(f"las_thresholds_gpu_s must be positive and increasing, got {list(th)}")
        bad = {k: v for k, v in self.tenant_shares.items() if not 0 < v <= 1}
        if bad:
            raise ValueError(f"tenant_shares must be in (0, 1], got {bad}")
        return self

    def tenant_share(self, tenant: str) -> float | None:
        """The tenant's cap as a share of the harvested GPUs, or None (no cap)."""
        return self.tenant_shares.get(tenant, self.tenant_shares.get("*"))

    def cost_per_hour(self, gpu_type: str) -> float:
        return self.gpu_cost_per_hour.get(gpu_type, self.default_gpu_cost_per_hour)


# ---------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class QueueState:
    """What the training queue remembers: per job, the attained service at its last promotion (its
    LAS queue counts from there) and the last time it was seen running (or first seen, if never)."""

    promoted_gpu_s: Mapping[str, float] = field(default_factory=dict)
    last_run_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "promoted_gpu_s", MappingProxyType(dict(self.promoted_gpu_s)))
        object.__setattr__(self, "last_run_s", MappingProxyType(dict(self.last_run_s)))


@dataclass(frozen=True, slots=True)
class PlacementState:
    """What a policy remembers between calls: the round number, preemptions still in flight and the
    training queue's own state."""

    round: int = 0
    preempt_requested_s: Mapping[str, float] = field(default_factory=dict)  # job id -> when asked
    queue: QueueState = field(default_factory=QueueState)

    def __post_init__(self):
        object.__setattr__(self, "preempt_requested_s", MappingProxyType(dict(self.preempt_requested_s)))


# ---------------------------------------------------------------- decision

ReplicaReason = Literal["idle-gpu", "shared-gpu", "packed-beside-training", "after-preemption", "substitute-type"]
StopReason = Literal["scale-in", "no-target", "substitute-not-needed"]
TrainingReason = Literal["idle-gpus", "resume"]
PreemptReason = Literal["reclaim-for-inference", "partition", "priority", "resize"]
QueueAction = Literal["run", "start", "preempt", "resize", "wait"]
QueueReason = Literal[
    "running",  # keeps its GPUs
    "start",  # starts now
    "priority",  # preempted for a job ahead of it in the queue
    "no-capacity",  # not enough harvested GPUs of a type it can use
    "tenant-share",  # its tenant holds its share of the harvested GPUs
    "waiting-for-gpus",  # placed, starts once the GPUs of preempted jobs are released
    "shrink",  # elastic: restarts on fewer GPUs (a job ahead needs the rest)
    "grow",  # elastic: restarts on more GPUs (idle ones of its type)
]


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
class QueueEntry:
    """One training job's place in the queue this round, and what the queue does with it."""

    job_id: str
    position: int  # 0 = head of the queue
    level: int  # las: the queue it is in (0 = top); fifo and srtf: 0
    action: QueueAction
    reason: QueueReason
    tenant: str
    gpu_type: str | None = None  # the type it runs on, or is started on
    gpus: int = 0  # the gang it runs on, starts on or is resized to (0 while it waits)
    order_class: str = ""  # predictive: why it sits where it does (predictable, las, slo, starved, fairness)
    predicted_remaining_s: float | None = None  # predictive: the model's remaining time (predictable jobs)


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
    training_queue: tuple[QueueEntry, ...] = ()  # every training job not being preempted, head first
    queue_next_change_s: float = math.inf  # when a job changes LAS queue without any other event

    @property
    def empty(self) -> bool:
        return not (self.stop_replicas or self.preempt or self.start_replicas or self.start_training)
