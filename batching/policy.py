"""The policy interface and its registry: one signature for every batching policy.

>>> from batching import make_policy
>>> p = make_policy("timeout", max_batch_size=8, max_wait_ms=2.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from batching.types import BatchResult, Decision, QueueView


@runtime_checkable
class BatchPolicy(Protocol):
    """``plan`` decides; ``observe`` learns. Neither reads a clock."""

    name: str

    def plan(self, view: QueueView, now: float) -> Decision: ...

    def observe(self, result: BatchResult) -> None: ...


PolicyFactory = Callable[..., BatchPolicy]
POLICIES: dict[str, PolicyFactory] = {}


def register_policy(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    def deco(factory: PolicyFactory) -> PolicyFactory:
        POLICIES[name] = factory
        return factory

    return deco


def make_policy(name: str, **kwargs: Any) -> BatchPolicy:
    """Build a registered policy; unknown names list the known ones."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown batching policy {name!r}; known: {sorted(POLICIES)}") from None
    try:
        return factory(**kwargs)
    except TypeError as e:  # a misspelt or unknown argument in the config
        raise ValueError(f"batching policy {name!r}: {e}") from None


def _register_builtins() -> None:
    # Import for the side effect of registration, kept here so `make_policy` always sees them.
    from batching import aimd, fixed, nexus, slo, timeout  # noqa: F401


_register_builtins()
