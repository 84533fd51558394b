"""The in-process backend: replicas in the gateway's own process, in a thread pool, or (with
``replica_processes``) in worker processes of their own (sloserve/gateway/backends/processes.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from sloserve.batching.batcher import RunResult
from sloserve.batching.options import OptionPlan, split_key
from sloserve.batching.profile import Curve, ProfileTable
from sloserve.gateway import tracing
from sloserve.gateway.backends.base import BackendBase, ModelLoadError
from sloserve.gateway.backends.options import model_plan
from sloserve.gateway.errors import DeadlineExceeded
from sloserve.models.repository import LoadedModel, ModelRepository
from sloserve.replica.runtime import Replica, RuntimeOptions, device_type, gpu_present, wait_out_profile

log = logging.getLogger("sloserve.backend")

EMULATED = "emulated"  # the provider label of an emulated device type's replicas


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceSpec:
    """One configured device type of a model, as this host serves it in-process: ``name`` as profiles
    name it, ``session`` the ONNX Runtime device (``cpu`` or ``cuda``), ``emulated`` when this host
    has no such device (the replica runs the real session, then waits out the pair's profile)."""

    name: str
    session: str
    emulated: bool


def resolve_device(configured: str) -> DeviceSpec:
    """``cpu`` (or this host's CPU slug) is a real CPU session; ``cuda`` (or this host's GPU name) a
    real CUDA session, which needs a GPU; any other type is emulated on the CPU."""
    n = configured.strip().lower()
    host_cpu = device_type("cpu")
    if n in ("cpu", host_cpu):
        return DeviceSpec(host_cpu, "cpu", False)
    if n == "cuda":
        if not gpu_present():
            raise ModelLoadError("device type 'cuda' needs a GPU and onnxruntime-gpu; this host has none")
        return DeviceSpec(device_type("cuda"), "cuda", False)
    if gpu_present() and n == device_type("cuda"):
        return DeviceSpec(n, "cuda", False)
    return DeviceSpec(n, "cpu", True)


def instances_of(model: LoadedModel | None, default: int) -> int:
    """Replicas per variant: a Triton model's ``instance_group`` counts, else the server's ``instances``."""
    triton = model.triton if model is not None else None
    return (triton.replicas() if triton is not None else None) or default


def opts_of(model: LoadedModel | None, opts: RuntimeOptions) -> RuntimeOptions:
    """The model's runtime options: on the CPU for a Triton model whose instance groups are all KIND_CPU."""
    triton = model.triton if model is not None else None
    if triton is not None and triton.on_cpu() and opts.device != "cpu":
        return dataclasses.replace(opts, device="cpu")
    return opts


class InProcessBackend(BackendBase):
    """``instances`` ONNX Runtime sessions per (model, variant) in this process.

    Batches run in a thread pool (ORT releases the GIL), so the event loop keeps decoding
    requests while a batch computes. Batches whose predicted compute is below
    ``inline_below_s`` run on the loop itself: a thread hand-off costs more than they do.

    ``fault_delay_s`` (chaos drills, per model) holds every batch of that model this long before
    computing, like the Ray replicas' knob. A batch that runs in the thread pool is bounded by
    the batcher's ``timeout_s`` and by ``batch_timeout_s`` (504 past it); ORT itself cannot be
    stopped half-way, so an abandoned call finishes in its thread (ORT sessions run concurrently).

    A pooled batch takes a free replica of its (model, variant) from a queue in its pool thread,
    so one replica computes one batch at a time and a waiting batch goes to whichever replica
    frees first (what the ``slo`` policy predicts). With ``pipeline_depth`` 2 the batcher may
    hand over a second batch per replica: it waits in its thread and starts the moment a replica
    frees, so ORT goes from batch to batch without waiting for the event loop to see a result
    and hand over the next one. ``compute_s`` is the time on the replica (the chaos drill's
    delay included, the wait for a replica excluded). A batch abandoned before it reached a
    replica (its timeout passed, or it was cancelled) is skipped, never run late.

    A model in ``device_types`` (two or more) has sessions per serving option (variant, device
    type), keyed as ``sloserve.batching.options`` spells them; a type this host lacks is emulated
    (:func:`resolve_device`): its replica runs the real session, then sleeps until the pair's
    profiled median at that batch size has passed, and says so (provider ``emulated``).

    A model in ``shared`` has replicas that hold all of its variants: replica ``i`` is the ``i``-th
    session of every variant, and one free queue per model hands out replica indices, so a batch of
    any variant occupies the whole replica (``shared(model)`` tells the batcher).
    """

    name = "inprocess"
    round_trip_latency = False  # calibrate on compute: the thread hand-off is tens of microseconds

    def __init__(
        self,
        repo: ModelRepository,
        opts: RuntimeOptions,
        instances: int = 1,
        inline_below_s: float = 0.0,
        fault_delay_s: dict[str, float] | None = None,
        batch_timeout_s: float | None = None,
        pipeline_depth: int = 1,
        processes: bool = False,
        shared: set[str] | None = None,
        device_types: dict[str, list[str]] | None = None,
        device_cost: dict[str, float] | None = None,
        slo_ms: dict[str, float] | None = None,
    ):
        self.repo = repo
        self.device_cost = dict(device_cost or {})  # price per device type: the order types serve in
        self.slo_ms = dict(slo_ms or {})  # models' slo_ms overrides (the throughput table's SLO)
        self.device_types = {m: ts for m, ts in (device_types or {}).items() if len(ts) > 1}
        if self.device_types and processes:
            raise ValueError("several device_types per model are not supported with replica_processes")
        self._plans: dict[str, tuple[OptionPlan, dict[str, DeviceSpec]]] = {}  # computed on first ask
        self._devices: dict[tuple[str, str], DeviceSpec] = {}  # (model, option key) -> its device
        self._emulated: dict[tuple[str, str], Curve] = {}  # (model, option key) -> the profile it waits out
        # what it serves; the repository API changes it (no repository: a unit test installs replicas itself)
        self.models: dict[str, LoadedModel] = dict(repo.models) if repo is not None else {}
        self._shared = set(shared or ())
        if self._shared and processes:
            raise ValueError("shared replicas are not supported with worker processes")
        self.processes = processes  # replicas compute in worker processes (sloserve/gateway/backends/processes.py)
        self._workers: dict[tuple[str, str], list] = {}
        self.pipeline_depth = max(1, pipeline_depth)
        self.fault_delay_s = {m: d for m, d in (fault_delay_s or {}).items() if d > 0}
        self.batch_timeout_s = batch_timeout_s
        self.opts = opts
        self.instances = instances
        self.inline_below_s = inline_below_s
        self.device_type = device_type(opts.device)
        self._replicas: dict[tuple[str, str], list[Replica]] = {}
        self._free_q: dict[tuple[str, str], queue.SimpleQueue] = {}  # indices of replicas free to take a batch
        self._pool: ThreadPoolExecutor | None = None
        self._ready = False
        self._fast: dict[tuple[str, str], bool] = {}

    async def start(self) -> None:
        self._pool = self._new_pool(self._pool_slots())
        if self.processes:
            await self._start_workers(self.models)
        else:
            for name, model in self.models.items():
                await self._load_sessions(name, model)
        for name in self.models:
            self._report(name)
        self._ready = True

    def _pool_slots(self) -> int:
        """Replica keys over every model: variants, times device types for a model on several."""
        return sum(len(m.config.variants) * max(1, len(self.device_types.get(n, ()))) for n, m in self.models.items())

    def _new_pool(self, variants: int) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(
            max_workers=max(
                2,
                variants
                * max([self.instances, *(instances_of(m, self.instances) for m in self.models.values())])
                * self.pipeline_depth,
            ),
            thread_name_prefix="ort",
        )

    async def _load_sessions(self, name: str, model: LoadedModel) -> None:
        outs = [o.name for o in model.config.outputs]
        if name in self.device_types:
            await self._load_options(name, model, outs)
            return
        for v in model.config.variants:
            reps = await self._sessions(name, model, v.name, outs, instances_of(self.models.get(name), self.instances))
            self._install(name, v.name, reps)
            # a shared replica's batches all go through its free queue (none inline on the loop)
            self._fast[(name, v.name)] = name not in self._shared and self._probe_fast(reps[0], model)

    def _plan(self, name: str, model: LoadedModel) -> tuple[OptionPlan, dict[str, DeviceSpec]]:
        """The model's options from its profiles (once: the data plane asks before the sessions load)."""
        known = self._plans.get(name)
        if known is not None:
            return known
        specs = {}
        for configured in self.device_types[name]:
            spec = resolve_device(configured)
            specs[spec.name] = spec
        table = ProfileTable.load(self.repo.root) if self.repo is not None else ProfileTable({})
        cost = {}
        for t, c in self.device_cost.items():
            try:
                cost[resolve_device(t).name] = c
            except ModelLoadError:  # cuda on a host without one: no option of that type here
                pass
        plan = model_plan(table, model.config, list(specs), self.slo_ms.get(name, model.config.slo_ms), cost)
        for key in plan.served:
            variant, dev = split_key(key, "")
            if specs[dev].emulated:
                curve = table.curves.get((name, variant, dev))
                if curve is None:
                    raise ModelLoadError(
                        f"model '{name}' variant '{variant}': device type '{dev}' is emulated on this host and "
                        f"needs its profile, {name}/{variant}/profiles/{dev}.json in the repository"
                    )
                self._emulated[(name, key)] = curve
        self._plans[name] = (plan, specs)
        return plan, specs

    async def _load_options(self, name: str, model: LoadedModel, outs: list[str]) -> None:
        """Sessions per serving option of a model on several device types (a dominated one too: it
        serves the requests that pin its variant)."""
        plan, specs = self._plan(name, model)
        for key in plan.served:
            variant, dev = split_key(key, "")
            spec = specs[dev]
            self._devices[(name, key)] = spec
            opts = dataclasses.replace(self.opts, device=spec.session)
            reps = await self._sessions(
                name, model, variant, outs, instances_of(self.models.get(name), self.instances), opts
            )
            self._install(name, key, reps)
            self._fast[(name, key)] = not spec.emulated and self._probe_fast(reps[0], model)
            if spec.emulated:
                log.info("model %s: %s is emulated (a CPU session, then the profile's median time)", name, key)

    def options_of(self, model: str) -> OptionPlan | None:
        if model not in self.device_types or model not in self.models:
            return None
        return self._plan(model, self.models[model])[0]

    async def add_model(self, model: LoadedModel, deploy: bool = True) -> None:
        """Load ``model``'s replicas while serving (the repository API); its old ones, if any, are gone
        (:meth:`remove_model`). The thread pool grows to hold its batches too."""
        name = model.config.name
        self.models[name] = model
        pool = self._pool
        self._pool = self._new_pool(self._pool_slots())
        if pool is not None:
            pool.shutdown(wait=False)  # batches already handed to it finish there
        try:
            if self.processes:
                await self._start_workers({name: model})
            else:
                await self._load_sessions(name, model)
        except BaseException:
            await self.remove_model(name)
            raise
        self._report(name)

    async def remove_model(self, name: str, delete: bool = True) -> None:
        """Drop ``name``'s replicas (its batcher has drained: no batch of it is in flight)."""
        model = self.models.pop(name, None)
        keys = [k for k in set(self._replicas) | set(self._workers) if k[0] == name]
        await asyncio.gather(*(w.stop() for k in keys for w in self._workers.get(k, ())))
        for k in keys:
            self._replicas.pop(k, None)
            self._workers.pop(k, None)
            self._free_q.pop(k, None)
            self._fast.pop(k, None)
        known = self._plans.pop(name, None)
        if known is not None:
            for key in known[0].served:
                variant, dev = split_key(key, "")
                self._report_replicas(name, variant, dev, "running", 0)
                self._devices.pop((name, key), None)
                self._emulated.pop((name, key), None)
        elif model is not None:
            for v in model.config.variants:
                self._report_replicas(name, v.name, self.device_type, "running", 0)

    def _report(self, name: str) -> None:
        """A model's replica counts to the gauge, once: they are fixed while it is loaded. A shared
        model's replicas hold every variant: counted once, under its most accurate one."""
        model = self.models[name]
        ranked = [v.name for v in model.config.variants_by_accuracy]
        plan = self.options_of(name)
        if plan is not None:  # per option: the gauge's (variant, device type); runtimes per variant
            for v in ranked:
                runtimes = []
                for key in plan.of_variant(v, pinned=True):
                    spec = self._devices[(name, key)]
                    self._report_replicas(name, v, spec.name, "running", self.replica_count(name, key))
                    runtimes += [
                        (spec.name, EMULATED) if spec.emulated else (r.device, r.provider)
                        for r in self._replicas.get((name, key), ())
                    ]
                self._report_runtime(name, v, runtimes)
            return
        for v in ranked[:1] if name in self._shared else ranked:
            self._report_replicas(name, v, self.device_type, "running", self.replica_count(name, v))
        for v in ranked:
            runtimes = [(r.device, r.provider) for r in self._replicas.get((name, v), ())]
            runtimes += [rt for w in self._workers.get((name, v), ()) if (rt := w.runtime) is not None]
            self._report_runtime(name, v, runtimes)

    def _install(self, model: str, variant: str, reps: list, free_q=None) -> None:
        """Make ``reps`` the replicas of (model, variant), free. A shared model's variants share one queue
        of replica indices (made with its first variant), so a batch of any variant takes the replica."""
        if model in self._shared:
            first = next((k for k in self._free_q if k[0] == model), None)
            if first is not None:
                if len(reps) != len(self._replicas[first]):
                    raise ValueError(f"shared model '{model}': every variant needs the same number of replicas")
                self._replicas[(model, variant)] = reps
                self._free_q[(model, variant)] = self._free_q[first]
                return
        self._replicas[(model, variant)] = reps
        q = free_q if free_q is not None else queue.SimpleQueue()  # (free_q: a test's own queue)
        for i in range(len(reps)):
            q.put(i)
        self._free_q[(model, variant)] = q

    async def _start_workers(self, models: dict[str, LoadedModel]) -> None:
        """A worker process per replica, except for a variant whose batches are tiny (under
        ``inline_below_s``): it stays an ORT session on the loop, as without workers, since a trip
        through a worker's socket costs the loop more than computing such a batch does. A variant
        whose profile for this device says it is not tiny (p50 at one row) goes to workers without
        being loaded here; one without such a profile is loaded and probed, as without workers."""
        from sloserve.batching.profile import ProfileTable
        from sloserve.gateway.backends.processes import ProcessReplica

        started = []
        profiles = ProfileTable.load(self.repo.root) if self.inline_below_s > 0 else None
        for name, model in models.items():
            outs = [o.name for o in model.config.outputs]
            for v in model.config.variants:
                curve = profiles.curves.get((name, v.name, self.device_type)) if profiles is not None else None
                maybe_tiny = (
                    profiles is not None
                    and name not in self.fault_delay_s
                    and (curve is None or curve.at(1, "p50") < self.inline_below_s)
                )
                if maybe_tiny:  # probe it here (no worker is started yet); as many sessions as without workers
                    reps = await self._sessions(name, model, v.name, outs, 1)
                    if self._probe_fast(reps[0], model):
                        reps += await self._sessions(
                            name, model, v.name, outs, instances_of(self.models.get(name), self.instances) - 1
                        )
                        self._install(name, v.name, reps)
                        self._fast[(name, v.name)] = True
                        continue
                self._workers[(name, v.name)] = [
                    ProcessReplica(
                        model.onnx_path(v.name),
                        opts_of(self.models.get(name), self.opts),
                        outs,
                        f"{name}/{v.name}#{i}",
                        self.fault_delay_s.get(name),
                    )
                    for i in range(instances_of(self.models.get(name), self.instances))
                ]
                self._fast[(name, v.name)] = False
                started += [(name, v.name, model, w) for w in self._workers[(name, v.name)]]
        results = await asyncio.gather(*(w.start() for *_, w in started), return_exceptions=True)
        for (name, variant, model, _), r in zip(started, results, strict=False):
            if isinstance(r, BaseException):
                await asyncio.gather(*(w.stop() for *_, w in started))
                raise ModelLoadError(
                    f"model '{name}' variant '{variant}': {model.onnx_path(variant)} cannot be loaded: {r}"
                ) from None

    async def _run_on_worker(
        self, key: tuple[str, str], inputs: dict[str, np.ndarray], limit: float | None
    ) -> tuple[dict[str, np.ndarray] | None, float]:
        live = [w for w in self._workers[key] if w.available]
        if not live:
            from sloserve.gateway.backends.processes import WorkerGone

            raise WorkerGone(
                f"no worker of '{key[0]}/{key[1]}' is up (being started again); retry shortly", retry_after_s=1.0
            )
        worker = min(live, key=lambda w: w.in_flight)
        return await worker.run(inputs, limit)

    async def _sessions(
        self, name: str, model, variant: str, outs: list[str], n: int, opts: RuntimeOptions | None = None
    ) -> list[Replica]:
        """``n`` ORT sessions of (``name``, ``variant``), built in the pool; a file ORT cannot load is a
        :class:`ModelLoadError` naming it."""
        loop = asyncio.get_running_loop()
        reps = []
        for _ in range(n):
            try:
                reps.append(
                    await loop.run_in_executor(
                        self._pool,
                        Replica,
                        model.onnx_path(variant),
                        opts or opts_of(self.models.get(name), self.opts),
                        outs,
                    )
                )
            except Exception as e:
                raise ModelLoadError(
                    f"model '{name}' variant '{variant}': {model.onnx_path(variant)} cannot be loaded: {e}"
                ) from None
        return reps

    def _probe_fast(self, rep: Replica, model) -> bool:
        if self.inline_below_s <= 0:
            return False
        from sloserve.gateway.types import V2_TO_NUMPY

        feeds = {
            t.name: np.zeros((1, *[max(d, 1) for d in t.shape]), V2_TO_NUMPY[t.datatype]) for t in model.config.inputs
        }
        rep.run(feeds)
        t0 = time.perf_counter()
        for _ in range(5):
            rep.run(feeds)
        return (time.perf_counter() - t0) / 5 < self.inline_below_s

    async def stop(self) -> None:
        self._ready = False
        await asyncio.gather(*(w.stop() for ws in self._workers.values() for w in ws))
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def ready(self) -> bool:
        return self._ready

    def device_type_of(self, model: str) -> str:
        plan = self.options_of(model)
        if plan is not None:
            return plan.device_types()[0]
        return device_type("cpu") if opts_of(self.models.get(model), self.opts) is not self.opts else self.device_type

    def replica_count(self, model: str, variant: str) -> int:
        """Replicas (ORT sessions or worker processes), not batch slots."""
        key = (model, variant)
        workers = self._workers.get(key)
        return len(workers) if workers else len(self._replicas.get(key, []))

    def slots(self, model: str, variant: str) -> int:
        return self.replica_count(model, variant) * self.pipeline_depth

    def shared(self, model: str) -> bool:
        """Whether ``model``'s replicas hold all its variants (its slots are one set, under every variant)."""
        return model in self._shared

    async def run(
        self, model: str, variant: str, inputs: dict[str, np.ndarray], timeout_s: float | None = None
    ) -> RunResult:
        """Inline batches (predicted under ``inline_below_s``) ignore ``timeout_s``; pooled ones
        fail with 504 once ``timeout_s`` (or ``batch_timeout_s``) has passed."""
        key = (model, variant)
        t0 = time.perf_counter()
        delay = self.fault_delay_s.get(model)
        spec = self._devices.get(key)
        dev = spec.name if spec is not None else self.device_type
        if self._fast[key] and not delay:  # tiny: on the loop (ORT sessions may run concurrently)
            out = self._replicas[key][0].run(inputs)
            compute_s = time.perf_counter() - t0
            if tracing.TRACER is not None:  # a traced batch's compute span, in this process
                tracing.local_compute(model, variant, next(iter(inputs.values())).shape[0], compute_s, dev)
            return RunResult(out, compute_s, dev)
        limits = [t for t in (timeout_s, self.batch_timeout_s) if t is not None]
        limit = min(limits) if limits else None
        abandoned = threading.Event()
        pooled: Awaitable[tuple[dict[str, np.ndarray] | None, float]]
        try:
            if self.processes:
                pooled = self._run_on_worker(key, inputs, limit)
            else:
                pooled = asyncio.get_running_loop().run_in_executor(
                    self._pool, self._on_free_replica, key, inputs, delay, abandoned
                )
            outputs, compute_s = await asyncio.wait_for(pooled, limit)
            if outputs is None:  # the worker skipped it: its deadline had passed before it started
                raise TimeoutError
        except TimeoutError:
            abandoned.set()
            raise DeadlineExceeded(
                f"the batch on '{model}/{variant}' was not back {limit:.2f} s after dispatch "
                f"(past its requests' deadlines plus late_grace_s, or batch_timeout_s); retry, "
                f"or raise slo_ms"
            ) from None
        except asyncio.CancelledError:
            abandoned.set()
            raise
        if tracing.TRACER is not None and not self.processes:  # (a worker process records its own)
            tracing.local_compute(model, variant, next(iter(inputs.values())).shape[0], compute_s, dev)
        return RunResult(outputs, compute_s, dev)

    def _on_free_replica(
        self, key: tuple[str, str], inputs: dict[str, np.ndarray], delay: float | None, abandoned: threading.Event
    ) -> tuple[dict[str, np.ndarray] | None, float]:
        """In a pool thread: wait for a free replica of ``key``, run the batch on it, free it."""
        free = self._free_q[key]
        i = free.get()
        try:
            if abandoned.is_set():  # its caller gave up while it waited: do not run it late
                return None, 0.0
            t0 = time.perf_counter()
            if delay:
                time.sleep(delay)  # chaos drill: the replica is busy this long, as a Ray replica would be
            out = self._replicas[key][i].run(inputs)
            curve = self._emulated.get(key)
            if curve is not None:
                wait_out_profile(curve, t0, inputs)
            return out, time.perf_counter() - t0
        finally:
            free.put(i)
