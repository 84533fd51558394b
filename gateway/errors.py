"""Errors a client can cause or meet, each with its HTTP status and gRPC code.

Every error raised on the request path is a :class:`ServingError`; the transports map it to
``{"error": "..."}`` with :attr:`http_status` (REST) or :attr:`grpc_code` (gRPC). Anything else
reaching a transport is a bug and becomes a 500 / INTERNAL.
"""

from __future__ import annotations

import time

import grpc


class ServingError(Exception):
    http_status: int = 500
    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, *, retry_after_s: float | None = None):
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class InvalidArgument(ServingError):
    """The request is malformed or does not match the model (400 / INVALID_ARGUMENT)."""

    http_status = 400
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServingError):
    """Unknown model, version or variant path (404 / NOT_FOUND)."""

    http_status = 404
    grpc_code = grpc.StatusCode.NOT_FOUND


class PayloadTooLarge(ServingError):
    """Body over the configured limit (413 / RESOURCE_EXHAUSTED)."""

    http_status = 413
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unauthenticated(ServingError):
    http_status = 401
    grpc_code = grpc.StatusCode.UNAUTHENTICATED


class TooManyRequests(ServingError):
    """A bounded queue is full: back off and retry (429 / RESOURCE_EXHAUSTED, Retry-After)."""

    http_status = 429
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServingError):
    """The deadline cannot be met, or the model is not ready (503 / UNAVAILABLE, Retry-After)."""

    http_status = 503
    grpc_code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServingError):
    """A dispatched batch did not finish in time (504 / DEADLINE_EXCEEDED)."""

    http_status = 504
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED


class InternalError(ServingError):
    http_status = 500
    grpc_code = grpc.StatusCode.INTERNAL


class ReplicaFailed(Unavailable):
    """The replica died or vanished mid-batch (503 / UNAVAILABLE, Retry-After); the batcher
    retries the batch once if its deadline still allows."""


class DeadlineUnreachable(Unavailable):
    """Shed: the request cannot meet its deadline at the current load (503, Retry-After). Counted
    as an SLO miss (``outcome="shed"``), not as a fault of the server's availability.

    Created at the moment of the decision (admission or the policy's shed), so ``decided_at``
    (``time.perf_counter()``) lets the transports time decision -> answer written
    (``sloserve_shed_answer_seconds``)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None, reason: str = "deadline"):
        super().__init__(message, retry_after_s=retry_after_s)
        self.reason = reason
        self.decided_at = time.perf_counter()
