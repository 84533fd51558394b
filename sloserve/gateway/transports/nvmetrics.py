"""Triton's metrics port (``triton_metrics``): ``GET /metrics`` answering the ``nv_inference_*`` families
(``sloserve/gateway/triton_metrics.py``), on ``triton_metrics_port`` (8002, Triton's convention), bound to
the gateway's ``host``, behind the same bearer auth (``metrics`` scope), TLS and Host check as the REST port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sloserve.gateway.dataplane import DataPlane
from sloserve.gateway.transports.auth import BearerAuthMiddleware, TokenTable, uvicorn_tls_kwargs
from sloserve.gateway.transports.door import FrontDoor
from sloserve.gateway.triton_metrics import CONTENT_TYPE, triton_exposition


def create_triton_metrics_asgi(dp: DataPlane) -> Callable:
    async def metrics(request: Request) -> Response:
        text = (await dp.metrics.exposition()).decode()
        return Response(triton_exposition(text), media_type=CONTENT_TYPE)

    app: Callable = Starlette(routes=[Route("/metrics", metrics)])
    tokens = TokenTable.from_settings(dp.settings)
    if tokens is not None:
        app = BearerAuthMiddleware(app, table=tokens)
    return FrontDoor.from_settings(app, dp.settings)


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture: the gateway owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class TritonMetricsServer:
    """The metrics port's uvicorn, on the gateway's event loop. ``sock``: a socket already bound (a
    worker of several shares the port through SO_REUSEPORT); None binds ``host:triton_metrics_port``."""

    def __init__(self, dp: DataPlane, sock: socket.socket | None = None):
        s = dp.settings
        self.host = s.host
        self.port: int = s.triton_metrics_port
        cfg = uvicorn.Config(
            create_triton_metrics_asgi(dp),
            host=s.host,
            port=s.triton_metrics_port,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            lifespan="off",
            loop="none",
            **uvicorn_tls_kwargs(s),
        )
        self._server = _Server(cfg)
        self._sockets = [sock] if sock is not None else None
        self._task: asyncio.Task | None = None

    async def start(self) -> int:
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=self._sockets))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError(f"Triton metrics server failed to start on {self.host}:{self.port}")
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=5)
            except (TimeoutError, asyncio.CancelledError):
                self._task.cancel()
