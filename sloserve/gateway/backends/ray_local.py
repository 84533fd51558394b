"""Starting the gateway's Ray: joining a cluster (``ray_address``), or the embedded local Ray, on
127.0.0.1 only, started on the main thread before any server thread exists (docs/operations.md,
"Start-up and stop"), retried once when a daemon comes up late on a busy box."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import psutil

from sloserve.gateway.backends.proctree import describe, reap
from sloserve.gateway.config import Settings

log = logging.getLogger("sloserve.ray")
METRICS_PUSH_S = 0.5


def startup_timed_out(e: BaseException) -> bool:
    """Did a local ``ray.init`` fail only because a daemon came up late on a busy box? Ray waits a
    fixed time for its raylet ("timed out during startup") and for the GCS to write its port file
    ("Timed out waiting for file .../gcs_server_port_..."); both are worth one more try."""
    msg = str(e)
    return "timed out during startup" in msg or ("Timed out waiting for file" in msg and "gcs_server_port" in msg)


@contextlib.contextmanager
def _ray_keeps_off_sigterm():
    """On the main thread, ``ray.init`` first installs a SIGTERM handler that raises SystemExit, so a
    stop arriving mid-init breaks out of it half-way (a half-initialized core worker has aborted the
    process). The gateway's own handler is already in place, and a stop then takes effect the
    moment ``ray.init`` returns. Ray's hook is private (``ray._private.utils.set_sigterm_handler``):
    if it moves, nothing is patched and the SystemExit path still cleans up (``_init_ray``)."""
    import ray._private.utils as ray_utils

    original = getattr(ray_utils, "set_sigterm_handler", None)
    if original is None:
        yield
        return
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original


def _loopback_node() -> None:
    """The embedded Ray listens on 127.0.0.1 only. Ray binds its servers (GCS, raylet, object
    manager, workers) to the node's IP, and resolves a node IP of 127.0.0.1 to the host's address
    unless Ray clusters are turned off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when ``ray`` is
    imported and in every process Ray starts); the flag only decides that address."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False  # ray is already imported here


