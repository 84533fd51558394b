"""The placement hook the simulator calls after each autoscaling round (the harvest plugs in here).

A hook gets every model's wish (replicas the autoscaler wants) and what it holds now, and
answers how many replicas each model may hold; it may also keep its own books (training jobs,
typed GPUs). The default, :class:`FixedPool`, has ``gpus`` GPUs of one type, one replica per GPU:
shrinking wishes are granted first, then growing ones in order of their shortfall, until the
pool is empty. The pure placement policy (``sloserve.autoscaler.placement.policy``) wraps into this
protocol: ``allocate`` builds its ``PlacementSnapshot`` from the wishes, applies the decision to
its inventory and returns the replicas it started or kept per model.

>>> FixedPool(gpus=3).allocate({"a": 2, "b": 2}, {"a": 0, "b": 0}, now_s=0.0)
{'a': 2, 'b': 1}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


class PlacementHook(Protocol):
    """What the simulator's drivers (fluid and request level) ask of a placement.

    ``allocate`` grants replicas each round. ``start_delay_s`` says, after that round, how long the
    replicas just granted to a model wait for their GPU before their start-up begins (a preempted
    training job's grace, sloserve/sim/harvest.py); both drivers add it to the start-up time. ``finish``
    is called once at the end of the run, so a hook with a clock of its own can account up to it."""

    name: str
    start_delay_s: Mapping[str, float]

    def allocate(self, wants: Mapping[str, int], holding: Mapping[str, int], now_s: float) -> dict[str, int]: ...

    def report(self) -> dict: ...

    def finish(self, end_s: float) -> None: ...


@dataclass
class FixedPool:
    """``gpus`` GPUs of ``gpu_type``; one replica per GPU; no training."""

    gpus: int = 1_000_000
    gpu_type: str = "a100"
    name: str = "fixed-pool"
    refused: int = field(default=0, init=False)  # replica-requests the pool could not grant
    start_delay_s: Mapping[str, float] = field(default_factory=dict, init=False)  # a free GPU is ready at once

    def allocate(self, wants: Mapping[str, int], holding: Mapping[str, int], now_s: float) -> dict[str, int]:
        grant = {m: min(wants[m], holding.get(m, 0)) for m in wants}
        free = self.gpus - sum(grant.values())
        growing = sorted((m for m in wants if wants[m] > grant[m]), key=lambda m: (grant[m] - wants[m], m))
        for m in growing:
            add = min(wants[m] - grant[m], max(free, 0))
            grant[m] += add
            free -= add
            self.refused += wants[m] - grant[m]
        return grant

    def report(self) -> dict:
        return {"placement": self.name, "gpus": self.gpus, "gpu_type": self.gpu_type, "refused": self.refused}

    def finish(self, end_s: float) -> None:
        return None
