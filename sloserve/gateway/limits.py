"""How large a request the gateway reads: bounded by what the served models can take.

A request bigger than the largest one any served model accepts could only be refused after it was
read, so it is refused before: a REST body by its Content-Length (or as it streams), a gRPC message
by grpc itself. Used by the data plane (fixed when it starts) and the repository API (a model loaded
later must fit them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

# The most bytes one tensor element takes in each encoding: JSON text ("-1.2345678901234567e-308, ")
# and gRPC's wire (a varint int64; packed floats take 4 or 8); the raw binary extension takes <= 8.
JSON_BYTES_PER_ELEMENT = 32
GRPC_BYTES_PER_ELEMENT = 10
REQUEST_HEADROOM_BYTES = 64 * 1024  # names, shapes, parameters
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_JSON_BYTES = 32 * 1024 * 1024


class SizeLimits(NamedTuple):
    """The largest REST body, JSON part and gRPC message the gateway reads (413 / RESOURCE_EXHAUSTED above)."""

    body: int
    json: int
    grpc: int

    def fits(self, other: SizeLimits) -> bool:
        return other.body <= self.body and other.json <= self.json and other.grpc <= self.grpc


def size_limits(settings: Any, configs: Iterable[Any]) -> SizeLimits:
    """The settings' limits, or where they are unset (the default) what the largest request any of
    ``configs`` accepts needs in each encoding, capped: nothing bigger could be served, so nothing
    bigger is read. A model whose inputs have no bound (a variable dimension, BYTES) leaves the caps."""
    counts = [c.max_request_elements(settings.max_batch_rows) for c in configs]
    largest = max(counts) if counts and None not in counts else None

    def need(per_element: int, cap: int) -> int:
        return cap if largest is None else min(cap, largest * per_element + REQUEST_HEADROOM_BYTES)

    body = settings.max_request_bytes or need(JSON_BYTES_PER_ELEMENT, MAX_BODY_BYTES)
    return SizeLimits(
        body=body,
        json=settings.max_json_bytes or min(body, need(JSON_BYTES_PER_ELEMENT, MAX_JSON_BYTES)),
        grpc=settings.max_request_bytes or need(GRPC_BYTES_PER_ELEMENT, MAX_BODY_BYTES),
    )
