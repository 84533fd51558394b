"""What a request can meet on its way through the batcher and a replica, as exceptions.

Every error on the request path is a :class:`ServingError`: a message that says what to do, an
optional ``retry_after_s``, and a ``kind`` (a metrics label). None carries a transport's code: the
transports map each class to an HTTP status or a gRPC code (``sloserve/gateway/transports/status.py``), so
the policies and the batcher stay free of any protocol. The gateway adds the errors a request can
cause before it is queued (``sloserve/gateway/errors.py``).
"""

from __future__ import annotations

import time


class ServingError(Exception):
    kind = "error"

    def __init__(self, message: str, *, retry_after_s: float | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class TooManyRequests(ServingError):
    """A bounded queue is full: back off and retry (with Retry-After)."""

    kind = "rejected"


class Unavailable(ServingError):
    """The deadline cannot be met, or the model is not ready (with Retry-After)."""

    kind = "unavailable"


class DeadlineExceeded(ServingError):
    """A dispatched batch did not finish in time."""

    kind = "timeout"


class InternalError(ServingError):
    kind = "error"


class ReplicaFailed(Unavailable):
    """The replica died or vanished mid-batch (with Retry-After); the batcher retries the batch once
    if its deadline still allows."""


class DeadlineUnreachable(Unavailable):
    """Shed: the request cannot meet its deadline at the current load (with Retry-After). Counted as
    an SLO miss (``outcome="shed"``), not as a fault of the server's availability.

    Created at the moment of the decision (admission or the policy's shed), so ``decided_at``
    (``time.perf_counter()``) lets the transports time decision -> answer written
    (``sloserve_shed_answer_seconds``)."""

    kind = "shed"

    def __init__(self, message: str, *, retry_after_s: float | None = None, reason: str = "deadline"):
        super().__init__(message, retry_after_s=retry_after_s)
        self.reason = reason
        self.decided_at = time.perf_counter()
