"""SLO-aware batching: pure policies (``plan``/``observe``) and the mechanism that drives them.

Policies never read the wall clock: the driver (the live :class:`~batching.batcher.Batcher` or
the simulator) passes ``now`` explicitly.
"""

from batching.types import (
    BatchResult,
    Decision,
    Dispatch,
    QueuedItem,
    QueueView,
    Shed,
    Wait,
)
from batching.policy import BatchPolicy, make_policy, register_policy, POLICIES

__all__ = [
    "BatchResult",
    "BatchPolicy",
    "Decision",
    "Dispatch",
    "POLICIES",
    "QueuedItem",
    "QueueView",
    "Shed",
    "Wait",
    "make_policy",
    "register_policy",
]
