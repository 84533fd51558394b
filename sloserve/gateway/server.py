"""Run the gateway: REST (uvicorn) and gRPC (grpc.aio) on one event loop over one DataPlane.

SIGINT and SIGTERM stop both servers, drain in-flight batches, and stop the backend (and with it
any Ray the gateway started), so no process is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import signal
import socket
import sys

import grpc
import uvicorn

from sloserve.gateway import earlystop, tracing
from sloserve.gateway.backends.base import Backend, ModelLoadError
from sloserve.gateway.backends.ray_book import shared_models
from sloserve.gateway.backends.threads import InProcessBackend
from sloserve.gateway.config import Settings, WorkerRole, is_loopback
from sloserve.gateway.dataplane import DataPlane
from sloserve.gateway.metrics import Metrics
from sloserve.gateway.metrics_fanin import MetricsFanIn
from sloserve.gateway.modelsync import SharedModels
from sloserve.gateway.rates import gateway_id
from sloserve.gateway.transports.auth import uvicorn_tls_kwargs
from sloserve.gateway.transports.connguard import ConnectionGuard, guarded_protocol
from sloserve.gateway.transports.grpc import create_server
from sloserve.gateway.transports.nvmetrics import TritonMetricsServer
from sloserve.gateway.transports.rest import create_asgi, rest_decoder
from sloserve.gateway.transports.restdecode import RestDecoder
from sloserve.models.repository import ModelProblem, ModelRepository
from sloserve.replica.runtime import RuntimeOptions

log = logging.getLogger("sloserve")
GC_THRESHOLDS = (10_000, 20, 20)  # young collections every 10k allocations, not 700: fewer, still short


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal capture: the Gateway owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


def make_backend(settings: Settings, repo: ModelRepository, role: WorkerRole | None = None) -> Backend:
    opts = RuntimeOptions(
        intra_op_threads=settings.intra_op_threads, allow_spinning=settings.allow_spinning, device=settings.device
    )
    if settings.backend == "inprocess":
        return InProcessBackend(
            repo,
            opts,
            instances=settings.instances,
            inline_below_s=settings.inline_below_us / 1e6,
            fault_delay_s={m: o.fault_delay_ms / 1e3 for m, o in settings.models.items()},
            batch_timeout_s=settings.batch_timeout_s,
            pipeline_depth=settings.inprocess_pipeline_depth or (2 if settings.replica_processes else 1),
            processes=settings.replica_processes,
            shared={m for m, o in settings.models.items() if o.shared_replicas},
            device_types={m: o.devices() for m, o in settings.models.items() if len(o.devices()) > 1},
            device_cost=settings.device_cost,
            slo_ms={m: o.slo_ms for m, o in settings.models.items() if o.slo_ms},
        )
    from sloserve.gateway.backends.ray import RayServeBackend

    return RayServeBackend(
        repo,
        opts,
        settings,
        loopback_ray=role is not None and role.loopback_ray,
        deploy_at_start=role is None or role.deploys,
    )


def load_repository(settings: Settings) -> ModelRepository:
    """The model repository, or :class:`ModelLoadError` naming what is wrong with a model folder
    (every file is parsed and checked against its config here, by the one check of
    ``sloserve.models.repository.load_model_dir``: Ray replicas load their files in other processes, and a
    broken one stops start-up at once instead of failing replicas in a loop)."""
    try:
        return ModelRepository(settings.repo).load()
    except ModelProblem as e:
        raise ModelLoadError(f"{e}; fix it (`sloserve models check {settings.repo}`) or remove its model") from None


class Gateway:
    """One gateway process. ``role``: one of several workers sharing the host's ports (sloserve/gateway/workers.py)."""

    def __init__(self, settings: Settings, backend: Backend | None = None, role: WorkerRole | None = None):
        self.settings = settings
        self.role = role
        tracing.setup(settings)  # this process's tracer, before the batchers that use it (sloserve/gateway/tracing.py)
        self.repo = load_repository(settings)
        self.backend = backend or make_backend(settings, self.repo, role)
        self.dataplane = DataPlane(self.repo, self.backend, settings, Metrics())
        if tracing.TRACER is not None:
            tracing.register_metrics(self.dataplane.metrics.registry)
        self.fanin: MetricsFanIn | None = None
        if role is not None and role.count > 1:
            self.fanin = self.dataplane.metrics.fanin = MetricsFanIn(self.dataplane.metrics.registry, role)
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._uvicorn: _Uvicorn | None = None
        self._uv_task: asyncio.Task | None = None
        self.triton_metrics: TritonMetricsServer | None = None  # Triton's metrics port (triton_metrics)
        self._grpc: grpc.aio.Server | None = None
        self._decoder: RestDecoder | None = None
        self._conn_guard = ConnectionGuard.from_settings(settings)
        self._prepared = False
        self.harvest = None
        if settings.training.enabled:  # preemptible training on idle GPUs (sloserve/training/controller.py)
            from sloserve.training.controller import HarvestController

            # worker 0 stops last (sloserve/gateway/workers.py): only it checkpoints the running jobs on a stop
            last = role is None or role.index == 0
            self.harvest = HarvestController(settings, self.backend, self.dataplane.metrics, last_to_stop=last)

    def prepare(self) -> None:
        """What must run before any server thread exists (idempotent; ``start`` calls it too).

        The embedded Ray forks its GCS and raylet and runs Python between fork and exec; done from
        an executor thread while the gRPC server's threads are live, Ray's GCS child can fail to come
        up (an empty session log directory, then a 2x120 s timeout). Here it runs on the main thread
        of a process that is still a plain Ray driver."""
        if not self._prepared:
            self._prepared = True
            self.backend.prepare()
            if shared_models(self.settings):  # one model set with the other gateways (sloserve/gateway/modelsync.py)
                manager = self.dataplane.repository
                shared = SharedModels(manager, gateway_id())
                manager.shared = shared
                dropped = shared.drop_unserved()
                if dropped:
                    log.info("not serving %s: the model book says other gateways unloaded them", dropped)

    async def start(self) -> None:
        s = self.settings
        self.prepare()
        shared = self.role is not None
        if shared:  # a worker joins the shared ports only once it can serve: the kernel sends it connections at once
            await self._start_models()
        self._grpc, self.grpc_port = create_server(self.dataplane, f"{s.host}:{s.grpc_port}", reuse_port=shared)
        await self._grpc.start()
        routers = []
        if self.harvest is not None:
            from sloserve.gateway.tokens import TokenTable
            from sloserve.gateway.transports.training import training_router

            tokens = TokenTable.from_settings(s)  # None: the training routes answer 401 saying how to add one
            routers.append(training_router(self.harvest.jobs_api, self.harvest.report, tokens))
        self._decoder = rest_decoder(self.dataplane)
        self._decoder.start()
        app = create_asgi(self.dataplane, routers, self._decoder)
        cfg = uvicorn.Config(
            app,
            host=s.host,
            port=s.http_port,
            log_level="warning",
            access_log=False,
            proxy_headers=False,  # nothing reads the client's address; X-Forwarded-* is not parsed per request
            lifespan="off",
            loop="none",
            # httptools, with header, body and per-client guards; max_connections counts requests in
            # flight there, not open connections (sloserve/gateway/transports/connguard.py)
            http=guarded_protocol(self._conn_guard),
            timeout_keep_alive=int(math.ceil(s.idle_timeout_s)),  # (uvicorn takes whole seconds)
            timeout_graceful_shutdown=int(math.ceil(s.shutdown_grace_s)),
            **uvicorn_tls_kwargs(s),
        )
        self._uvicorn = _Uvicorn(cfg)
        # workers bind the same port, each its own listening socket (SO_REUSEPORT): the kernel spreads connections
        sockets = [reuse_port_socket(s.host, s.http_port)] if shared else None
        self._uv_task = asyncio.get_running_loop().create_task(self._uvicorn.serve(sockets=sockets))
        while not self._uvicorn.started:
            if self._uv_task.done():
                self._uv_task.result()
                raise RuntimeError(f"HTTP server failed to start on {s.host}:{s.http_port}")
            await asyncio.sleep(0.01)
        self.http_port = self._uvicorn.servers[0].sockets[0].getsockname()[1]
        if s.triton_metrics:
            nv_sock = reuse_port_socket(s.host, s.triton_metrics_port) if shared else None
            self.triton_metrics = TritonMetricsServer(self.dataplane, nv_sock)
            await self.triton_metrics.start()
        if self.fanin is not None:
            await self.fanin.start()
        if not shared:  # models load while the servers already answer liveness (readiness says not ready)
            await self._start_models()
        if self.harvest is not None:
            self.harvest.start()
        # Everything loaded so far lives as long as the server: freeze it out of the collector's
        # sight, so that full collections under load walk only what requests allocate, not the whole
        # heap of loaded modules (a tail of tens of ms per collection otherwise).
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        log.info(
            "sloserve ready: HTTP %s:%d  gRPC %s:%d  backend=%s models=%s",
            s.host,
            self.http_port,
            s.host,
            self.grpc_port,
            self.backend.name,
            sorted(self.repo.models),
        )

    async def _start_models(self) -> None:
        await self.dataplane.start()
        if self.dataplane.repository.shared is not None:
            await self.dataplane.repository.shared.start()

    async def stop(self) -> None:
        """Drain, then stop: not ready and new requests refused at once, the ones in flight given
        ``shutdown_grace_s`` to finish on both transports."""
        grace = self.settings.shutdown_grace_s
        self.dataplane.drain()
        if self._uvicorn is not None:
            self._uvicorn.config.timeout_graceful_shutdown = int(math.ceil(grace))
            self._uvicorn.should_exit = True
        idle = asyncio.ensure_future(self._close_idle_connections(grace))
        if self._grpc is not None:
            await self._grpc.stop(grace=grace)
        if self._uv_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._uv_task, timeout=grace + 3)
        idle.cancel()
        if self.triton_metrics is not None:
            await self.triton_metrics.stop()
        self._conn_guard.stop()
        if self.harvest is not None:  # checkpoint running jobs before Ray goes away
            await asyncio.get_running_loop().run_in_executor(None, self.harvest.stop)
        if self._decoder is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._decoder.close)
        if self.dataplane.repository.shared is not None:
            await self.dataplane.repository.shared.stop()
        await self.dataplane.stop()
        if self.fanin is not None:
            await self.fanin.stop()
        if tracing.TRACER is not None:  # the spans still queued go out (bounded by the export timeout)
            await asyncio.get_running_loop().run_in_executor(None, tracing.shutdown)

    async def _close_idle_connections(self, grace: float) -> None:
        """Once every request in flight is answered, stop waiting for idle keep-alive connections:
        uvicorn waits for each to close, and a TLS one whose client never answers the close alert
        holds the shutdown for the whole grace period."""
        loop = asyncio.get_running_loop()
        end = loop.time() + grace
        while self.dataplane.open_requests > 0 and loop.time() < end:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the last answers' bytes leave the socket
        if self._uvicorn is not None:
            self._uvicorn.force_exit = True


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with SO_REUSEPORT, for uvicorn to listen on: every worker
    of the service binds one (only processes of the same user may join the port)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(addr)
    return sock


