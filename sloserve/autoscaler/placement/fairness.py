"""Finish-time fairness between tenants (Themis, Mahajan et al., NSDI'20).

A tenant's finish-time fairness is ``rho = T_shared / T_isolated``: how long its jobs took on the
shared cluster over how long they would take if the tenant had ``1/N`` of it to itself (``N``:
the tenants with work). ``rho <= 1`` means sharing cost it nothing; Themis bounds the largest.

* :func:`isolated_completion_s`: each job's completion time in isolation, the tenant's jobs
  sharing its ``1/N`` of the GPUs max-min fairly (processor sharing, a job never above its gang).
* :func:`tenant_rho`: per tenant, the sum of its jobs' shared JCTs over the sum of their isolated
  ones (finished jobs; the report).
* :func:`pressure`: the same ratio estimated online from running and queued jobs (their time so
  far plus predicted remaining over their isolated estimate), which the predictive queue uses to
  move a tenant's jobs ahead when it exceeds the bound.

>>> iso = isolated_completion_s([("a", "t1", 0.0, 100.0, 2), ("b", "t1", 0.0, 100.0, 2)], 2.0)
>>> dict(sorted(iso.items()))  # two 2-GPU jobs of 100 s each on a 2-GPU share: processor sharing, both done at 200 s
{'a': 200.0, 'b': 200.0}
>>> tenant_rho([("t1", 300.0, 200.0), ("t1", 200.0, 200.0), ("t2", 50.0, 50.0)])
{'t1': 1.25, 't2': 1.0}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def _share(demands: Mapping[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair split of ``capacity`` over ``demands`` (water filling)."""
    out: dict[str, float] = {}
    left, todo = capacity, sorted(demands.items(), key=lambda kv: kv[1])
    while todo:
        fair = left / len(todo)
        k, d = todo[0]
        if d <= fair:
            out[k] = d
            left -= d
            todo.pop(0)
        else:
            for k, _ in todo:
                out[k] = fair
            break
    return out


def isolated_completion_s(jobs: Iterable[tuple[str, str, float, float, int]], share_gpus: float) -> dict[str, float]:
    """``jobs``: (job id, tenant, submit s, seconds of work on its gang, gang). Each job's time from
    submit to completion with its tenant alone on ``share_gpus`` GPUs (processor sharing)."""
    by_tenant: dict[str, list[tuple[str, float, float, int]]] = {}
    for jid, tenant, sub_s, work, n in jobs:
        by_tenant.setdefault(tenant, []).append((jid, sub_s, work, n))
    out: dict[str, float] = {}
    for items in by_tenant.values():
        items.sort(key=lambda x: x[1])
        left = {jid: work * n for jid, _, work, n in items}  # GPU-seconds
        gang = {jid: g for jid, _, _, g in items}
        sub = {jid: s for jid, s, _, _ in items}
        active: set[str] = set()
        t, i = 0.0, 0
        while i < len(items) or active:
            if not active:
                t = max(t, items[i][1])
            while i < len(items) and items[i][1] <= t:
                active.add(items[i][0])
                i += 1
            alloc = _share({j: float(gang[j]) for j in active}, share_gpus)
            t_next = items[i][1] if i < len(items) else math.inf
            dt_done = min(left[j] / alloc[j] for j in active if alloc[j] > 0)
            dt = min(dt_done, t_next - t)
            for j in list(active):
                left[j] -= alloc[j] * dt
                if left[j] <= 1e-6 * max(gang[j], 1):
                    active.discard(j)
                    out[j] = t + dt - sub[j]
            t += dt
    return out


def tenant_rho(jobs: Iterable[tuple[str, float, float]]) -> dict[str, float]:
    """``jobs``: (tenant, shared JCT s, isolated JCT s). Per tenant, sum(shared) / sum(isolated)."""
    sh: dict[str, float] = {}
    iso: dict[str, float] = {}
    for tenant, s, i in jobs:
        sh[tenant] = sh.get(tenant, 0.0) + s
        iso[tenant] = iso.get(tenant, 0.0) + i
    return {t: round(sh[t] / iso[t], 6) if iso[t] > 0 else 1.0 for t in sorted(sh)}


def pressure(
    jobs: Iterable[tuple[str, float, float, float, int]], capacity_gpus: float, now_s: float
) -> dict[str, float]:
    """Estimated finish-time fairness per tenant from active jobs: (tenant, submit s, seconds run so
    far, predicted seconds left, gang). Isolated estimate: its work (run + left) stretched by how far
    the tenant's gangs exceed its ``1/N`` share; shared estimate: time since submit plus time left."""
    rows = list(jobs)
    tenants = {r[0] for r in rows}
    if not rows or capacity_gpus <= 0:
        return {}
    share = capacity_gpus / len(tenants)
    demand: dict[str, float] = {}
    for tenant, _, _, _, gang in rows:
        demand[tenant] = demand.get(tenant, 0.0) + gang
    sh: dict[str, float] = {}
    iso: dict[str, float] = {}
    for tenant, sub, ran, left, _ in rows:
        stretch = max(1.0, demand[tenant] / share)
        sh[tenant] = sh.get(tenant, 0.0) + (now_s - sub) + left
        iso[tenant] = iso.get(tenant, 0.0) + max(ran + left, 1.0) * stretch
    return {t: sh[t] / iso[t] for t in sh}
