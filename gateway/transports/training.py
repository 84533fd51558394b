"""The training API over HTTP (``/v2/training``): jobs on the GPUs inference leaves idle, and the
placement controller's report. A FastAPI router the REST app mounts when ``training.enabled``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from autoscaler.training.job import JobRejected, TrainingSpec


class ResumeBody(BaseModel):
    """``POST .../resume``'s optional body: ``{"gpu_type": "A100"}`` resumes the job on another GPU type."""

    model_config = ConfigDict(extra="forbid")

    gpu_type: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


def training_router(jobs: Any, report: Callable[[], dict], prefix: str = "/v2/training") -> APIRouter:
    """``POST {prefix}/jobs`` (a TrainingSpec: ``job_id``, ``entry``, ``config``, ``workers``, ``gpu_type``...), ``GET {prefix}/jobs``, ``GET {prefix}/jobs/{id}``,
    ``POST {prefix}/jobs/{id}/preempt``, ``POST {prefix}/jobs/{id}/resume`` (body ``{"gpu_type": ...}`` to move it), ``DELETE {prefix}/jobs/{id}``,
    and ``GET {prefix}/placement`` (``report()``). ``jobs`` is a ``TrainingManager`` or the placement
    controller's view of it (the same methods)."""
    r = APIRouter(prefix=prefix, tags=["training"])

    def call(fn, *a):
        try:
            return fn(*a).to_dict()
        except KeyError as e:
            raise HTTPException(404, str(e.args[0])) from None
        except JobRejected as e:  # an entry that does not import, more GPUs than the cluster has
            raise HTTPException(400, str(e)) from None
        except ValueError as e:
            raise HTTPException(409, str(e)) from None

    @r.get("/placement")
    def placement() -> dict:
        return report()

    @r.post("/jobs", status_code=201)
    def submit(spec: TrainingSpec) -> dict:
        return call(jobs.submit, spec)

    @r.get("/jobs")
    def list_jobs() -> dict:
        return {"jobs": [j.to_dict() for j in jobs.list()]}

    @r.get("/jobs/{job_id}")
    def get(job_id: str) -> dict:
        return call(jobs.get, job_id)

    @r.post("/jobs/{job_id}/preempt")
    def preempt(job_id: str) -> dict:
        return call(jobs.preempt, job_id)

    @r.post("/jobs/{job_id}/resume")
    def resume(job_id: str, body: ResumeBody | None = None) -> dict:
        if body is not None and body.gpu_type is not None:
            return call(lambda j: jobs.start(j, gpu_type=body.gpu_type), job_id)
        return call(jobs.start, job_id)

    @r.delete("/jobs/{job_id}")
    def cancel(job_id: str) -> dict:
        return call(jobs.cancel, job_id)

    return r
