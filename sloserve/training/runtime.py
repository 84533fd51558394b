"""Training jobs on Ray Train: one driver actor per run, a ``TorchTrainer`` gang under it.

``RayLauncher.start(spec, job_dir)`` creates a ``TrainingDriver`` actor (no CPU, no GPU, on this
node; detached and named ``sloserve-train-<job_id>`` in the ``sloserve-training`` namespace, so the run
outlives the gateway process that started it and any gateway process finds it:
``RayLauncher.attach``) whose ``run()`` builds

    TorchTrainer(<the user's function>, train_loop_config=<its JSON config>,
                 scaling_config=ScalingConfig(num_workers=spec.workers, use_gpu=True,
                     resources_per_worker={"GPU": 1, "accelerator_type:<T>": 0.001, "CPU": ...}),
                 run_config=RunConfig(name="run-<n>", storage_path=<job_dir>/storage),
                 train_loop_config={..., "resume_from": <the latest good checkpoint of any run>})

and calls ``fit()``. ``GPU`` + ``accelerator_type:<T>`` are the resources GPU replicas ask for
(``sloserve.replica.ray_replica.actor_options``; declared by hand for emulated GPUs on a CPU box), so a GPU
held by a gang is one Ray Serve cannot schedule a replica on. The driver is also the job's control
board: workers poll ``stop_requested`` (``session.should_stop``) and push progress and checkpoints.

Preemption (``RayJobHandle.preempt(grace_s)``): ask the driver (the gang stops at its next
iteration boundary, saves and returns, ``fit()`` returns), wait ``grace_s``, else ``ray.kill`` the
driver; the Ray Train controller and worker actors it owns die with it (Ray's fate sharing) and the
job loses only the work since its last checkpoint. Either way the handle waits until the gang's
GPUs are back in Ray's available resources. A driver whose run ended kills itself ``LINGER_S`` later
(time for its last progress to be read), so no detached actor outlives its run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sloserve.training.checkpoint import (
    CorruptCheckpoint,
    latest_good,
    list_checkpoints,
    next_run,
    verify,
    write_json_atomic,
)
from sloserve.training.job import (
    JobRejected,
    PreemptOutcome,
    TrainingSpec,
    preempt_then_kill,
    resolve_entry,
    traceback_tail,
)

WORKER_CPUS = 0.25  # logical CPUs per gang worker besides its GPU
HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # how often the Train controller polls its workers
CONTROLLER_POLL_S = 0.1  # (a user's own setting of it wins)
NAMESPACE = "sloserve-training"  # the drivers' Ray namespace
LINGER_S = 2.0  # a driver whose run ended ends itself this long after


def actor_name(job_id: str) -> str:
    return f"sloserve-train-{job_id}"


def resources_per_worker(gpu_type: str) -> dict[str, float]:
    """>>> resources_per_worker("T4")
    {'CPU': 0.25, 'GPU': 1.0, 'accelerator_type:T4': 0.001}
    """
    return {"CPU": WORKER_CPUS, "GPU": 1.0, f"accelerator_type:{gpu_type}": 0.001}


def _train_loop_per_worker(cfg: dict) -> None:
    """What every Ray Train worker runs: bind the session to the driver, call the user's function."""
    import ray

    from sloserve.training import session

    pg = ray.util.get_current_placement_group()
    if pg is not None:  # the gang's GPUs: freed by hand if the run is killed (Ray scopes them to the gateway)
        cfg["control"].placement_group_update.remote(pg.id.hex())
    session._bind(cfg["control"], cfg.get("resume_from"))
    resolve_entry(cfg["entry"])(cfg["config"])
    cfg["control"].worker_done.remote()


def entry_root(entry: str) -> str | None:
    """The directory to put on the workers' PYTHONPATH so they import the entry as this process does."""
    module = entry.partition(":")[0]
    mod = sys.modules.get(module)
    f = getattr(mod, "__file__", None)
    if f is None:
        return None
    p = Path(f).resolve().parent
    for _ in module.split(".")[1:]:
        p = p.parent
    if "__init__.py" in os.listdir(Path(f).parent) and module.count(".") == 0:
        p = p.parent  # a package's own __init__
    return str(p)


