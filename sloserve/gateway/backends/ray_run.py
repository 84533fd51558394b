"""One batch on a Ray Serve replica, over its batch channel or Serve's handle, bounded in time, and
every way it can fail as a serving error (``sloserve.gateway.errors``): the batcher retries a
:class:`~sloserve.gateway.errors.ReplicaFailed` once and answers the rest."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from sloserve.batching.batcher import RunResult
from sloserve.gateway.backends.ray_channels import ReplicaChannels
from sloserve.gateway.errors import DeadlineExceeded, InternalError, ReplicaFailed

# gRPC codes that mean the replica (or its connection) went away, not that the call itself is wrong.
_REPLICA_GONE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.ABORTED}
)


def late(model: str, variant: str, limit: float, timeout_s: float | None, batch_timeout_s: float) -> DeadlineExceeded:
    """The batch was not back within ``limit``: past its requests' deadlines, or a hung replica."""
    if timeout_s is not None and timeout_s <= batch_timeout_s:
        return DeadlineExceeded(
            f"the batch on '{model}/{variant}' was not back {limit:.2f} s after dispatch, past its "
            f"requests' deadlines plus late_grace_s (its replica may have died and been replaced); "
            f"retry, or raise slo_ms"
        )
    return DeadlineExceeded(
        f"replica for '{model}/{variant}' did not return a batch within batch_timeout_s={batch_timeout_s}"
    )


async def run_on_channel(
    channels: ReplicaChannels,
    app: str,
    model: str,
    variant: str,
    inputs: dict[str, np.ndarray],
    limit: float,
    on_late: Callable[[float], DeadlineExceeded],
    lease_held: bool,
    shared: bool,
) -> RunResult:
    """The batch on the connected replica with the fewest batches in flight, over its channel; with
    none connected (the only one died and Serve is replacing it), it waits for one while ``limit``
    allows, as Serve's own router would. ``lease_held``: the gateway's lease shows a replica, so
    none free means the lease shrank under the batch. ``on_late(limit)``: the error of a late batch."""
    t0 = time.monotonic()
    chan = await channels.wait_for(app, limit)
    if chan is None and lease_held:
        raise ReplicaFailed(  # the lease shrank between the batcher's decision and this batch
            f"this gateway's lease on '{model}/{variant}' has no slot free now; retry shortly",
            retry_after_s=0.1,
        )
    if chan is None:
        raise ReplicaFailed(
            f"no replica of '{model}/{variant}' is connected (Serve is starting or replacing it); retry shortly",
            retry_after_s=1.0,
        )
    limit = max(limit - (time.monotonic() - t0), 1e-3)
    try:
        outputs, compute_s = await asyncio.wait_for(chan.run(inputs, limit, variant if shared else None), limit)
    except TimeoutError:
        raise on_late(limit) from None
    except RuntimeError as e:  # the replica refused the batch (ONNX Runtime's message)
        raise InternalError(f"replica for '{model}/{variant}' failed on this batch: {e!s:.300}") from None
    if outputs is None:  # skipped by the replica: already past the time the gateway waits
        raise on_late(limit)
    return RunResult(outputs, compute_s, chan.info.get("device_type", "cpu"))


async def run_on_handle(
    call: Any, model: str, variant: str, limit: float, on_late: Callable[[float], DeadlineExceeded]
) -> RunResult:
    """Await a Serve handle's ``run_batch`` call within ``limit``.

    Ray Serve 2.60's router itself re-sends a request whose replica died to another replica,
    in an unbounded loop that knows no deadline (serve/_private/router.py); the bound here is
    what turns that into "answered in time, or failed explicitly"."""
    from ray import exceptions as rex

    try:
        outputs, compute_s, device = await asyncio.wait_for(call, limit)
    except TimeoutError:
        call.cancel()
        raise on_late(limit) from None
    except (rex.RayActorError, rex.ActorUnavailableError, rex.WorkerCrashedError, rex.ObjectLostError) as e:
        raise ReplicaFailed(
            f"replica for '{model}/{variant}' died while running this batch ({type(e).__name__})"
        ) from None
    except grpc.aio.AioRpcError as e:  # ray_transport grpc
        if e.code() in _REPLICA_GONE:  # the replica's server went away mid-call: retried once
            raise ReplicaFailed(f"replica for '{model}/{variant}' dropped this batch (gRPC {e.code().name})") from None
        raise InternalError(
            f"the batch for '{model}/{variant}' could not be sent to its replica "
            f"(gRPC {e.code().name}: {e.details()!s:.200}); with a batch over "
            f"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH, raise it on the Ray nodes "
            f"or set ray_transport: object_ref"
        ) from None
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the gateway itself is cancelling this batch (shutdown)
        # the replica's own call was cancelled under it (it died, or Serve dropped the call)
        raise ReplicaFailed(f"replica for '{model}/{variant}' cancelled this batch") from None
    except rex.RayTaskError as e:
        raise InternalError(f"replica for '{model}/{variant}' failed: {e.cause!r:.200}") from None
    return RunResult(outputs, compute_s, device)
