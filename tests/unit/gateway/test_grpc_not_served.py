"""The methods of inference.GRPCInferenceService the gateway does not implement (shared memory,
trace and log settings, the streaming infer) answer UNIMPLEMENTED with a message naming the method,
without raising: a raise in a servicer method makes grpc log an error and a traceback per call."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from sloserve.gateway.transports.grpc import NOT_SERVED, InferenceServicer

SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


class _Context:
    code: grpc.StatusCode | None = None
    details: str | None = None

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


def test_every_method_of_the_service_is_implemented_or_listed_as_not_served():
    served = {name for name in vars(InferenceServicer) if name in SERVICE.methods_by_name}
    assert served | set(NOT_SERVED) == set(SERVICE.methods_by_name)
    assert {"ModelInfer", "ModelConfig", "RepositoryModelLoad"} <= served - set(NOT_SERVED)
    assert {"ModelStreamInfer", "TraceSetting", "LogSettings", "CudaSharedMemoryRegister"} <= set(NOT_SERVED)


@pytest.mark.parametrize("method", NOT_SERVED)
def test_a_method_not_served_answers_unimplemented_without_raising(method):
    ctx = _Context()
    request = pb.ModelInferRequest() if method == "ModelStreamInfer" else None
    assert asyncio.run(getattr(InferenceServicer, method)(None, request, ctx)) is None
    assert ctx.code is grpc.StatusCode.UNIMPLEMENTED
    assert ctx.details == f"{method} is not served by this server"
