"""Bearer-token authentication, per-token model allow-lists and scopes, for REST and gRPC alike.

Tokens come from ``auth_tokens_file`` and/or ``auth_tokens`` (usually the environment variable
``SLOSERVE_AUTH_TOKENS``), one entry a line (or ``;``-separated; sloserve/gateway/tokens.py)::

    # token          models it may use (* = every model)   scopes (default: infer)    tenant (training)
    3f9c0e...a1      digits,heavy
    7be21d...04      *                                     infer,training,metrics    team-a
    91aa0b...5e      *                                     metrics

When no token is configured, nothing is checked and nothing is installed on the hot path, except
that the training API (sloserve/gateway/transports/training.py) then refuses every request with a 401.
When one is, every request needs ``Authorization: Bearer TOKEN`` except the open endpoints:
liveness and readiness (``/v2/health/*``, gRPC ``ServerLive``/``ServerReady``), server metadata
(``/v2``, ``ServerMetadata``) and the API docs (``/docs``, ``/openapi.json``). ``/metrics`` and
every model's statistics (``/v2/models/stats``, gRPC ``ModelStatistics`` without a name) need the
``metrics`` scope, ``/v2/training/*`` the ``training`` scope, the repository API
(``/v2/repository/*``, gRPC ``Repository*``) the ``models`` scope, everything else ``infer``.
Model endpoints (metadata, config, statistics, readiness, inference, load and unload) also check
the model against the token's allow-list: a missing or unknown token is 401 / UNAUTHENTICATED, a known token asking for a model
outside its list or without the scope 403 / PERMISSION_DENIED (the list of served models is never
revealed to it).

Tokens are compared in constant time (:func:`hmac.compare_digest` over SHA-256 digests, against
every configured token, no early exit), so timing reveals neither a token nor its length.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypedDict

import grpc

from sloserve.gateway.errors import InvalidArgument, ServingError
from sloserve.gateway.tokens import Principal, TokenTable, bearer_token
from sloserve.gateway.transports.status import http_status, set_grpc_error

OPEN_HTTP_PATHS = frozenset(
    {
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/openapi.json",
    }
)
_SERVICE = "/inference.GRPCInferenceService/"
# The caller of the request being handled (set by the REST middleware and the gRPC interceptor around
# the handler; None when no token is configured): what lists of models filter by.
_PRINCIPAL: ContextVar[Principal | None] = ContextVar("sloserve_principal", default=None)


def may_see(model: str) -> bool:
    """Whether the request being handled may see ``model``: always when no token is configured,
    else when the token's list holds it (the repository index shows a token only its models)."""
    principal = _PRINCIPAL.get()
    return principal is None or principal.may_use(model)


OPEN_GRPC_METHODS = frozenset(_SERVICE + m for m in ("ServerLive", "ServerReady", "ServerMetadata"))


class BearerAuthMiddleware:
    """Refuses protected HTTP requests without a valid token; the model comes from the path."""

    def __init__(self, app: Callable, table: TokenTable):
        self.app = app
        self.table = table

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_HTTP_PATHS:
            await self.app(scope, receive, send)
            return
        auth = None
        for k, v in scope.get("headers", ()):
            if k == b"authorization":
                auth = v.decode("latin-1")
                break
        try:
            principal = self.table.authorize(auth, _model_from_path(scope["path"]), _scope_of(scope["path"]))
        except ServingError as e:
            await _send_error(send, e)
            return
        token = _PRINCIPAL.set(principal)
        try:
            await self.app(scope, receive, send)
        finally:
            _PRINCIPAL.reset(token)


def _scope_of(path: str) -> str:
    """The scope an HTTP path needs (sloserve/gateway/tokens.py): metrics, training, models, else inference."""
    if path in ("/metrics", ALL_STATS_PATH):
        return "metrics"
    if path == "/v2/training" or path.startswith("/v2/training/"):
        return "training"
    if path == "/v2/repository" or path.startswith("/v2/repository/"):
        return "models"
    return "infer"


ALL_STATS_PATH = "/v2/models/stats"


def _model_from_path(path: str) -> str | None:
    parts = path.split("/")
    # /v2/models/{model}[/...] (not /v2/models/stats, every model's), /v2/repository/models/{model}/...
    if len(parts) >= 4 and parts[1] == "v2" and parts[2] == "models" and parts[3] and path != ALL_STATS_PATH:
        return parts[3]
    if len(parts) >= 5 and parts[1:4] == ["v2", "repository", "models"] and parts[4]:
        return parts[4]
    return None


GRPC_SCOPES = {
    _SERVICE + "RepositoryIndex": "models",
    _SERVICE + "RepositoryModelLoad": "models",
    _SERVICE + "RepositoryModelUnload": "models",
}


