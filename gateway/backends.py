"""Backends run whole batches on replicas: in the gateway process, or on Ray Serve.

The interface is the batcher's :class:`~batching.batcher.BatchRunner` plus life-cycle calls, so
the Ray backend crosses into Ray once per batch, never once per request.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np

from batching.batcher import RunResult
from gateway.errors import DeadlineExceeded
from models.repository import ModelRepository
from models.runtime import Replica, RuntimeOptions, device_type


class ModelLoadError(RuntimeError):
    """A model file cannot be loaded: the server refuses to start, naming the file (it serves its
    whole repository or nothing, so a broken model is never hidden behind a half-ready server)."""


def find_bad_onnx(root: Path) -> ModelLoadError | None:
    """Parse every ``<root>/<model>/<variant>/model.onnx`` (graph only, no external data); the
    first that does not parse, as an error naming it, else None."""
    import onnx

    for path in sorted(Path(root).glob("*/*/model.onnx")):
        try:
            m = onnx.load(str(path), load_external_data=False)
            if m.ir_version <= 0 or not m.graph.node:
                raise ValueError("no ir_version or an empty graph (an empty or foreign file?)")
        except Exception as e:  # noqa: BLE001 - any parse failure is the file's
            return ModelLoadError(f"model file {path} cannot be loaded ({type(e).__name__}: {e}); "
                                  f"replace it (e.g. `sloserve models build`) or remove its model")
    return None


class Backend(Protocol):
    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def ready(self) -> bool: ...

    def slots(self, model: str, variant: str) -> int: ...

    async def run(self, model: str, variant: str, inputs: dict[str, np.ndarray],
                  timeout_s: float | None = None) -> RunResult: ...


class InProcessBackend:
    """``instances`` ONNX Runtime sessions per (model, variant) in this process.

    Batches run in a thread pool (ORT releases the GIL), so the event loop keeps decoding
    requests while a batch computes. Batches whose predicted compute is below
    ``inline_below_s`` run on the loop itself: a thread hand-off costs more than they do.

    ``fault_delay_s`` (chaos drills, per model) holds every batch of that model this long before
    computing, like the Ray replicas' knob. A batch that runs in the thread pool is bounded by
    the batcher's ``timeout_s`` and by ``batch_timeout_s`` (504 past it); ORT itself cannot be
    stopped half-way, so an abandoned call finishes in its thread (ORT sessions run concurrently).

    ``pipeline_depth`` batches may be in flight per replica: the second waits in its pool thread
    on the replica's lock and starts the moment the first ends, so ORT goes from batch to batch
    without waiting for the event loop to see a result and hand over the next batch. One
    replica still computes one batch at a time; ``compute_s`` is the time under the lock.
    """

    name = "inprocess"
    round_trip_latency = False  # calibrate on compute: the thread hand-off is tens of microseconds

    def __init__(self, repo: ModelRepository, opts: RuntimeOptions, instances: int = 1,
                 inline_below_s: float = 0.0, fault_delay_s: dict[str, float] | None = None,
                 batch_timeout_s: float | None = None, pipeline_depth: int = 1):
        self.repo = repo
        self.pipeline_depth = max(1, pipeline_depth)
        self.fault_delay_s = {m: d for m, d in (fault_delay_s or {}).items() if d > 0}
        self.batch_timeout_s = batch_timeout_s
        self.opts = opts
        self.instances = instances
        self.inline_below_s = inline_below_s
        self.device_type = device_type(opts.device)
        self._replicas: dict[tuple[str, str], list[Replica]] = {}
        self._load: dict[tuple[str, str], list[int]] = {}  # batches in flight per replica
        self._locks: dict[int, threading.Lock] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._ready = False
        self._fast: dict[tuple[str, str], bool] = {}

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        total = sum(len(m.config.variants) for m in self.repo.models.values()) * self.instances
        self._pool = ThreadPoolExecutor(max_workers=max(2, total * self.pipeline_depth), thread_name_prefix="ort")
        for name, model in self.repo.models.items():
            outs = [o.name for o in model.config.outputs]
            for v in model.config.variants:
                reps = []
                for _ in range(self.instances):
                    try:
                        reps.append(await loop.run_in_executor(
                            self._pool, Replica, model.onnx_path(v.name), self.opts, outs))
                    except Exception as e:  # noqa: BLE001 - ORT's message names what is wrong
                        raise ModelLoadError(f"model '{name}' variant '{v.name}': {model.onnx_path(v.name)} "
                                             f"cannot be loaded: {e}") from None
                self._replicas[(name, v.name)] = reps
                self._load[(name, v.name)] = [0] * len(reps)
                for r in reps:
                    self._locks[id(r)] = threading.Lock()
                self._fast[(name, v.name)] = self._probe_fast(reps[0], model)
        self._ready = True

    def _probe_fast(self, rep: Replica, model) -> bool:
        if self.inline_below_s <= 0:
            return False
        from gateway.types import V2_TO_NUMPY

        feeds = {t.name: np.zeros((1, *[max(d, 1) for d in t.shape]), V2_TO_NUMPY[t.datatype])
                 for t in model.config.inputs}
        rep.run(feeds)
        t0 = time.perf_counter()
        for _ in range(5):
            rep.run(feeds)
        return (time.perf_counter() - t0) / 5 < self.inline_below_s

    async def stop(self) -> None:
        self._ready = False
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def ready(self) -> bool:
        return self._ready

    def device_type_of(self, model: str) -> str:
        return self.device_type

    def slots(self, model: str, variant: str) -> int:
        return len(self._replicas.get((model, variant), ())) * self.pipeline_depth

    async def run(self, model: str, variant: str, inputs: dict[str, np.ndarray],
                  timeout_s: float | None = None) -> RunResult:
        """Inline batches (predicted under ``inline_below_s``) ignore ``timeout_s``; pooled ones
        fail with 504 once ``timeout_s`` (or ``batch_timeout_s``) has passed."""
        key = (model, variant)
        load = self._load[key]
        i = min(range(len(load)), key=load.__getitem__)  # the replica with the fewest batches in flight
        rep = self._replicas[key][i]
        load[i] += 1
        try:
            t0 = time.perf_counter()
            delay = self.fault_delay_s.get(model)
            if self._fast[key] and not delay:
                outputs = rep.run(inputs)
                compute_s = time.perf_counter() - t0
            else:
                limits = [t for t in (timeout_s, self.batch_timeout_s) if t is not None]
                try:
                    outputs, compute_s = await asyncio.wait_for(self._pooled(rep, inputs, delay),
                                                                min(limits) if limits else None)
                except asyncio.TimeoutError:
                    raise DeadlineExceeded(
                        f"the batch on '{model}/{variant}' was not back {min(limits):.2f} s after dispatch "
                        f"(past its requests' deadlines plus late_grace_s, or batch_timeout_s); retry, "
                        f"or raise slo_ms") from None
            return RunResult(outputs, compute_s, self.device_type)
        finally:
            load[i] -= 1

    async def _pooled(self, rep: Replica, inputs: dict[str, np.ndarray], delay: float | None):
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._locked_run, rep, inputs, delay)

    def _locked_run(self, rep: Replica, inputs: dict[str, np.ndarray],
                    delay: float | None = None) -> tuple[dict[str, np.ndarray], float]:
        """In a pool thread: one batch at a time per replica. The time under the lock is the batch's
        service time, the chaos drill's delay included (the replica is busy while it sleeps, as a
        Ray replica is), the wait for the lock excluded."""
        with self._locks[id(rep)]:
            t0 = time.perf_counter()
            if delay:
                time.sleep(delay)  # chaos drill: a batch that takes long
            out = rep.run(inputs)
            return out, time.perf_counter() - t0
