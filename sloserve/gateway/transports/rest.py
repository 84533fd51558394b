"""KServe V2 REST over FastAPI: a thin adapter from HTTP to the DataPlane.

Bodies are parsed as V2 JSON; ``Inference-Header-Content-Length`` switches on the binary tensor
extension. What a state-changing request may declare as its Content-Type (application/json,
application/octet-stream, or none: tritonclient's sync client sends none, its asyncio client
application/octet-stream) and which Host it may name is checked in front of everything else
(sloserve/gateway/transports/door.py). Every error is ``{"error": "..."}`` with the status the protocol
gives it; a client's mistake is never a 500 or a FastAPI 422.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE
from starlette.exceptions import HTTPException as StarletteHTTPException

from sloserve.gateway.dataplane import DataPlane, Ticket
from sloserve.gateway.errors import InvalidArgument, ServingError
from sloserve.gateway.transports.auth import BearerAuthMiddleware, TokenTable, may_see
from sloserve.gateway.transports.codec import InputLimits, body_too_large
from sloserve.gateway.transports.door import FrontDoor
from sloserve.gateway.transports.fastpath import InferFastPath
from sloserve.gateway.transports.restdecode import RestDecoder
from sloserve.gateway.transports.restinfer import body_timeout, infer_body
from sloserve.gateway.transports.status import http_status, retry_after_header

log = logging.getLogger("sloserve.rest")
INFER_BODY_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["inputs"],
                    "properties": {
                        "id": {"type": "string"},
                        "parameters": {
                            "type": "object",
                            "properties": {
                                "slo_ms": {"type": "number"},
                                "min_accuracy": {"type": "number"},
                                "priority": {"type": "integer"},
                                "timeout": {"type": "integer"},
                                "variant": {"type": "string"},
                                "device_type": {"type": "string"},
                                "binary_data_output": {"type": "boolean"},
                            },
                        },
                        "inputs": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name", "shape", "datatype"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "shape": {"type": "array", "items": {"type": "integer"}},
                                    "datatype": {"type": "string"},
                                    "parameters": {"type": "object"},
                                    "data": {"type": "array"},
                                },
                            },
                        },
                        "outputs": {"type": "array", "items": {"type": "object"}},
                    },
                }
            }
        },
    }
}


def _optional_json_body(properties: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document of a repository request's optional JSON object body (:func:`_json_body`
    reads it; keys it does not name are ignored)."""
    schema = {"type": "object", "properties": properties}
    return {"requestBody": {"required": False, "content": {"application/json": {"schema": schema}}}}


INDEX_BODY_DOC = _optional_json_body({"ready": {"type": "boolean", "description": "only the models ready"}})
LOAD_BODY_DOC = _optional_json_body(
    {
        "parameters": {
            "type": "object",
            "properties": {"config": {"type": "string", "description": "a JSON object of config.json keys"}},
        }
    }
)
UNLOAD_BODY_DOC = _optional_json_body(
    {"parameters": {"type": "object", "properties": {"unload_dependents": {"type": "boolean"}}}}
)


def error_response(e: ServingError) -> JSONResponse:
    retry = retry_after_header(e)
    return JSONResponse(
        {"error": e.message}, status_code=http_status(e), headers={"Retry-After": retry} if retry else None
    )


async def read_body(request: Request, limit: int, ticket: Ticket | None = None) -> bytes:
    cl = request.headers.get("content-length")
    if cl is not None:
        try:
            n = int(cl)
        except ValueError:
            raise InvalidArgument(f"Content-Length {cl!r:.40} is not an integer") from None
        if n > limit:
            raise body_too_large(limit, n)
        return await request.body()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        if ticket is not None:
            ticket.grow(size)  # counted as it streams (sloserve/gateway/admission.py's Ticket)
        chunks.append(chunk)
    return b"".join(chunks)


def rest_decoder(dp: DataPlane) -> RestDecoder:
    """The REST body decoder for these settings (its worker starts with :meth:`RestDecoder.start`)."""
    return RestDecoder(InputLimits.from_settings(dp.settings, dp.size_limits), dp.settings.json_offload_bytes)


def create_asgi(dp: DataPlane, routers=(), decoder: RestDecoder | None = None):
    """The served ASGI app: the infer fast path in front of FastAPI, bearer auth around both, and the
    front door's Host and Content-Type checks around all of it (sloserve/gateway/transports/door.py).
    Whoever passes ``decoder`` starts and closes it; without one, large JSON decodes inline."""
    if decoder is None:
        decoder = RestDecoder(InputLimits.from_settings(dp.settings, dp.size_limits), None)
    api = create_app(dp, decoder)
    for r in routers:
        api.include_router(r)
    app: Callable = InferFastPath(api, dp, decoder)
    tokens = TokenTable.from_settings(dp.settings)
    if tokens is not None:
        app = BearerAuthMiddleware(app, table=tokens)
    return FrontDoor.from_settings(app, dp.settings)


def create_app(dp: DataPlane, decoder: RestDecoder) -> FastAPI:
    """The FastAPI app: metadata, health, metrics, and the infer routes (the fast path serves those
    first, ``sloserve/gateway/transports/fastpath.py``); :func:`create_asgi` puts authentication around both."""
    app = FastAPI(
        title="sloserve", version="0.1.0", description="KServe V2 (Open Inference Protocol) with SLO-aware batching"
    )
    _error_handlers(app)
    _repository_routes(app, dp)  # (before the metadata routes: /v2/models/stats is not a model)
    _metadata_routes(app, dp)
    _infer_routes(app, dp, decoder)
    return app


