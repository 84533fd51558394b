"""The training API over HTTP (``/v2/training``): jobs on the GPUs inference leaves idle, and the
placement controller's report. A FastAPI router the REST app mounts when ``training.enabled``.

Every route needs a bearer token with the ``training`` scope, on loopback too: with no token table
configured the routes answer 401 saying how to add one. A job belongs to the tenant of the token
that submitted it (its entry's ``TENANT``, sloserve/gateway/tokens.py); only that tenant's tokens see it,
preempt, resume or cancel it, and to any other token it does not exist (404). A token with the
``admin`` scope acts on every job and may submit for any tenant."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from sloserve.gateway.errors import ServingError
from sloserve.gateway.tokens import Principal, TokenTable
from sloserve.gateway.transports.status import http_status
from sloserve.training.job import EntryNotAllowed, JobRejected, TrainingSpec

NO_TOKENS = (
    "the training API needs a bearer token with the 'training' scope, and this server has no token table: "
    "add an entry `TOKEN * infer,training TENANT` to auth_tokens_file or auth_tokens (SLOSERVE_AUTH_TOKENS) "
    "and restart; every request then needs a token (docs/reliability.md, 'Training jobs')"
)
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="sloserve"'}


class ResumeBody(BaseModel):
    """``POST .../resume``'s optional body: ``{"gpu_type": "A100"}`` resumes the job on another GPU type."""

    model_config = ConfigDict(extra="forbid")

    gpu_type: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


def owns(who: Principal, tenant: str | None) -> bool:
    """Whether a token may see and act on a job of ``tenant``: its own tenant's, or any with ``admin``."""
    return who.admin or (who.tenant is not None and tenant == who.tenant)


def visible_report(report: dict, visible: set[str]) -> dict:
    """The placement report cut down to the jobs in ``visible`` (GPU counts by use stay whole)."""
    out = dict(report)
    out["reclaims"] = [r for r in report.get("reclaims", []) if r.get("job_id") in visible]
    d = report.get("last_decision")
    if d is not None:
        out["last_decision"] = {
            **d,
            "preempt": [j for j in d.get("preempt", []) if j in visible],
            "start_training": [j for j in d.get("start_training", []) if j in visible],
            "training_queue": [e for e in d.get("training_queue", []) if e.get("job_id") in visible],
        }
    return out


def training_router(
    jobs: Any, report: Callable[[], dict], tokens: TokenTable | None, prefix: str = "/v2/training"
) -> APIRouter:
    """``POST {prefix}/jobs`` (a TrainingSpec: ``job_id``, ``entry``, ``config``, ``workers``, ``gpu_type``...), ``GET {prefix}/jobs``, ``GET {prefix}/jobs/{id}``,
    ``POST {prefix}/jobs/{id}/preempt``, ``POST {prefix}/jobs/{id}/resume`` (body ``{"gpu_type": ...}`` to move it), ``DELETE {prefix}/jobs/{id}``,
    and ``GET {prefix}/placement`` (``report()``, cut down to the caller's jobs). ``jobs`` is a
    ``TrainingManager`` or the placement controller's view of it (the same methods); ``tokens`` the
    server's token table (None: every route is a 401 saying how to configure one)."""

    def principal(request: Request) -> Principal:
        if tokens is None:
            raise HTTPException(401, NO_TOKENS, headers=_CHALLENGE)
        try:
            return tokens.authorize(request.headers.get("authorization"), None, "training")
        except ServingError as e:
            status = http_status(e)
            raise HTTPException(status, e.message, headers=_CHALLENGE if status == 401 else None) from None

    r = APIRouter(prefix=prefix, tags=["training"])

    def call(fn, *a):
        try:
            return fn(*a).to_dict()
        except KeyError as e:
            raise HTTPException(404, str(e.args[0])) from None
        except EntryNotAllowed as e:  # not on the operator's list: nothing was imported
            raise HTTPException(403, str(e)) from None
        except JobRejected as e:  # an entry that does not import, more GPUs than the cluster has, a config too big
            raise HTTPException(400, str(e)) from None
        except ValueError as e:  # exists, wrong state, training.max_jobs reached
            raise HTTPException(409, str(e)) from None

    def mine(job_id: str, who: Principal) -> str:
        """The job's id when the token may act on it; otherwise the job does not exist for it."""
        try:
            tenant = jobs.get(job_id).tenant
        except KeyError as e:
            raise HTTPException(404, str(e.args[0])) from None
        if not owns(who, tenant):
            raise HTTPException(404, f"no training job {job_id!r}")
        return job_id

    @r.get("/placement")
    def placement(who: Principal = Depends(principal)) -> dict:
        if who.admin:
            return report()
        return visible_report(report(), {j.job_id for j in jobs.list() if owns(who, j.tenant)})

    @r.post("/jobs", status_code=201)
    def submit(spec: TrainingSpec, who: Principal = Depends(principal)) -> dict:
        if not who.admin:
            if who.tenant is None:
                raise HTTPException(
                    403,
                    "this token names no tenant, so its jobs would belong to no one: add the tenant as the "
                    "fourth field of its entry in auth_tokens (`TOKEN MODELS SCOPES TENANT`)",
                )
            if spec.tenant is not None and spec.tenant != who.tenant:
                raise HTTPException(
                    403, f"this token submits jobs for tenant {who.tenant!r}, not {spec.tenant!r} (admin scope needed)"
                )
        if spec.tenant is None:
            spec = spec.model_copy(update={"tenant": who.tenant})
        return call(jobs.submit, spec)

    @r.get("/jobs")
    def list_jobs(who: Principal = Depends(principal)) -> dict:
        return {"jobs": [j.to_dict() for j in jobs.list() if owns(who, j.tenant)]}

    @r.get("/jobs/{job_id}")
    def get(job_id: str, who: Principal = Depends(principal)) -> dict:
        return call(jobs.get, mine(job_id, who))

    @r.post("/jobs/{job_id}/preempt")
    def preempt(job_id: str, who: Principal = Depends(principal)) -> dict:
        return call(jobs.preempt, mine(job_id, who))

    @r.post("/jobs/{job_id}/resume")
    def resume(job_id: str, body: ResumeBody | None = None, who: Principal = Depends(principal)) -> dict:
        mine(job_id, who)
        if body is not None and body.gpu_type is not None:
            return call(lambda j: jobs.start(j, gpu_type=body.gpu_type), job_id)
        return call(jobs.start, job_id)

    @r.delete("/jobs/{job_id}")
    def cancel(job_id: str, who: Principal = Depends(principal)) -> dict:
        return call(jobs.cancel, mine(job_id, who))

    return r