def _grpc_scope(method: str, request: Any) -> str:
    """The scope a gRPC call needs: ``models`` for the repository API, ``metrics`` for every model's
    statistics (ModelStatistics without a name), else ``infer``."""
    if method == _SERVICE + "ModelStatistics" and not getattr(request, "name", ""):
        return "metrics"
    return GRPC_SCOPES.get(method, "infer")


async def _send_error(send: Callable, e: ServingError) -> None:
    import orjson

    body = orjson.dumps({"error": e.message})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if http_status(e) == 401:
        headers.append((b"www-authenticate", b'Bearer realm="sloserve"'))
    await send({"type": "http.response.start", "status": http_status(e), "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ---- gRPC: a server interceptor -----------------------------------------------------------------
class _Malformed:
    """Stands in for a request whose protobuf did not parse, so the handler can answer 400."""

    __slots__ = ("error",)

    def __init__(self, error: str):
        self.error = error


def _safe_deserializer(deser: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deser is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deser(data)
        except Exception as e:
            return _Malformed(f"malformed protobuf request: {type(e).__name__}: {e}"[:300])

    return parse


class GrpcGuard(grpc.aio.ServerInterceptor):
    """Malformed protobuf -> INVALID_ARGUMENT (grpc would say INTERNAL); tokens when configured.

    Installed always for the first, the token check only acts when ``table`` is not None.
    """

    def __init__(self, table: TokenTable | None, deserializers: dict[str, Callable[[bytes], Any]] | None = None):
        self.table = table
        self.deserializers = deserializers or {}  # method -> its own request parser (its errors guarded too)

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            if handler is not None and self.table is not None and details.method not in OPEN_GRPC_METHODS:
                return _deny_streaming(handler, self.table, details)
            return handler
        inner = handler.unary_unary
        table = self.table if details.method not in OPEN_GRPC_METHODS else None
        auth = _metadata_get(details.invocation_metadata, "authorization") if table is not None else None

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            # Refusals set the status and return (set_grpc_error says why not abort()).
            if table is not None:
                try:
                    if details.method == _SERVICE + "ModelStatistics":  # its scope depends on the request
                        table.authorize(auth, None, "metrics" if _may(table, auth, "metrics") else "infer")
                    else:
                        table.authorize(auth, None, GRPC_SCOPES.get(details.method, "infer"))
                except ServingError as e:
                    return set_grpc_error(context, e)
            if isinstance(request, _Malformed):
                return set_grpc_error(context, InvalidArgument(request.error))
            if table is None:
                return await inner(request, context)
            model = getattr(request, "model_name", None)
            if model is None:
                model = getattr(request, "name", None)
            try:
                scope = _grpc_scope(details.method, request)
                principal = table.authorize(
                    auth, model if isinstance(model, str) and scope != "metrics" else None, scope
                )
            except ServingError as e:
                return set_grpc_error(context, e)
            token = _PRINCIPAL.set(principal)
            try:
                return await inner(request, context)
            finally:
                _PRINCIPAL.reset(token)

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=_safe_deserializer(
                self.deserializers.get(details.method, handler.request_deserializer)
            ),
            response_serializer=handler.response_serializer,
        )


def _may(table: TokenTable, auth: str | None, scope: str) -> bool:
    principal = table.lookup(bearer_token(auth))
    return principal is not None and scope in principal.scopes


def _deny_streaming(handler: Any, table: TokenTable, details: grpc.HandlerCallDetails) -> Any:
    auth = _metadata_get(details.invocation_metadata, "authorization")
    if table.lookup(bearer_token(auth)) is not None:
        return handler

    async def deny(request_or_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or invalid bearer token: send metadata authorization: Bearer <token>",
        )

    kind = {
        (True, True): grpc.stream_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return kind(
        deny, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
    )


def _metadata_get(md: Any, key: str) -> str | None:
    for k, v in md or ():
        if k == key:
            return v.decode("latin-1") if isinstance(v, bytes) else v
    return None


# ---- TLS ----------------------------------------------------------------------------------------
def grpc_server_credentials(settings: Any) -> grpc.ServerCredentials | None:
    if settings.tls_cert_file is None:
        return None
    key = Path(settings.tls_key_file).read_bytes()
    cert = Path(settings.tls_cert_file).read_bytes()
    return grpc.ssl_server_credentials([(key, cert)])


class UvicornTLS(TypedDict, total=False):
    """The keywords of ``uvicorn.Config`` that turn TLS on (none: plain HTTP)."""

    ssl_certfile: str
    ssl_keyfile: str


def uvicorn_tls_kwargs(settings: Any) -> UvicornTLS:
    if settings.tls_cert_file is None:
        return {}
    return {"ssl_certfile": str(settings.tls_cert_file), "ssl_keyfile": str(settings.tls_key_file)}
