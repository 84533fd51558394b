"""``sloserve serve`` as N gateway processes on one host, started, supervised and stopped as one.

One gateway process is one Python event loop; past a few thousand requests a second it is the
bottleneck while the cores beside it idle. With ``workers`` = N > 1 the command becomes a
supervisor:

- **Ports.** Every worker binds the same HTTP and gRPC ports with ``SO_REUSEPORT`` and the kernel
  spreads new connections over them (a connection stays with its worker). Port 0 is resolved once,
  here, so that all workers share the one port it picks.
- **Ray.** With the Ray backend and no ``ray_address`` the supervisor starts the embedded Ray itself
  (on 127.0.0.1, as a lone gateway would) so that it outlives any one worker; worker 0 deploys the
  Serve applications and the others attach to them. The replicas' slots are shared among the
  workers by leases (sloserve/gateway/backends/ray_capacity.py), and each worker reports its own arrivals to
  the autoscaler with its measured share (Swayam's partial views). With ``ray_address`` every
  worker joins that cluster.
- **Training.** With ``training.enabled`` every worker serves ``/v2/training`` over the same jobs
  directory; one of them, the holder of the directory's leader lock, places the jobs, and another
  takes over within a placement round when it dies (sloserve/training/leader.py). A job's run
  belongs to no worker: killing one leaves it running.
- **Supervision.** A worker that dies is started again (after 1 s, doubling to 30 s while it keeps
  dying within 10 s of its start). Requests in flight on it fail (their connections close); the
  others keep serving, and its lease returns to them within ``TTL_S``.
- **Stop.** SIGTERM/SIGINT stop the workers, each draining as a lone gateway does (worker 0, which
  deployed, last), then the embedded Ray.
- **Metrics.** A scrape of the shared port answers for every worker (sloserve/gateway/metrics_fanin.py).
- **Models.** The repository API's load and unload through any worker change every worker's models:
  they go through the cluster's model book (sloserve/gateway/backends/ray_book.py, sloserve/gateway/modelsync.py),
  and a restarted worker serves the model set the book holds, not the one it started with.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

import psutil

from sloserve.gateway import earlystop
from sloserve.gateway.backends.proctree import die_with_parent
from sloserve.gateway.config import Settings, WorkerRole

log = logging.getLogger("sloserve.workers")
RESTART_S = 1.0
RESTART_MAX_S = 30.0
STABLE_S = 10.0  # a worker that lived this long restarts after RESTART_S again


def available_cores(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The cores this process may use: its CPU affinity, and in a container its CPU limit (cgroup v2
    ``cpu.max``, e.g. a Kubernetes pod's ``limits.cpu``), not the node's core count."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = cgroup_cpu_max.read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    return cores


def default_workers(cores: int | None = None) -> int:
    """Half the cores this process may use, at most 8; 1 on 2 cores (the replicas and the load need
    the other)."""
    cores = cores or available_cores()
    return 1 if cores <= 2 else min(cores // 2, 8)


def workers_of(settings: Settings) -> int:
    return settings.workers or default_workers()


def _reserve_port(host: str, port: int) -> tuple[int, socket.socket | None]:
    """Port 0 resolved to a free port, held (bound with SO_REUSEPORT, not listening: it takes no
    connection) until the service stops, so no other program takes it between two worker starts."""
    if port != 0:
        return port, None
    from sloserve.gateway.server import reuse_port_socket

    sock = reuse_port_socket(host, 0)
    return sock.getsockname()[1], sock


def _worker_main(settings: Settings, role: WorkerRole) -> None:
    """A worker process: one gateway, as ``sloserve serve`` runs it alone."""
    import asyncio
    import faulthandler

    die_with_parent()  # the supervisor killed outright: stop too
    logging.basicConfig(
        level=settings.log_level.upper(), format=f"%(asctime)s %(levelname)s %(name)s[w{role.index}]: %(message)s"
    )
    faulthandler.enable(all_threads=True)
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    from sloserve.gateway.server import serve

    code = 0
    try:
        asyncio.run(serve(settings, role))
    except FileNotFoundError as e:  # the repository went away: every start would fail the same way
        print(f"sloserve: {e}", file=sys.stderr, flush=True)
        code = 2
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)  # as `sloserve serve` does: native destructors may crash an interpreter's teardown


class Supervisor:
    def __init__(self, settings: Settings, count: int):
        self.settings = settings
        self.count = count
        self.run_dir = Path(tempfile.mkdtemp(prefix="sloserve-workers-"))
        os.chmod(self.run_dir, 0o700)  # the metrics sockets: this user's only
        self.http_port, self._http_hold = _reserve_port(settings.host, settings.http_port)
        self.grpc_port, self._grpc_hold = _reserve_port(settings.host, settings.grpc_port)
        self.ray_address: str | None = None
        self.started_ray = False
        self._ctx = multiprocessing.get_context("spawn")
        self.procs: dict[int, multiprocessing.process.BaseProcess] = {}
        self._started_at: dict[int, float] = {}
        self._backoff: dict[int, float] = {}
        self._due: dict[int, float] = {}
        self._deployed = False
        self.stopping = False

    # ---- the embedded Ray -------------------------------------------------------------------
    def start_ray(self) -> None:
        if self.settings.backend != "ray" or self.settings.ray_address:
            return
        from sloserve.gateway.backends.ray_local import init_ray

        autoscaled = any(o.autoscaling for o in self.settings.models.values())
        self.started_ray = init_ray(self.settings, autoscaled=autoscaled)
        import ray

        self.ray_address = ray.get_runtime_context().gcs_address
        from ray import serve

        serve.start(proxy_location="Disabled")  # once, here: workers starting it together would race

    def stop_ray(self) -> None:
        if self.started_ray:
            from sloserve.gateway.backends.ray_local import shutdown_ray

            shutdown_ray([], started=True)

    # ---- workers ----------------------------------------------------------------------------
    def worker_settings(self, index: int) -> Settings:
        s = self.settings
        update: dict = {"http_port": self.http_port, "grpc_port": self.grpc_port, "workers": self.count}
        if self.ray_address is not None:
            update["ray_address"] = self.ray_address
        return s.model_copy(update=update)

    def spawn(self, index: int) -> None:
        # worker 0 deploys the applications once; a restarted worker 0 attaches to them like the others
        deploys = index == 0 and not self._deployed
        role = WorkerRole(index, self.count, self.run_dir, loopback_ray=self.started_ray, deploys=deploys)
        p = self._ctx.Process(
            target=_worker_main, args=(self.worker_settings(index), role), name=f"sloserve-worker-{index}"
        )
        p.start()
        if index == 0:
            self._deployed = True
        self.procs[index] = p
        self._started_at[index] = time.monotonic()

    def watch(self) -> int | None:
        """Start again any worker that died (with a back-off while it keeps dying young). A worker that
        exits with 2 (a bad setting or model: every start would fail the same way) ends the service:
        returns 2."""
        now = time.monotonic()
        for i, p in list(self.procs.items()):
            if p.is_alive() or self.stopping:
                continue
            if p.exitcode == 2:
                print(f"sloserve: worker {i} could not start (see above); stopping the service", file=sys.stderr)
                return 2
            if i not in self._due:
                lived = now - self._started_at[i]
                backoff = (
                    RESTART_S if lived >= STABLE_S else min(self._backoff.get(i, RESTART_S / 2) * 2, RESTART_MAX_S)
                )
                self._backoff[i] = backoff
                self._due[i] = now + backoff
                print(
                    f"sloserve: worker {i} (pid {p.pid}) exited with {p.exitcode}; starting it again in {backoff:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
            elif now >= self._due[i]:
                del self._due[i]
                self.spawn(i)
        return None

    def stop_workers(self, grace_s: float) -> None:
        """SIGTERM: the attached workers first, then worker 0 (it deployed); any still there after
        their drain and a margin are killed with their process trees."""
        self.stopping = True
        order = [[i for i in self.procs if i != 0], [0] if 0 in self.procs else []]
        for group in order:
            for i in group:
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(self.procs[i].pid or 0, signal.SIGTERM)
            end = time.monotonic() + grace_s + 15.0
            for i in group:
                self.procs[i].join(max(end - time.monotonic(), 0.1))
                if self.procs[i].is_alive():
                    log.warning("worker %d did not stop in time; killing it", i)
                    with contextlib.suppress(psutil.Error):
                        proc = psutil.Process(self.procs[i].pid)
                        for child in [proc, *proc.children(recursive=True)]:
                            with contextlib.suppress(psutil.Error):
                                child.kill()
                    self.procs[i].join(5.0)

    def close(self) -> None:
        for sock in (self._http_hold, self._grpc_hold):
            if sock is not None:
                sock.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        # the resource tracker multiprocessing started with the first worker would outlive us as an orphan
        tracker: Any = resource_tracker._resource_tracker  # private: not in typeshed
        if getattr(tracker, "_pid", None) is not None:
            with contextlib.suppress(OSError):  # (already reaped with Ray's processes)
                tracker._stop()


def run_workers(settings: Settings, count: int) -> int:
    """Run the service until SIGTERM/SIGINT; returns the exit code. The model repository is checked
    first, as a lone gateway checks it, so a missing or broken one ends the command with 2 before Ray or
    any worker starts."""
    from sloserve.gateway.backends.base import ModelLoadError
    from sloserve.gateway.server import load_repository

    try:
        load_repository(settings)
    except (FileNotFoundError, ModelLoadError) as e:
        print(f"sloserve: {e}", file=sys.stderr, flush=True)
        return 2
    sup = Supervisor(settings, count)
    stop = {"now": earlystop.requested()}  # a stop that came while the repository loaded

    def on_signal(signum, frame) -> None:
        stop["now"] = True

    def take_signals() -> None:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    take_signals()
    try:
        if stop["now"]:
            return 0
        sup.start_ray()
        take_signals()  # ray.init may have installed its own
        if stop["now"]:
            return 0
        print(
            f"sloserve: {count} gateway workers on HTTP {settings.host}:{sup.http_port}, gRPC "
            f"{settings.host}:{sup.grpc_port} ({settings.backend} backend)",
            flush=True,
        )
        for i in range(count):
            sup.spawn(i)
        code = None
        while not stop["now"] and code is None:
            time.sleep(0.2)
            code = sup.watch()
        print("sloserve: stopping the workers", flush=True)
        sup.stop_workers(settings.shutdown_grace_s)
        return code or 0
    finally:
        sup.stopping = True
        if any(p.is_alive() for p in sup.procs.values()):
            sup.stop_workers(settings.shutdown_grace_s)
        sup.stop_ray()
        sup.close()
