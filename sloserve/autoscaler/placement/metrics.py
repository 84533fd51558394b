"""How the GPUs are used: by inference, by training, by both, or idle. Pure: the live placement
controller exports it (``sloserve_gpus{gpu_type,use}``, sloserve/gateway/metrics.py) and the simulator
integrates it into GPU-hours by use."""

from __future__ import annotations

from sloserve.autoscaler.placement.types import PlacementSnapshot

USES = ("inference", "training", "shared", "idle")


def gpu_usage(snapshot: PlacementSnapshot) -> dict[tuple[str, str], int]:
    """{(gpu_type, use): count} for every type and use (zeros included)."""
    with_replica = {r.gpu_id for r in snapshot.replicas}
    with_job = {g for j in snapshot.jobs for g in j.gpu_ids}
    out = {(g.gpu_type, u): 0 for g in snapshot.gpus for u in USES}
    for g in snapshot.gpus:
        r, j = g.gpu_id in with_replica, g.gpu_id in with_job
        use = "shared" if (r and j) else "inference" if r else "training" if j else "idle"
        out[(g.gpu_type, use)] += 1
    return out
