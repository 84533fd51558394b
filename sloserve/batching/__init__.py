"""SLO-aware batching: pure policies (``plan``/``observe``) and the mechanism that drives them.

Policies never read the wall clock: the driver (the live :class:`~sloserve.batching.batcher.Batcher` or
the simulator) passes ``now`` explicitly.
"""

from sloserve.batching import builtin  # noqa: F401 - registers the built-in policies
from sloserve.batching.policy import POLICIES, BatchPolicy, make_policy, register_policy
from sloserve.batching.types import (
    BatchResult,
    Decision,
    Dispatch,
    QueuedItem,
    QueueView,
    Shed,
    Wait,
)

__all__ = [
    "POLICIES",
    "BatchPolicy",
    "BatchResult",
    "Decision",
    "Dispatch",
    "QueueView",
    "QueuedItem",
    "Shed",
    "Wait",
    "make_policy",
    "register_policy",
]