async def serve(settings: Settings, role: WorkerRole | None = None) -> None:
    try:
        gw = Gateway(settings, role=role)
    except ModelLoadError as e:
        print(f"sloserve: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def take_signals() -> None:
        # ray.init installs Ray's own SIGTERM handler (and its C-level failure-signal handler) over
        # ours: either would end the process half-way through a graceful stop. Take them back.
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)  # replaces whatever Python-level handler was there

    take_signals()
    try:
        if earlystop.requested():  # SIGTERM/SIGINT before this point: stop before Ray starts
            print("sloserve: stop requested during start-up; shutting down", flush=True)
            return
        try:
            gw.prepare()  # the embedded Ray starts here, before any server thread (see Gateway.prepare)
        except SystemExit:  # SIGTERM inside ray.init: Ray's handler raised it, and Ray has cleaned up
            print("sloserve: stop requested during start-up; shutting down", flush=True)
            return
        take_signals()  # in case ray.init installed its own handler after all
        starting = loop.create_task(gw.start())
        stopping = loop.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # SIGTERM/SIGINT while models load: stop now, not once they are up
            print("sloserve: stop requested during start-up; shutting down", flush=True)
            starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
            return
        stopping.cancel()
        starting.result()
        print(
            f"sloserve serving HTTP on {settings.host}:{gw.http_port}, gRPC on {settings.host}:{gw.grpc_port}"
            f" ({gw.backend.name} backend)",
            flush=True,
        )
        if not is_loopback(settings.host) and settings.tls_cert_file is None:
            print(
                f"sloserve: WARNING: serving {settings.host} without TLS: bearer tokens and tensors cross the "
                "network in clear text; set tls_cert_file and tls_key_file, or terminate TLS in front of the gateway",
                file=sys.stderr,
                flush=True,
            )
        await stop.wait()
        print("sloserve: shutting down", flush=True)
    except ModelLoadError as e:
        print(f"sloserve: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    finally:
        await gw.stop()
