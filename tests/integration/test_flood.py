"""A flood of slow and oversized clients beside ordinary ones, against the default (Ray) server.

`sloserve/loadtests/flood.py` runs three phases of ordinary Poisson traffic (before, during, after the flood),
with attackers in a process of their own: stalled bodies, a 10 GiB declared body, a chunked body that
never ends, a large JSON tensor (decoded off the event loop), and large gRPC messages. Every attacker
request must end in an answer naming its problem (or a connection the server closed), none may hang,
the ordinary clients must keep being answered, and the gateway's memory must not grow with the number
of large requests it refused. The longer run: docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import subprocess
import sys

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from sloserve.gateway.config import Settings
from sloserve.gateway.server import Gateway
from sloserve.gateway.transports.grpc import ReceivedInfer

pytestmark = pytest.mark.integration
MIB = 1 << 20

EXPECTED = {
    "stall": {"408"},  # after body_timeout_s (30 s by default)
    "declared": {"413", "reset", "closed"},
    "chunked": {"413", "429", "reset", "closed"},
    # over the served models' largest request: 413 from its Content-Length (with a larger
    # max_request_bytes: decoded in the worker, then its shape is refused; 429 past max_inflight_bytes)
    "json": {"413", "reset", "closed", "400", "429"},
    "grpc": {"INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"},
}


def test_a_flood_is_refused_clearly_and_ordinary_clients_keep_their_answers(ray_server, tmp_path):
    s = ray_server
    out = tmp_path / "flood.json"
    cmd = [
        sys.executable, "-m", "sloserve.loadtests.flood",
        "--url", f"http://127.0.0.1:{s.http_port}", "--grpc", f"127.0.0.1:{s.grpc_port}",
        "--pid", str(s.proc.pid), "--seconds", "3", "--rate", "50", "--concurrency", "2",
        "--json-mib", "8", "--grpc-mib", "30", "--answer-timeout-s", "40", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.exists(), done.stderr[-3000:]
    r = json.loads(out.read_text())
    print(json.dumps({k: r[k] for k in ("attacks", "memory", "attackers_cpu_s")}, indent=1))
    assert r["hung"] == 0 and done.returncode == 0
    for kind, outcomes in r["attacks"].items():
        assert outcomes and set(outcomes) <= EXPECTED[kind], (kind, outcomes)
    for phase in ("before", "flood", "after"):
        st = r[phase]["status"]
        assert set(st) <= {"200", "429", "503"} and r[phase]["refused_without_retry_after"] == 0, (phase, st)
        assert st.get("200", 0) >= 0.95 * r[phase]["sent"], (phase, st)
    assert r["flood"]["ok_p99_ms"] < 1000, r["flood"]
    grew = r["memory"]["flood"]["gateway_max_mib"] - r["memory"]["before"]["gateway_max_mib"]
    assert grew < 1024, r["memory"]


@pytest.mark.parametrize(
    "tokens, code, says",
    [
        (None, grpc.StatusCode.INVALID_ARGUMENT, "batch"),
        ("s3cret-for-the-test", grpc.StatusCode.UNAUTHENTICATED, "bearer"),
    ],
    ids=["refused-by-the-data-plane", "refused-at-the-door"],
)
async def test_refused_large_grpc_requests_are_not_kept_alive(model_repo, tmp_path, tokens, code, says):
    """A refused ModelInfer used to leave an exception cycle holding the received bytes until a full
    collection (which the gateway runs rarely): 20 refused 8 MiB requests held 160 MiB. The same for
    a client without a token."""
    repo = tmp_path / "repo"
    shutil.copytree(model_repo / "digits", repo / "digits")
    # a message limit above the requests' size, so that they reach the handler (by default gRPC
    # itself refuses them: over what digits' largest request takes); the event-loop door off, so that
    # a busy machine's loop lag cannot refuse them first (this test is about the size check)
    settings = Settings(
        repo=repo,
        backend="inprocess",
        http_port=0,
        grpc_port=0,
        auth_tokens=tokens,
        max_request_bytes=16 * MIB,
        loop_lag_shed_ms=0,
    )
    gw = Gateway(settings)
    await gw.start()
    try:
        opts = [("grpc.max_send_message_length", 16 * MIB)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.grpc_port}", options=opts) as ch:
            call = ch.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            rows = 8 * MIB // 256  # far over digits' max_batch_size: refused after it is received
            req = pb.ModelInferRequest(model_name="digits")
            req.inputs.add(name="input", datatype="FP32", shape=[rows, 64])
            req.raw_input_contents.append(bytes(rows * 256))
            for _ in range(20):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await call(req, timeout=30)
                assert e.value.code() == code and says in (e.value.details() or ""), e.value
        await asyncio.sleep(0.1)
        alive = sum(1 for o in gc.get_objects() if isinstance(o, ReceivedInfer))
        assert alive <= 1, f"{alive} received requests still alive"
    finally:
        await gw.stop()