def owner_only_token(home: Path | None = None) -> Path | None:
    """Token authentication for the embedded Ray: ``RAY_AUTH_MODE=token`` unless the operator set a
    mode, with a token file only this user may read. Ray's default file (``~/.ray/auth_token``, or
    ``RAY_AUTH_TOKEN_PATH``) is created 0600 when missing, and made 0600 when others could read it:
    whoever reads it can run code on the cluster. Returns the file (None: a token from
    ``RAY_AUTH_TOKEN``, or authentication off by the operator's choice)."""
    if os.environ.setdefault("RAY_AUTH_MODE", "token").lower() != "token":
        return None
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:  # Ray read its config when it was imported: read it again, as Ray itself does
        raylet.Config.initialize("")
    if os.environ.get("RAY_AUTH_TOKEN"):
        return None
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or (home or Path.home()) / ".ray" / "auth_token")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            log.warning("Ray's token file %s was readable by other users; made it owner-only (0600)", path)
            os.chmod(path, 0o600)
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def init_ray(s: Settings, autoscaled: bool, loopback: bool = False) -> bool:
    """Join ``s.ray_address``, or start the embedded Ray (on loopback); True when it started one.
    ``loopback``: the address is an embedded Ray on 127.0.0.1 (the workers' supervisor started it)."""
    if not s.ray_address:  # (before Ray is imported: it reads the mode once)
        owner_only_token()
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray gives its GCS 30 s to come up; a busy 2-core box can take longer.
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
    # Ray's C++ failure-signal handler would take SIGTERM from the gateway's own graceful
    # shutdown and end the process with SIGABRT: the gateway handles its signals itself.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    # A lean embedded Ray for small boxes: Serve's controller reconciles every 0.5 s, not 0.1 s,
    # and Serve's own metrics are exported once a second, not ten times (idle, the controller
    # alone took ~6% of a core; operators can still override both through the environment).
    # Ray starts every worker process (the Serve replicas among them) at niceness 15: on a host whose
    # cores are busy, a replica's batch then waits behind any other runnable process, the gateway and
    # the clients included, and light-load tails grow (a replica computes what the gateway promised).
    # The replicas run at the gateway's priority. Raylets read it when they start: a cluster's nodes
    # need it in their own environment (docs/deployment.md).
    os.environ.setdefault("RAY_worker_niceness", "0")
    os.environ.setdefault("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "0.5")
    os.environ.setdefault("RAY_SERVE_METRICS_EXPORT_INTERVAL_MS", "1000")
    # Replicas push their autoscaling metrics (the gateways' rates) twice a second, not every 10 s;
    # only when a model autoscales: every push is controller CPU, and this box has two cores.
    if autoscaled:
        os.environ.setdefault("RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S", str(METRICS_PUSH_S))
    if loopback:
        _loopback_node()
    with _ray_keeps_off_sigterm():
        return _init_ray_now(ray, s)


def replica_cpus(s: Settings) -> float:
    """The CPUs the replicas a gateway deploys at start-up reserve: every variant of every model in
    ``s.repo`` on each of its device types (one deployment for a model with ``shared_replicas``),
    ``instances`` replicas each,
    ``replica_num_cpus`` apiece. 0 where the repository cannot be read (the gateway says why later)."""
    from sloserve.models.schema import ModelProblem
    from sloserve.models.triton import served_replicas

    total = 0.0
    seen: set[str] = set()
    for folder in sorted(
        p.parent for p in Path(s.repo).glob("*/config.*") if p.name in ("config.json", "config.pbtxt")
    ):
        if folder.name in seen:
            continue
        seen.add(folder.name)
        group = None  # a Triton model's instance_group counts
        try:
            if (folder / "config.json").is_file():
                variants = len(json.loads((folder / "config.json").read_text())["variants"])
            else:  # the config and version folders only: the gateway reads the graphs once, later
                variants, group = served_replicas(folder)
        except (OSError, ValueError, KeyError, TypeError, ModelProblem):
            continue
        over = s.models.get(folder.name)
        types = max(1, len(over.devices())) if over else 1
        deployments = 1 if over and over.shared_replicas else variants * types
        total += deployments * ((over.instances if over else None) or group or s.instances) * s.replica_num_cpus
    return total


def local_cpus(s: Settings) -> int:
    """CPUs the embedded Ray offers when ``ray_num_cpus`` says none: every core, or as many as the
    start-up replicas reserve where that is more (Ray's CPUs are a count it schedules by, and the
    replicas idle between batches: on a two-core box the demo repository's nine replicas reserve 2.25)."""
    return max(os.cpu_count() or 1, math.ceil(replica_cpus(s)))


def _init_ray_now(ray: Any, s: Settings) -> bool:
    if s.ray_address:
        ray.init(address=s.ray_address, namespace="sloserve", log_to_driver=False)
        return False
    resources = {f"accelerator_type:{t}": float(n) for t, n in s.emulated_gpus.items()}
    if os.environ.get("RAY_ADDRESS"):
        log.warning(
            "RAY_ADDRESS=%s is set but ray_address is not: starting an embedded Ray anyway "
            "(set ray_address, or SLOSERVE_RAY_ADDRESS, to join that cluster)",
            os.environ["RAY_ADDRESS"],
        )
    _loopback_node()
    for attempt in (1, 2):
        before = set(psutil.Process().children(recursive=True))
        try:
            # address="local": always a new embedded Ray, never one a `ray start` left on the box
            # (ray.init() alone would attach to it and then refuse num_cpus).
            ray.init(
                address="local",
                num_cpus=s.ray_num_cpus or local_cpus(s),
                num_gpus=sum(s.emulated_gpus.values()) or None,
                resources=resources or None,
                include_dashboard=False,
                namespace="sloserve",
                log_to_driver=False,
                configure_logging=False,
                _node_ip_address="127.0.0.1",
            )
            break
        except BaseException as e:  # cleaned up, then re-raised unless it is a first start-up timeout
            # BaseException: Ray's own SIGTERM handler (installed by ray.init on the main thread)
            # raises SystemExit from inside ray.init; what it started is still ended here.
            started = set(psutil.Process().children(recursive=True)) - before
            timed_out = isinstance(e, Exception) and startup_timed_out(e)
            if timed_out:
                log.warning(
                    "local Ray did not come up in time (%s); the processes it started: %s%s",
                    e,
                    describe(started) or "none",
                    "" if attempt == 2 else "; retrying once",
                )
            ray.shutdown()
            reap(started)
            if not timed_out or attempt == 2:
                raise
    print(
        f"sloserve: started a local Ray at {ray.get_runtime_context().gcs_address} (attach with "
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 in the environment: ray.init(address=...), `ray status --address ...`)",
        flush=True,
    )
    return True


def shutdown_ray(delete_apps: list[str], started: bool) -> None:
    """Leave Ray: delete ``delete_apps`` (the Serve applications this process deployed), and when it
    ``started`` the embedded Ray, shut Serve and Ray down and reap every process they left. Joined to
    a cluster, the driver still disconnects here (the process ends with os._exit, which skips Ray's
    own exit hook)."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    ours = set(psutil.Process().children(recursive=True)) if started else set()
    try:
        for app in delete_apps:
            serve.delete(app, _blocking=False)
        if started:
            serve.shutdown()
    finally:
        ray.shutdown()
        if started:
            reap(ours)