class TrainingDriver:
    """Actor body (``ray.remote`` in ``RayLauncher``): runs one Ray Train run of one job."""

    def __init__(self, spec_json: str, job_dir: str, backend: str | None, pythonpath: str | None):
        self.spec = TrainingSpec.model_validate_json(spec_json)
        self.dir = Path(job_dir)
        self.storage = self.dir / "storage"
        self.backend, self.pythonpath = backend, pythonpath
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.pgs: list[str] = []
        self.done = 0
        self._ended = threading.Event()  # run() returned
        self.looping = False  # the function reached its training loop in this run
        prev = _read_status(self.dir)
        self.st: dict[str, Any] = {
            "job_id": self.spec.job_id,
            "status": "running",
            "iteration": prev.get("checkpoint_iteration", 0),
            "checkpoint_iteration": prev.get("checkpoint_iteration", 0),
            "checkpoint": prev.get("checkpoint"),
            "loss": prev.get("loss"),
            "metrics": {},
            "resumed_from": None,
            "corrupt_checkpoints": list(prev.get("corrupt_checkpoints", [])),
            "run": None,
            "error": None,
            "started_at": time.time(),
        }

    # ----------------------------------------------------------- the control board
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        self._stop.set()

    def progress_update(self, iteration: int, metrics: dict) -> None:
        with self._lock:
            self.looping = True  # (sent from the function's first should_stop on)
            self.st["iteration"] = max(iteration, self.st["checkpoint_iteration"])
            self.st["metrics"] = metrics
            if "loss" in metrics:
                self.st["loss"] = metrics["loss"]

    def checkpoint_update(self, iteration: int, metrics: dict) -> None:
        with self._lock:
            self.st["checkpoint_iteration"] = iteration
            self.st["iteration"] = max(self.st["iteration"], iteration)
            self.st["checkpoint"] = f"run-{self.st['run']}/checkpoint_{iteration:010d}"
            if "loss" in metrics:
                self.st["loss"] = metrics["loss"]
            if "eval_loss" in metrics:  # the loss curve the performance model fits
                self.st["eval_loss"] = metrics["eval_loss"]
            self._write()

    def progress(self) -> dict:
        with self._lock:
            return dict(self.st)

    def placement_group_update(self, pg_hex: str) -> None:
        with self._lock:
            if pg_hex not in self.pgs:
                self.pgs.append(pg_hex)

    def mark_preempted(self) -> None:
        self._set(status="preempted")

    def worker_done(self) -> None:
        with self._lock:
            self.done += 1

    def gang_returned(self) -> bool:
        """Every worker's function returned (after a stop request: each saved its checkpoint)."""
        with self._lock:
            return self.done >= self.spec.workers

    def nothing_to_lose(self) -> bool:
        """A stopping run may be ended now without losing work: it has not reached its training loop
        (still starting: nothing done since the checkpoint it resumes from), or the checkpoint it
        saved on the stop (``session.save`` marks it) is in storage and verifies. Ray Train's
        ``report`` persists a checkpoint before its own bookkeeping, so the rest need not be waited for."""
        if not self._stop.is_set():
            return False
        if not self.looping:
            return True
        run = self.st.get("run")
        if run is None:
            return False
        for path in list_checkpoints(self.storage):
            if path.parent.name != f"run-{run}":
                continue
            try:
                good = verify(path)
            except CorruptCheckpoint:  # still being copied in
                continue
            if good.metrics.get("stopping"):
                if self.st["checkpoint_iteration"] < good.iteration:  # rank 0's own word may never come
                    self.checkpoint_update(good.iteration, dict(good.metrics))
                return True
            return False  # the newest of the run verifies and predates the stop
        return False

    def placement_groups(self) -> list[str]:
        with self._lock:
            return list(self.pgs)

    def _write(self) -> None:
        write_json_atomic(self.dir / "status.json", self.st)

    def _set(self, **kw) -> None:
        with self._lock:
            self.st.update(kw)
            self._write()

    # ----------------------------------------------------------- one run
    def ended(self) -> bool:
        """Whether this driver's run is over (``run()`` returned): a handle attached by another
        process, which holds no reference to the run, asks this."""
        return self._ended.is_set()

    def run(self) -> dict:
        try:
            return self._run()
        except Exception as e:  # before fit(): record it where `train list` and the API see it
            self._set(status="failed", error=_error_text(e))
            return self.progress()
        finally:
            self._ended.set()
            threading.Thread(target=_end_self, daemon=True, name="sloserve-driver-end").start()

    def _run(self) -> dict:
        import ray
        from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer

        corrupt: list[str] = []
        good = latest_good(self.storage, lambda p, e: corrupt.append(f"{p.parent.name}/{p.name}: {e}"))
        n = next_run(self.storage)
        ck = good.iteration if good else 0
        seen = self.st["corrupt_checkpoints"]
        self._set(
            run=n,
            resumed_from=ck if good else None,
            iteration=ck,
            checkpoint_iteration=ck,
            checkpoint=f"{good.path.parent.name}/{good.path.name}" if good else None,
            corrupt_checkpoints=seen + [c for c in corrupt if c not in seen],
        )
        # Ray Train 2.x's controller takes each worker's report on its poll (default every 2 s), and a
        # worker's next report waits for the previous one to be taken: with checkpoints less than 2 s
        # apart, the training loop sat up to 2 s in each save, where a preemption cannot reach it.
        # Ray Train passes this variable from here to the controller it starts.
        os.environ.setdefault(HEALTH_CHECK_ENV, str(CONTROLLER_POLL_S))
        # the workers import the entry from where this process found it
        extra: dict[str, Any] = {}
        if self.pythonpath:
            path = os.pathsep.join(p for p in (self.pythonpath, os.environ.get("PYTHONPATH")) if p)
            extra["worker_runtime_env"] = {"env_vars": {"PYTHONPATH": path}}  # added to, not replacing, ours
        trainer = TorchTrainer(
            _train_loop_per_worker,
            train_loop_config={
                "entry": self.spec.entry,
                "config": self.spec.config,
                "control": ray.get_runtime_context().current_actor,
                # Ray Train 2.x restores a new run from a checkpoint the function loads itself
                "resume_from": str(good.path) if good else None,
            },
            torch_config=TorchConfig(backend=self.backend) if self.backend else None,
            scaling_config=ScalingConfig(
                num_workers=self.spec.workers,
                use_gpu=True,
                resources_per_worker=resources_per_worker(self.spec.gpu_type),
            ),
            run_config=RunConfig(
                name=f"run-{n}",
                storage_path=str(self.storage),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
                failure_config=FailureConfig(max_failures=0),
                **extra,
            ),
        )
        try:
            trainer.fit()
        except Exception as e:
            self._set(status="failed", error=_error_text(e))
            return self.progress()
        if self._stop.is_set():
            self._set(status="preempted")
        else:
            self._set(status="finished", finished_at=time.time())
        return self.progress()


