"""What the repository API shows a client: a token limited to some models sees only those in the
repository index (REST and gRPC), and a model's load error names its files relative to the model
repository, never the server's absolute paths (the load's 400, the index's reason, the model's 404),
while the server's log keeps them."""

from __future__ import annotations

import json
import logging
import shutil
from types import SimpleNamespace

import httpx
import pytest
from tritonclient.grpc import service_pb2 as pb

from sloserve.gateway.backends.threads import InProcessBackend
from sloserve.gateway.config import Settings
from sloserve.gateway.dataplane import DataPlane
from sloserve.gateway.tokens import TokenTable
from sloserve.gateway.transports.auth import GrpcGuard
from sloserve.gateway.transports.grpc import InferenceServicer
from sloserve.gateway.transports.rest import create_asgi
from sloserve.models.repository import ModelRepository
from sloserve.replica.runtime import RuntimeOptions

TOKENS = "digits-only-token digits infer,models;every-model-token * infer,models"
SERVICE = "/inference.GRPCInferenceService/"


@pytest.fixture(scope="module")
def plane(model_repo, tmp_path_factory):
    """digits and a copy named other, served (not started); a folder whose config.json is broken."""
    root = tmp_path_factory.mktemp("exposure") / "repo"
    shutil.copytree(model_repo / "digits", root / "digits")
    shutil.copytree(model_repo / "digits", root / "other")
    cfg = json.loads((root / "other" / "config.json").read_text())
    (root / "other" / "config.json").write_text(json.dumps({**cfg, "name": "other"}))
    repo = ModelRepository(root).load()
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text("{not json")
    settings = Settings(repo=root, backend="inprocess", auth_tokens=TOKENS)
    dp = DataPlane(repo, InProcessBackend(repo, RuntimeOptions(device="cpu")), settings)
    dp._started = True  # loads run (the broken one fails reading its folder, before the backend)
    return dp


async def _rest(dp, path: str, token: str, body: bytes = b"{}") -> httpx.Response:
    app = create_asgi(dp)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000") as c:
        headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        if path.startswith("/v2/repository"):
            return await c.post(path, content=body, headers=headers)
        return await c.get(path, headers=headers)


class _Context:
    def __init__(self):
        self.code = self.details = None

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details

    def set_trailing_metadata(self, md):
        pass


async def _grpc(dp, method: str, request, token: str):
    """One call through the interceptor the server installs (token check) to the servicer."""
    import grpc

    servicer = InferenceServicer(dp)
    handler = grpc.unary_unary_rpc_method_handler(getattr(servicer, method))

    async def continuation(details):
        return handler

    details = SimpleNamespace(method=SERVICE + method, invocation_metadata=(("authorization", f"Bearer {token}"),))
    guarded = await GrpcGuard(TokenTable.parse(TOKENS)).intercept_service(continuation, details)
    ctx = _Context()
    return await guarded.unary_unary(request, ctx), ctx


async def test_the_index_shows_a_token_only_the_models_of_its_list(plane):
    r = await _rest(plane, "/v2/repository/index", "digits-only-token")
    assert r.status_code == 200 and [m["name"] for m in r.json()] == ["digits"]
    r = await _rest(plane, "/v2/repository/index", "every-model-token")
    assert [m["name"] for m in r.json()] == ["broken", "digits", "other"]

    resp, _ = await _grpc(plane, "RepositoryIndex", pb.RepositoryIndexRequest(), "digits-only-token")
    assert [m.name for m in resp.models] == ["digits"]
    resp, _ = await _grpc(plane, "RepositoryIndex", pb.RepositoryIndexRequest(), "every-model-token")
    assert [m.name for m in resp.models] == ["broken", "digits", "other"]


async def test_load_errors_name_files_relative_to_the_repository(plane, caplog):
    root = str(plane.repo.root)
    caplog.set_level(logging.WARNING, logger="sloserve.repository")
    r = await _rest(plane, "/v2/repository/models/broken/load", "every-model-token")
    assert r.status_code == 400
    said = r.json()["error"]
    assert "broken/config.json is not valid JSON" in said and root not in said, said
    assert f"{root}/broken/config.json" in caplog.text  # the server's log keeps the absolute path

    resp, ctx = await _grpc(
        plane, "RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="broken"), "every-model-token"
    )
    assert resp is None and ctx.code.name == "INVALID_ARGUMENT"
    assert "broken/config.json is not valid JSON" in ctx.details and root not in ctx.details

    # the reason it stays unavailable, wherever a client reads it
    r = await _rest(plane, "/v2/repository/index", "every-model-token")
    reason = next(m["reason"] for m in r.json() if m["name"] == "broken")
    assert "broken/config.json" in reason and root not in reason
    resp, _ = await _grpc(plane, "RepositoryIndex", pb.RepositoryIndexRequest(), "every-model-token")
    reason = next(m.reason for m in resp.models if m.name == "broken")
    assert "broken/config.json" in reason and root not in reason
    r = await _rest(plane, "/v2/models/broken", "every-model-token")
    assert r.status_code == 404 and "broken/config.json" in r.json()["error"] and root not in r.json()["error"]
    resp, ctx = await _grpc(plane, "ModelMetadata", pb.ModelMetadataRequest(name="broken"), "every-model-token")
    assert ctx.code.name == "NOT_FOUND" and "broken/config.json" in ctx.details and root not in ctx.details

    r = await _rest(plane, "/v2/repository/models/absent/load", "every-model-token")
    assert r.status_code == 404 and root not in r.json()["error"], r.json()
