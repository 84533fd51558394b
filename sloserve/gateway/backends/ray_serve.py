"""What the Ray backend tells Ray Serve and reads back from it: a deployment's autoscaling config
(the swayam policy on the variant's profile) and the controller's details of the applications
(replica states, a deployment Serve gave up on). Plain dicts in, plain dicts out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sloserve.batching.profile import ProfileTable
from sloserve.gateway.backends.ray_local import METRICS_PUSH_S
from sloserve.gateway.config import ModelOverride
from sloserve.models.repository import ModelConfig


def swayam_autoscaling(
    over: ModelOverride,
    cfg: ModelConfig,
    table: ProfileTable,
    device_type: str,
    variant: str,
    shared: bool,
    split_types: list[str] | None = None,
    type_cost: dict[str, float] | None = None,
) -> dict[str, Any] | None:
    """Ray Serve's autoscaling config for ``variant`` of the model ``cfg`` when its settings
    (``over.autoscaling``) ask for one: the swayam policy on the variant's p99 profile on
    ``device_type``, and on a shared deployment the next variant down as its fallback.

    ``split_types``: the device types the variant runs on when this deployment is one of them and
    they share the model's demand (``sloserve.autoscaler.typesplit``): each type's profile, throughput-table
    entry (``sloserve.autoscaler.placement.cost``), ``type_cost`` (1 where not given) and max_replicas go to
    the policy, which sizes this type for its part."""
    a = over.autoscaling
    if a is None:
        return None
    model = cfg.name

    def points(v: str) -> tuple[list[int], list[float]]:
        curve = table.curve(model, v, device_type)
        if curve is None:  # no profile yet: a conservative 1 ms + 0.2 ms/row prior
            sizes = [1, cfg.max_batch_size]
            return sizes, [1.0 + 0.2 * b for b in sizes]
        return list(curve.batch_sizes), [x * 1e3 for x in curve.p99_s]

    sizes, p99 = points(variant)
    fallback = {}
    ranked = [v.name for v in cfg.variants_by_accuracy]
    if shared and variant in ranked and ranked.index(variant) + 1 < len(ranked):
        # the next variant down is the shared replicas' fallback: swayam sizes its warm buffer with it
        fb_sizes, fb_p99 = points(ranked[ranked.index(variant) + 1])
        fallback = {"fallback_batch_sizes": fb_sizes, "fallback_p99_ms": fb_p99}
    split = {}
    if split_types and len(split_types) > 1:
        from sloserve.autoscaler.placement.cost import throughputs_from_profile

        slo_s = (over.slo_ms if over.slo_ms else cfg.slo_ms) / 1e3
        tput = throughputs_from_profile(table, [(model, variant)], split_types, {model: slo_s}, cfg.max_batch_size)
        types = {}
        for t in split_types:
            curve = table.curve(model, variant, t)
            t_sizes, t_p99 = (list(curve.batch_sizes), [x * 1e3 for x in curve.p99_s]) if curve else points(variant)
            types[t] = {
                "batch_sizes": t_sizes,
                "p99_ms": t_p99,
                "throughput_rps": tput.get((model, variant, t), 0.0),
                "cost": (type_cost or {}).get(t, 1.0),
                "max_replicas": a.max_replicas,
            }
        split = {"split": {"own": device_type, "types": types}}
    return {
        "min_replicas": a.min_replicas,
        "max_replicas": a.max_replicas,
        "initial_replicas": a.min_replicas,
        "upscale_delay_s": 0.0,
        "downscale_delay_s": 0.0,
        # Ray averages custom metrics over look_back_period_s, which must exceed the push interval.
        "metrics_interval_s": METRICS_PUSH_S,
        "look_back_period_s": max(a.interval_s, 2 * METRICS_PUSH_S),
        "policy": {
            "policy_function": "sloserve.gateway.backends.ray_policy:SwayamRayPolicy",
            "policy_kwargs": {
                "slo_ms": over.slo_ms if over.slo_ms else cfg.slo_ms,
                "max_batch_size": cfg.max_batch_size,
                "batch_sizes": sizes,
                "p99_ms": p99,
                **fallback,
                **split,
                "swayam": a.swayam(),
            },
        },
    }


def read_serve_details() -> dict[str, Any] | None:
    """The Serve controller's details of every application, as the plain dict it sends (blocking:
    call it from a thread)."""
    from ray.serve.context import _get_global_client

    client = _get_global_client(raise_if_no_controller_running=False)
    return client.get_serve_details() if client is not None else None


def replica_states(details: dict[str, Any] | None, app: str) -> dict[str, int]:
    """Replicas of ``app``'s deployment by state, in ``details``."""
    counts: dict[str, int] = {}
    st = (details or {}).get("applications", {}).get(app) or {}
    for dep in st.get("deployments", {}).values():
        for r in dep.get("replicas", ()):
            state = str(getattr(r.get("state"), "value", r.get("state")))
            counts[state] = counts.get(state, 0) + 1
    return counts


def deploy_failure(details: dict[str, Any] | None, app: str) -> str | None:
    """Serve's message when it gave up deploying ``app``, else None."""
    st = ((details or {}).get("applications") or {}).get(app) or {}
    status = str(getattr(st.get("status"), "value", st.get("status")))
    if status != "DEPLOY_FAILED":
        return None
    msgs = [str(d.get("message") or "") for d in (st.get("deployments") or {}).values()]
    why = next((m for m in msgs if m), str(st.get("message") or "no message"))
    return f"Ray Serve could not start application {app}: {why[-600:]}"


def deployment_handle(dep: str, app: str, wait_s: float, cancelled: Callable[[], bool]) -> Any:
    """The handle of ``app``'s deployment ``dep``. A gateway that attaches to applications another
    deploys (``ray_deploy`` false: an attached worker, a gateway pod) waits up to ``wait_s`` for them
    to be created (blocking: call it from a thread)."""
    from ray import serve

    end = time.monotonic() + wait_s
    while True:
        try:
            return serve.get_deployment_handle(dep, app_name=app)
        except KeyError:
            if cancelled() or time.monotonic() > end:
                raise
            time.sleep(0.5)


def start_serve() -> None:
    """Start Ray Serve (no HTTP proxy: the gateway is the front door), or join the one running."""
    from ray import serve
    from ray.exceptions import ActorAlreadyExistsError

    try:
        serve.start(proxy_location="Disabled")
    except ActorAlreadyExistsError:  # another gateway started Serve at the same moment: join it
        serve.start(proxy_location="Disabled")
