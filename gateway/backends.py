"""Backends run whole batches on replicas: in the gateway process, or on Ray Serve.

The interface is the batcher's :class:`~batching.batcher.BatchRunner` plus life-cycle calls, so
the Ray backend crosses into Ray once per batch, never once per request.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np

from batching.batcher import RunResult
from models.repository import ModelRepository
from models.runtime import Replica, RuntimeOptions, device_type


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
    """

    name = "inprocess"

    def __init__(self, repo: ModelRepository, opts: RuntimeOptions, instances: int = 1,
                 inline_below_s: float = 0.0):
        self.repo = repo
        self.opts = opts
        self.instances = instances
        self.inline_below_s = inline_below_s
        self.device_type = device_type(opts.device)
        self._replicas: dict[tuple[str, str], list[Replica]] = {}
        self._free: dict[tuple[str, str], list[Replica]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._ready = False
        self._fast: dict[tuple[str, str], bool] = {}

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        total = sum(len(m.config.variants) for m in self.repo.models.values()) * self.instances
        self._pool = ThreadPoolExecutor(max_workers=max(2, total), thread_name_prefix="ort")
        for name, model in self.repo.models.items():
            outs = [o.name for o in model.config.outputs]
            for v in model.config.variants:
                reps = []
                for _ in range(self.instances):
                    reps.append(await loop.run_in_executor(
                        self._pool, Replica, model.onnx_path(v.name), self.opts, outs))
                self._replicas[(name, v.name)] = reps
                self._free[(name, v.name)] = list(reps)
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
        return len(self._replicas.get((model, variant), ()))

    async def run(self, model: str, variant: str, inputs: dict[str, np.ndarray],
                  timeout_s: float | None = None) -> RunResult:
        """``timeout_s`` is ignored: an ORT call in this process cannot be abandoned half-way."""
        key = (model, variant)
        free = self._free[key]
        rep = free.pop() if free else self._replicas[key][0]
        try:
            t0 = time.perf_counter()
            if self._fast[key]:
                outputs = rep.run(inputs)
            else:
                outputs = await asyncio.get_running_loop().run_in_executor(self._pool, rep.run, inputs)
            return RunResult(outputs, time.perf_counter() - t0, self.device_type)
        finally:
            free.append(rep)