def _error_handlers(app: FastAPI) -> None:
    """Every error is ``{"error": "..."}``: a client's mistake is never a 500 or a FastAPI 422."""

    @app.exception_handler(ServingError)
    async def _serving_error(request: Request, e: ServingError):
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"error": f"invalid request at {where}: {first.get('msg', 'invalid')}"}, 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        msg = e.detail if isinstance(e.detail, str) else str(e.detail)
        if e.status_code == 404:
            msg = f"no such endpoint {request.method} {request.url.path}; see /docs for the V2 API"
        return JSONResponse({"error": msg}, status_code=e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("internal error on %s", request.url.path)
        return JSONResponse({"error": f"internal error: {type(e).__name__}"}, status_code=500)


MAX_CONTROL_BODY = 1 << 20  # a repository request's JSON body (a config override at most)


async def _json_body(request: Request) -> dict[str, Any]:
    """A repository request's optional JSON object body ({} when empty)."""
    body = await read_body(request, MAX_CONTROL_BODY)
    if not body.strip():
        return {}
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidArgument(f"the request body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("the request body must be a JSON object")
    return doc


def _repository_routes(app: FastAPI, dp: DataPlane) -> None:
    """The V2 repository extension (sloserve/gateway/repository.py) and Triton's per-model config and statistics."""
    repo = dp.repository

    @app.post("/v2/repository/index", openapi_extra=INDEX_BODY_DOC)
    async def repository_index(request: Request):
        index = repo.index(bool((await _json_body(request)).get("ready", False)))
        return [m for m in index if may_see(m["name"])]  # a token sees only the models of its list

    @app.post("/v2/repository/models/{model}/load", openapi_extra=LOAD_BODY_DOC)
    async def repository_load(model: str, request: Request):
        await repo.load(model, (await _json_body(request)).get("parameters"))
        return Response(status_code=200)

    @app.post("/v2/repository/models/{model}/unload", openapi_extra=UNLOAD_BODY_DOC)
    async def repository_unload(model: str, request: Request):
        await repo.unload(model, (await _json_body(request)).get("parameters"))
        return Response(status_code=200)

    @app.get("/v2/models/stats")
    async def all_statistics():
        return dp.statistics()

    @app.get("/v2/models/{model}/stats")
    async def model_statistics(model: str):
        return dp.statistics(model)

    @app.get("/v2/models/{model}/versions/{version}/stats")
    async def model_version_statistics(model: str, version: str):
        return dp.statistics(model, version)

    @app.get("/v2/models/{model}/config")
    async def model_config(model: str):
        return dp.model_config(model)

    @app.get("/v2/models/{model}/versions/{version}/config")
    async def model_version_config(model: str, version: str):
        return dp.model_config(model, version)


def _metadata_routes(app: FastAPI, dp: DataPlane) -> None:
    @app.get("/v2/health/live")
    async def live():
        return Response(status_code=200 if dp.live() else 503)

    @app.get("/v2/health/ready")
    async def ready():
        return Response(status_code=200 if dp.ready() else 503)

    @app.get("/v2")
    async def server_metadata():
        return dp.server_metadata()

    @app.get("/v2/models/{model}")
    async def model_metadata(model: str):
        return dp.model(model).metadata()

    @app.get("/v2/models/{model}/versions/{version}")
    async def model_version_metadata(model: str, version: str):
        return dp.model(model, version).metadata()

    @app.get("/v2/models/{model}/ready")
    async def model_ready(model: str):
        return Response(status_code=200 if dp.model_ready(model) else 503)

    @app.get("/v2/models/{model}/versions/{version}/ready")
    async def model_version_ready(model: str, version: str):
        return Response(status_code=200 if dp.model_ready(model, version) else 503)

    @app.get("/metrics")
    async def metrics(request: Request):
        # OpenMetrics when the scraper asks for it (Prometheus does): the latency histograms' exemplars
        # (a sampled request's trace id) exist only in that format
        if "application/openmetrics-text" in request.headers.get("accept", ""):
            return Response(await dp.metrics.exposition(openmetrics=True), media_type=OPENMETRICS_CONTENT_TYPE)
        return Response(await dp.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _infer_routes(app: FastAPI, dp: DataPlane, decoder: RestDecoder) -> None:
    limit = dp.size_limits.body

    async def _infer(request: Request, model: str, version: str | None) -> Response:
        cl = request.headers.get("content-length", "")
        with dp.admit(model, int(cl) if cl.isdigit() and int(cl) <= limit else 0) as ticket:
            try:
                async with asyncio.timeout(dp.settings.body_timeout_s):
                    body = await read_body(request, limit, ticket)
            except TimeoutError:
                raise body_timeout(dp.settings.body_timeout_s) from None
            ticket.read(len(body))  # a lagging event loop refuses it here, undecoded (sloserve/gateway/admission.py)
            payload, json_len = await infer_body(dp, decoder, model, version, ticket.arrival_s, body, request.headers)
        if json_len is None:
            return Response(payload, media_type="application/json")
        return Response(
            payload, media_type="application/octet-stream", headers={"Inference-Header-Content-Length": str(json_len)}
        )

    @app.post("/v2/models/{model}/infer", openapi_extra=INFER_BODY_DOC)
    async def infer(model: str, request: Request):
        return await _infer(request, model, None)

    @app.post("/v2/models/{model}/versions/{version}/infer", openapi_extra=INFER_BODY_DOC)
    async def infer_version(model: str, version: str, request: Request):
        return await _infer(request, model, version)
