"""The policy interface and its registry: one signature for every batching policy.

The built-in policies (sloserve/batching/policies/) register themselves with :func:`register_policy`
when ``sloserve.batching`` is imported (sloserve/batching/builtin.py), so :func:`make_policy` sees them
whichever module a caller imports it from.

A policy is built from keywords of two kinds, told apart by name:

* the **context**, what its driver knows about the model (:class:`PolicyContext`: the batch size cap,
  the variants and their accuracy, the latency profile or function, the device type). Every policy
  takes all of it and uses what it needs;
* its **settings**, its own tuning knobs, declared as a pydantic model (``Settings``) and validated
  once: a bad value or an unknown knob is a ``ValueError`` that names the key.

>>> from sloserve.batching import make_policy
>>> p = make_policy("timeout", max_batch_size=8, max_wait_ms=2.0)
>>> p.context.max_batch_size, p.settings.max_wait_ms
(8, 2.0)
>>> make_policy("timeout", max_wait_ms=-1)
Traceback (most recent call last):
...
ValueError: batching policy 'timeout': max_wait_ms=-1: Input should be greater than or equal to 0
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from sloserve.batching.latency import LatencyFn, LatencySource
from sloserve.batching.types import BatchResult, Decision, QueuedItem, QueueView, Shed


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a driver knows about the model a policy batches for (never a tuning knob)."""

    max_batch_size: int = 32
    default_variant: str = ""
    model: str = ""
    device_type: str = "cpu"
    variants: Sequence[str] | None = None  # most accurate first
    accuracy: Mapping[str, float] | None = None
    profile: LatencySource = None  # a ProfileTable, a Calibrator or a repository path
    latency_fn: LatencyFn | None = None  # (variant, rows) -> seconds; wins over ``profile``


CONTEXT_FIELDS = frozenset(f.name for f in fields(PolicyContext))


class NoSettings(BaseModel):
    """A policy without knobs."""

    model_config = ConfigDict(extra="forbid")


@runtime_checkable
class BatchPolicy(Protocol):
    """``plan`` decides; ``admit`` may refuse a request before it is queued; ``observe`` learns.
    None of them reads a clock."""

    name: str
    context: PolicyContext
    settings: BaseModel

    def plan(self, view: QueueView, now: float) -> Decision: ...

    def admit(self, view: QueueView, item: QueuedItem, now: float) -> Shed | None: ...

    def observe(self, result: BatchResult) -> None: ...


def settings_from(name: str, model: type[BaseModel], values: Mapping[str, Any]) -> BaseModel:
    """``values`` validated by ``model``; a ``ValueError`` naming the first bad key otherwise."""
    try:
        return model.model_validate(dict(values))
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            known = sorted(model.model_fields) or ["none"]
            raise ValueError(
                f"batching policy {name!r}: unknown setting {key!r}; its settings: {', '.join(known)}"
            ) from None
        raise ValueError(f"batching policy {name!r}: {key}={err.get('input')!r:.60}: {err['msg']}") from None


class PolicyBase:
    """Splits the keywords into the context and the validated settings; admits everything and
    learns nothing unless the policy says otherwise."""

    name = ""
    Settings: ClassVar[type[BaseModel]] = NoSettings

    def __init__(self, **kwargs: Any):
        context = {k: kwargs.pop(k) for k in list(kwargs) if k in CONTEXT_FIELDS}
        self.context = PolicyContext(**context)
        self.settings = settings_from(self.name, self.Settings, kwargs)

    def plan(self, view: QueueView, now: float) -> Decision:
        raise NotImplementedError(f"batching policy {self.name!r} does not implement plan")

    def admit(self, view: QueueView, item: QueuedItem, now: float) -> Shed | None:
        return None

    def observe(self, result: BatchResult) -> None:
        return None


POLICIES: dict[str, type[PolicyBase]] = {}


def register_policy(name: str) -> Callable[[type[PolicyBase]], type[PolicyBase]]:
    def deco(cls: type[PolicyBase]) -> type[PolicyBase]:
        POLICIES[name] = cls
        return cls

    return deco


def policy_settings(name: str) -> type[BaseModel]:
    """The settings model of a registered policy (which knobs it declares)."""
    return POLICIES[name].Settings


def make_policy(name: str, **kwargs: Any) -> BatchPolicy:
    """Build a registered policy; unknown names list the known ones."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown batching policy {name!r}; known: {sorted(POLICIES)}") from None
    return cls(**kwargs)
