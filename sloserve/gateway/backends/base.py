"""The execution backends' seam: one declared Protocol, and the defaults every backend starts from.

A backend runs whole batches on replicas: in the gateway's process (``threads``, with worker
``processes`` optionally) or on Ray Serve (``ray``). The interface is the batcher's
:class:`~sloserve.batching.batcher.BatchRunner` plus life-cycle calls and the capabilities the data plane
reads, all declared here: callers never probe a backend for what it has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sloserve.batching.batcher import BatchRunner
from sloserve.batching.options import OptionPlan
from sloserve.models.repository import LoadedModel


class ModelLoadError(RuntimeError):
    """A model cannot be loaded, naming the file or setting: at start-up the server refuses to start
    (it starts with its whole repository or not at all, so a broken model is never hidden behind a
    half-ready server); a load through the repository API answers 400 and serves the others."""


ReplicaHook = Callable[[str, str, str, str, int], None]  # (model, variant, device type, state, count)
RuntimeHook = Callable[[str, str, str, str, int], None]  # (model, variant, device, provider, count)
CapacityHook = Callable[[str], None]  # (model): its slots changed outside a batch's end
HeldHook = Callable[[str, str, int], None]  # (model, variant, most batches one replica held at once)


class Backend(BatchRunner, Protocol):
    """Everything the gateway asks of an execution backend (the batcher's part is
    :class:`~sloserve.batching.batcher.BatchRunner`: ``slots``, ``run``, ``shared``, ``round_trip_latency``,
    ``pipeline_depth``). Backends derive from :class:`BackendBase`, which gives the defaults."""

    name: str
    on_replicas: ReplicaHook | None  # set by the data plane before start: the replicas gauge
    on_runtime: RuntimeHook | None  # likewise: replicas by the device and provider they really run on
    on_capacity: CapacityHook | None  # likewise: the model's batcher re-plans (a lease grew, a replica came)
    on_held: HeldHook | None  # likewise: the replicas' peak batches held (backends whose replicas say so)

    def prepare(self) -> None:
        """What must run on the main thread before any server thread exists (the embedded Ray)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def ready(self) -> bool: ...

    def replica_count(self, model: str, variant: str) -> int:
        """Replicas serving (model, variant) now (not batch slots)."""

    def device_type_of(self, model: str) -> str:
        """The device type its replicas run on, as profiles name it (the first of several)."""

    def options_of(self, model: str) -> OptionPlan | None:
        """A model on several device types: its serving options (``sloserve.batching.options``), whose keys
        the batcher and ``run`` take in place of variant names. None: one device type, plain variants."""

    def note_arrival(self, model: str, rows: int) -> None:
        """A request of ``rows`` rows arrived for ``model`` (the autoscaler's demand signal)."""

    async def add_model(self, model: LoadedModel, deploy: bool = True) -> None:
        """Start ``model``'s replicas while serving (the repository API's load), by the same path
        start-up takes; returns once they take batches, or raises :class:`ModelLoadError`.
        ``deploy`` false: attach to the replicas another gateway started (a shared backend)."""

    async def remove_model(self, name: str, delete: bool = True) -> None:
        """Stop ``name``'s replicas (the repository API's unload, once its batcher has drained);
        ``delete`` false: only forget them (a shared backend: another gateway stops them)."""


class BackendBase:
    """Defaults for a :class:`Backend`: nothing to prepare, no demand signal, variants on replicas of
    their own, calibration on replica compute at depth 1. ``on_replicas`` is called with every replica
    count the backend learns of (the data plane points it at the replicas gauge)."""

    name = "base"
    round_trip_latency = False
    pipeline_depth = 1
    on_replicas: ReplicaHook | None = None
    on_runtime: RuntimeHook | None = None
    on_capacity: CapacityHook | None = None
    on_held: HeldHook | None = None
    _runtimes_seen: dict[tuple[str, str], set[tuple[str, str]]]

    def prepare(self) -> None:
        return None

    def note_arrival(self, model: str, rows: int) -> None:
        return None

    def shared(self, model: str) -> bool:
        return False

    def options_of(self, model: str) -> OptionPlan | None:
        return None

    async def add_model(self, model: LoadedModel, deploy: bool = True) -> None:
        raise ModelLoadError(f"the {self.name} backend cannot load models while serving")

    async def remove_model(self, name: str, delete: bool = True) -> None:
        return None

    def _report_replicas(self, model: str, variant: str, device: str, state: str, count: int) -> None:
        if self.on_replicas is not None:
            self.on_replicas(model, variant, device, state, count)

    def _capacity(self, model: str) -> None:
        if self.on_capacity is not None:
            self.on_capacity(model)

    def _report_runtime(self, model: str, variant: str, runtimes: list[tuple[str, str]]) -> None:
        """The (device, execution provider) each replica of (model, variant) really runs on, one entry
        a replica: counted per pair, and a pair no replica runs on any more set to 0."""
        if self.on_runtime is None:
            return
        counts: dict[tuple[str, str], int] = {}
        for pair in runtimes:
            counts[pair] = counts.get(pair, 0) + 1
        if not hasattr(self, "_runtimes_seen"):
            self._runtimes_seen = {}
        seen = self._runtimes_seen.setdefault((model, variant), set())
        for device, provider in seen | set(counts):
            self.on_runtime(model, variant, device, provider, counts.get((device, provider), 0))
        seen |= set(counts)
