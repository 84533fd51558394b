"""Readiness while models load: the servers answer at once, liveness says live, readiness and
inference say "not yet" (503 + Retry-After / UNAVAILABLE) until every model has loaded.

A gated in-process backend holds model loading until the test releases it, so the "loading"
window is observed deterministically, with no sleeps and no timing assumptions.
"""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from sloserve.gateway.backends.threads import InProcessBackend
from sloserve.gateway.config import Settings
from sloserve.gateway.server import Gateway
from sloserve.models.repository import ModelRepository
from sloserve.replica.runtime import RuntimeOptions

pytestmark = pytest.mark.integration
BODY = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}]}


class GatedBackend(InProcessBackend):
    """Loads its models only once ``gate`` is set."""

    def __init__(self, *args, gate: asyncio.Event, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate = gate
        self.loading = asyncio.Event()

    async def start(self) -> None:
        self.loading.set()
        await self.gate.wait()
        await super().start()


async def test_not_ready_while_models_load(model_repo):
    # loop_lag_shed_ms 0: the clients share the gateway's event loop, which also loads the models once
    # the gate opens; the door's "event loop runs behind" 503 would stand in for the answers checked here
    settings = Settings(repo=model_repo, backend="inprocess", http_port=0, grpc_port=0, loop_lag_shed_ms=0)
    gate = asyncio.Event()
    backend = GatedBackend(ModelRepository(model_repo).load(), RuntimeOptions(), gate=gate)
    gw = Gateway(settings, backend=backend)
    start = asyncio.create_task(gw.start())
    try:
        await asyncio.wait_for(backend.loading.wait(), 60)
        base = f"http://127.0.0.1:{gw.http_port}"
        async with (
            httpx.AsyncClient(base_url=base, timeout=10) as http,
            grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as ch,
        ):
            stub = pb_grpc.GRPCInferenceServiceStub(ch)
            # loading: live, not ready, inference refused with a retry hint
            assert (await http.get("/v2/health/live")).status_code == 200
            assert (await http.get("/v2/health/ready")).status_code == 503
            assert (await http.get("/v2/models/digits/ready")).status_code == 503
            r = await http.post("/v2/models/digits/infer", json=BODY)
            assert r.status_code == 503 and "starting" in r.json()["error"] and r.headers["retry-after"]
            assert (await stub.ServerLive(pb.ServerLiveRequest())).live
            assert not (await stub.ServerReady(pb.ServerReadyRequest())).ready
            assert not (await stub.ModelReady(pb.ModelReadyRequest(name="digits"))).ready
            req = pb.ModelInferRequest(model_name="digits")
            req.inputs.add(name="input", datatype="FP32", shape=[1, 64])
            req.raw_input_contents.append(bytes(4 * 64))
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await stub.ModelInfer(req, timeout=10)
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE and "starting" in ei.value.details()
            assert ("retry-after", "1") in tuple(ei.value.trailing_metadata() or ())
            assert not start.done()

            gate.set()
            await asyncio.wait_for(start, 60)
            assert (await http.get("/v2/health/ready")).status_code == 200
            assert (await http.get("/v2/models/digits/ready")).status_code == 200
            assert (await stub.ServerReady(pb.ServerReadyRequest())).ready
            r = await http.post("/v2/models/digits/infer", json=BODY)
            assert r.status_code == 200, r.text
    finally:
        gate.set()
        if not start.done():
            start.cancel()
        await gw.stop()