def _end_self() -> None:
    """A driver's run is over: end the (detached) actor once its result has been collected."""
    import ray

    time.sleep(LINGER_S)
    try:
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
    except Exception:  # the manager killed it meanwhile
        pass


def _error_text(e: BaseException, lines: int = 20) -> str:
    """The tail of what a failed run raised: Ray Train wraps the worker's own exception and traceback."""
    parts = [traceback_tail(e, lines)]
    for f in (getattr(e, "worker_failures", None) or {}).values():
        parts.append(str(f))
    text = "\n".join(parts)
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _read_status(job_dir: Path) -> dict:
    import json

    p = job_dir / "status.json"
    try:
        return json.loads(p.read_text()) if p.exists() else {}
    except ValueError:
        return {}


def gpus_free(gpu_type: str, n: int) -> bool:
    import ray

    av = ray.available_resources()
    return av.get("GPU", 0.0) + 1e-6 >= n and av.get(f"accelerator_type:{gpu_type}", 0.0) + 1e-9 >= 0.001 * n


class RayJobHandle:
    """A run's driver actor. ``run_ref``: its ``run()`` result, held by the process that started it;
    None for a handle attached by another process (``RayLauncher.attach``), which asks the actor."""

    def __init__(self, spec: TrainingSpec | None, actor, run_ref=None):
        self.spec, self.actor, self.run_ref = spec, actor, run_ref

    @property
    def actor_id(self) -> str:
        return self.actor._actor_id.hex()

    def _ended(self, timeout_s: float) -> bool | None:
        """True: the run is over (or its driver is dead); False: it runs; None: no answer in time."""
        import ray

        if self.run_ref is not None:
            return bool(ray.wait([self.run_ref], timeout=0)[0])
        try:
            return bool(ray.get(self.actor.ended.remote(), timeout=timeout_s))
        except ray.exceptions.GetTimeoutError:
            return None
        except Exception:  # RayActorError: the driver is dead
            return True

    def alive(self) -> bool:
        return self._ended(1.0) is not True  # (a driver too busy to answer is still running)

    def release(self) -> None:
        """End the driver of a run that is over (it ends itself; this makes sure)."""
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:
            pass

    def progress(self, timeout_s: float = 0.2) -> dict | None:
        import ray

        try:
            return ray.get(self.actor.progress.remote(), timeout=timeout_s)
        except Exception:
            return None

    def preempt(self, grace_s: float) -> PreemptOutcome:
        import ray

        def stopped_within(t: float) -> bool:
            # the gang's functions returned, or it has nothing to lose (still starting, or its stop
            # checkpoint is in storage):
            # Ray Train's own orderly shutdown of the run takes seconds more, so the kill cuts it short
            deadline = time.monotonic() + t
            while True:
                if self._ended(0.05):
                    return True
                try:
                    left = max(0.05, deadline - time.monotonic())
                    if ray.get(self.actor.gang_returned.remote(), timeout=left) or ray.get(
                        self.actor.nothing_to_lose.remote(), timeout=left
                    ):
                        return True
                except Exception:
                    pass
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)

        pgs: list[str] = []

        def kill() -> None:
            try:
                pgs.extend(ray.get(self.actor.placement_groups.remote(), timeout=1.0))
            except Exception:
                pass
            ray.kill(self.actor, no_restart=True)
            release_placement_groups(pgs)

        outcome = preempt_then_kill(lambda: self.actor.request_stop.remote(), stopped_within, kill, grace_s)
        if outcome == "checkpointed":
            self._mark_stopped()
            kill()
        return outcome

    def _mark_stopped(self) -> None:
        import ray

        try:
            ray.get(self.actor.mark_preempted.remote(), timeout=1.0)
        except Exception:
            pass


