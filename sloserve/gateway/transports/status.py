"""Each serving error's HTTP status and gRPC code: the one place a transport code is chosen.

>>> from sloserve.gateway.errors import NotFound
>>> http_status(NotFound("x")), grpc_code(NotFound("x")).name
(404, 'NOT_FOUND')
"""

from __future__ import annotations

import grpc

from sloserve.gateway.errors import (
    DeadlineExceeded,
    InternalError,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    RequestTimeout,
    ServingError,
    TooManyRequests,
    Unauthenticated,
    Unavailable,
)

_C = grpc.StatusCode
_CODES: dict[type[ServingError], tuple[int, grpc.StatusCode]] = {
    InvalidArgument: (400, _C.INVALID_ARGUMENT),
    Unauthenticated: (401, _C.UNAUTHENTICATED),
    PermissionDenied: (403, _C.PERMISSION_DENIED),
    NotFound: (404, _C.NOT_FOUND),
    RequestTimeout: (408, _C.DEADLINE_EXCEEDED),
    PayloadTooLarge: (413, _C.RESOURCE_EXHAUSTED),
    TooManyRequests: (429, _C.RESOURCE_EXHAUSTED),
    InternalError: (500, _C.INTERNAL),
    Unavailable: (503, _C.UNAVAILABLE),  # its subclasses too: shed, replica failed
    DeadlineExceeded: (504, _C.DEADLINE_EXCEEDED),
}


def _codes(e: ServingError) -> tuple[int, grpc.StatusCode]:
    for cls in type(e).__mro__:
        if cls in _CODES:
            return _CODES[cls]
    return 500, _C.INTERNAL


def http_status(e: ServingError) -> int:
    return _codes(e)[0]


def grpc_code(e: ServingError) -> grpc.StatusCode:
    return _codes(e)[1]


def retry_after_header(e: ServingError) -> str | None:
    """The ``Retry-After`` value (whole seconds, at least 1), or None when the error sets none."""
    if e.retry_after_s is None:
        return None
    return str(max(1, round(e.retry_after_s + 0.499)))


def set_grpc_error(context: grpc.aio.ServicerContext, e: ServingError) -> None:
    """End a unary gRPC call with ``e``: its code, its message, and a ``retry-after`` trailer when it
    sets one. The handler returns None after it. Not ``context.abort()``: the exception that raises
    keeps the handler's frames (the received request among their locals) alive in a reference cycle
    until a full garbage collection, which the gateway runs rarely."""
    retry = retry_after_header(e)
    if retry is not None:
        context.set_trailing_metadata((("retry-after", retry),))
    context.set_code(grpc_code(e))
    context.set_details(e.message)
