"""The one internal request/response type; REST and gRPC are adapters to and from it.

Tensors are numpy arrays. V2 datatypes map to numpy dtypes through :data:`V2_TO_NUMPY`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
NUMPY_TO_V2: dict[np.dtype, str] = {v: k for k, v in V2_TO_NUMPY.items()}


@dataclass(slots=True)
class RequestParams:
    """The SLO parameters of one request (see docs/architecture.md, "SLO in the protocol")."""

    slo_ms: float | None = None
    min_accuracy: float | None = None
    priority: int = 0
    variant: str | None = None


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
    arrival_s: float = 0.0
    # Set by a transport that can write an error answer synchronously (gateway/fastpath.py): the
    # batcher calls it the moment it sheds this request (batching.batcher.AnswerNow).
    answer_now: Callable[[Exception], bool] | None = None


@dataclass(slots=True)
class InferResponse:
    model: str
    version: str
    outputs: dict[str, np.ndarray]
    id: str | None = None
    requested: list[RequestedOutput] | None = None
    binary_output: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
