"""The errors a client can cause before its request is queued, beside the batcher's own.

Transports map every class to an HTTP status and a gRPC code (``sloserve/gateway/transports/status.py``);
anything else reaching a transport is a bug and becomes a 500 / INTERNAL.
"""

from __future__ import annotations

from sloserve.batching.errors import (
    DeadlineExceeded,
    DeadlineUnreachable,
    InternalError,
    ReplicaFailed,
    ServingError,
    TooManyRequests,
    Unavailable,
)

__all__ = [
    "DeadlineExceeded",
    "DeadlineUnreachable",
    "InternalError",
    "InvalidArgument",
    "NotFound",
    "PayloadTooLarge",
    "PermissionDenied",
    "ReplicaFailed",
    "ServingError",
    "TooManyRequests",
    "RequestTimeout",
    "Unauthenticated",
    "Unavailable",
]


class InvalidArgument(ServingError):
    """The request is malformed or does not match the model."""

    kind = "invalid"


class NotFound(ServingError):
    """Unknown model, version or variant path."""

    kind = "not_found"


class PayloadTooLarge(ServingError):
    """Body over the configured limit."""

    kind = "too_large"


class RequestTimeout(ServingError):
    """The client did not send its whole body within ``body_timeout_s``."""

    kind = "timeout"


class Unauthenticated(ServingError):
    kind = "unauthenticated"


class PermissionDenied(ServingError):
    """A valid token that may not use this model."""

    kind = "forbidden"