def release_placement_groups(pg_hexes: list[str]) -> None:
    """Remove a killed run's placement groups: Ray would keep them (and their GPUs) until the
    process that started Ray exits; removing one also ends the worker actors in it."""
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    for h in pg_hexes:
        if placement_group_table().get(h, {}).get("state") in (None, "REMOVED"):
            continue
        try:
            remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(h)))
        except Exception:  # already removed by Ray Train's own shutdown
            pass


class RayLauncher:
    """Starts each job's ``TrainingDriver`` on the connected Ray cluster (``ray.init`` first).

    ``backend``: the torch.distributed backend (``gloo`` for emulated GPUs on a CPU box; None lets
    Ray Train choose, NCCL on GPUs)."""

    name = "ray"

    def __init__(self, backend: str | None = None):
        self.backend = backend

    def check(self, spec: TrainingSpec) -> None:
        """Refuse a job the cluster can never run: more GPUs of its type than it has, or an entry
        that does not import here."""
        import ray

        total = ray.cluster_resources()
        if total.get(f"accelerator_type:{spec.gpu_type}", 0.0) <= 0:
            have = sorted(k.split(":", 1)[1] for k in total if k.startswith("accelerator_type:"))
            raise JobRejected(f"the cluster has no {spec.gpu_type} GPUs (it has: {', '.join(have) or 'none'})")
        gpus = int(total.get("GPU", 0))
        if spec.workers > gpus:
            raise JobRejected(f"job {spec.job_id} asks for {spec.workers} GPUs; the cluster has {gpus}")
        resolve_entry(spec.entry)

    def start(self, spec: TrainingSpec, job_dir: Path) -> RayJobHandle:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        resolve_entry(spec.entry)
        name = actor_name(spec.job_id)
        try:  # the driver of an earlier run that has not ended itself yet
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
            _wait_gone(name)
        except ValueError:
            pass
        cls = ray.remote(TrainingDriver)
        actor: Any = cls.options(
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",  # the run outlives this process: any gateway process attaches to it
            num_cpus=0,
            max_concurrency=8,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
        ).remote(spec.model_dump_json(), str(job_dir), self.backend, entry_root(spec.entry))
        return RayJobHandle(spec, actor, actor.run.remote())

    def attach(self, record: dict) -> RayJobHandle | None:
        """The driver of the job's run, found by name (None when there is none: its run is over)."""
        import ray

        try:
            actor = ray.get_actor(actor_name(record["job_id"]), namespace=NAMESPACE)
        except (KeyError, ValueError):
            return None
        return RayJobHandle(None, actor)


def _wait_gone(name: str, timeout_s: float = 10.0) -> None:
    """Until no live actor has the name (a killed one gives it up once it is dead)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.02)
