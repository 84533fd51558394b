"""The one internal request/response type; REST and gRPC are adapters to and from it.

Tensors are numpy arrays. V2 datatypes map to numpy dtypes through :data:`V2_TO_NUMPY`
(``sloserve/models/datatypes.py``, where the model repository's configs use them too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sloserve.models.datatypes import NUMPY_TO_V2, V2_TO_NUMPY

__all__ = ["NUMPY_TO_V2", "V2_TO_NUMPY", "InferRequest", "InferResponse", "RequestParams", "RequestedOutput"]


@dataclass(slots=True)
class RequestParams:
    """The SLO parameters of one request (docs/configuration.md lists them, as a client sends them)."""

    slo_ms: float | None = None
    min_accuracy: float | None = None
    priority: int = 0  # Triton's numbering: 1 the highest level; 0 the model's default level
    variant: str | None = None
    device_type: str | None = None  # pins the device type (a model served on several)
    timeout_us: int | None = None  # Triton's `timeout`: a bound on the time queued (microseconds)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    binary: bool = False


@dataclass(slots=True)
class InferRequest:
    """A decoded, not yet validated inference request.

    ``inputs`` maps input name -> (V2 datatype, array already shaped as the request said).
    ``outputs`` is None when the client asked for all outputs.
    """

    model: str
    version: str | None
    inputs: dict[str, tuple[str, np.ndarray]]
    id: str | None = None
    outputs: list[RequestedOutput] | None = None
    params: RequestParams = field(default_factory=RequestParams)
    binary_output: bool = False
    arrival_s: float = 0.0  # when it reached the gateway's door (the data plane's clock)


@dataclass(slots=True)
class InferResponse:
    model: str
    version: str
    outputs: dict[str, np.ndarray]
    id: str | None = None
    requested: list[RequestedOutput] | None = None
    binary_output: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
