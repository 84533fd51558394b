"""Training jobs as Ray actors on GPU or emulated-GPU resources.

A job asks for ``resources={"gpu_<type>": num_gpus}`` (emulated GPUs: start Ray with, e.g.,
``ray.init(resources={"gpu_T4": 4})``) or, with ``real_gpus=True``, ``num_gpus`` plus Ray's
``accelerator_type:<type>``. The second is the scheme GPU replicas use
(``models.ray_replica.actor_options``: ``num_gpus=replica_gpu_fraction`` + ``accelerator_type:<T>``,
which ``emulated_gpus`` declares on a CPU box), so a job started that way and a replica compete for
the same GPUs; the gateway's harvest controller (``autoscaler/placement/controller.py``) launches jobs with it,
a whole GPU per ``num_gpus``. The actor is threaded (``max_concurrency=2``) so that ``preempt()``
runs while ``run()`` trains; ``run()`` then checkpoints at its next iteration boundary and returns.
``RayJobHandle.preempt(grace_s)`` is the preemption protocol: ask, wait ``grace_s``, ``ray.kill``.

>>> ray_options(TrainingSpec(job_id="j", gpu_type="T4", num_gpus=2))["resources"]
{'gpu_T4': 2}
"""

from __future__ import annotations

from pathlib import Path

from autoscaler.training.job import (
    PreemptOutcome,
    PreemptSignal,
    TrainingRunner,
    TrainingSpec,
    preempt_then_kill,
)


def resource_name(gpu_type: str) -> str:
    return f"gpu_{gpu_type}"


def ray_options(spec: TrainingSpec, real_gpus: bool = False) -> dict:
    if real_gpus:
        return {"num_gpus": spec.num_gpus, "accelerator_type": spec.gpu_type, "num_cpus": 0.5, "max_concurrency": 2}
    return {"resources": {resource_name(spec.gpu_type): spec.num_gpus}, "num_cpus": 0.5, "max_concurrency": 2}


class TrainingActor:
    """Actor body (wrapped with ``ray.remote`` by ``RayLauncher``)."""

    def __init__(self, spec_json: str, job_dir: str):
        self.signal = PreemptSignal()
        self.runner = TrainingRunner(TrainingSpec.model_validate_json(spec_json), Path(job_dir), signal=self.signal)

    def run(self) -> dict:
        r = self.runner.run()
        return {
            "status": r.status,
            "iteration": r.iteration,
            "checkpoint_iteration": r.checkpoint_iteration,
            "resumed_from": r.resumed_from,
            "loss": r.loss,
        }

    def preempt(self) -> None:
        self.signal.request()

    def progress(self) -> dict:
        return {"iteration": self.runner.iteration, "checkpoint_iteration": self.runner.checkpoint_iteration}


class RayJobHandle:
    def __init__(self, actor, run_ref):
        self.actor, self.run_ref = actor, run_ref

    def alive(self) -> bool:
        import ray

        ready, _ = ray.wait([self.run_ref], timeout=0)
        return not ready

    def preempt(self, grace_s: float) -> PreemptOutcome:
        import ray

        def wait(t: float) -> bool:
            return bool(ray.wait([self.run_ref], timeout=t)[0])

        outcome = preempt_then_kill(
            lambda: self.actor.preempt.remote(), wait, lambda: ray.kill(self.actor, no_restart=True), grace_s
        )
        if outcome == "checkpointed":
            ray.kill(self.actor, no_restart=True)  # release its resources now
        return outcome


class RayLauncher:
    """Starts each job as a ``TrainingActor`` on the connected Ray cluster (``ray.init`` first)."""

    name = "ray"

    def __init__(self, real_gpus: bool = False):
        self.real_gpus = real_gpus

    def start(self, spec: TrainingSpec, job_dir: Path) -> RayJobHandle:
        import ray

        cls = ray.remote(TrainingActor)
        actor = cls.options(**ray_options(spec, self.real_gpus)).remote(spec.model_dump_json(), str(job_dir))
        # ray types actor methods as plain methods unless decorated with @ray.method (ray is not imported here)
        return RayJobHandle(actor, actor.run.remote())  # type: ignore[attr-defined]

    def attach(self, record: dict) -> None:
        return None  # actors are owned by the manager that started them
