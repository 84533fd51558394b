"""Fuzzing the training API (``/v2/training``) of a live gateway with schemathesis: every operation
of its OpenAPI document (submit, list, get, preempt, resume and cancel a job; the placement report)
with bodies and parameters generated from the schema (positive) and against it (negative), every
call with a bearer token that has the ``training`` scope, so it gets past authentication to the
handlers. Zero 5xx, zero hangs (every call has a timeout), every refusal a 4xx with a message, and
the server answers its health and training routes afterwards.

The training API is served only with the Ray backend (``training.enabled`` needs backend ray: the
harvest controller places jobs as Ray actors on GPU resources), so this is a Ray server of its own:
one emulated T4, a one-variant copy of the demo digits model, ``training.auto_fill`` off (nothing is
placed on the GPU by itself), and as the one entry jobs may name a function that fails at once
(tests/integration/training_jobs.py), so a job a fuzzed resume starts ends at once. Half the
submitted bodies name that entry, the token's tenant and a gang of one T4, so submits succeed too;
a third of the job ids in paths are jobs that exist. The pass is small: ``SLOSERVE_FUZZ_EXAMPLES`` // 3 examples per
operation and mode (5 by default). The calls are counted with the other fuzzers' (tests/fuzz/tally.py).
"""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.conftest import ServerProcess
from tests.fuzz import tally
from tests.integration.test_model_repository import add_model

pytestmark = pytest.mark.integration
N = max(1, int(os.environ.get("SLOSERVE_FUZZ_EXAMPLES", "15")) // 3)
TIMEOUT_S = 15.0
TOKEN = "fuzz-training-token-1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TENANT = "fuzz"
ENTRY = "tests.integration.training_jobs:crash"
JOBS = ("fuzz-queued", "fuzz-cancelled")  # submitted before the fuzzing; the second one cancelled
TRAINING_OPERATIONS = {
    "GET /v2/training/placement",
    "POST /v2/training/jobs",
    "GET /v2/training/jobs",
    "GET /v2/training/jobs/{job_id}",
    "POST /v2/training/jobs/{job_id}/preempt",
    "POST /v2/training/jobs/{job_id}/resume",
    "DELETE /v2/training/jobs/{job_id}",
}


@pytest.fixture(scope="module")
def training_server(model_repo, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-training")
    repo = root / "repo"
    add_model(model_repo, repo, "digits")
    config = root / "settings.json"
    config.write_text(
        json.dumps(
            {
                "ray_num_cpus": 4,
                "emulated_gpus": {"T4": 1},
                "auth_tokens": f"{TOKEN} * infer,training {TENANT}",
                "training": {"enabled": True, "jobs_dir": str(root / "jobs"), "auto_fill": False, "entries": [ENTRY]},
            }
        )
    )
    srv = ServerProcess(repo, "ray", ["--config", str(config)]).wait_ready()
    with httpx.Client(base_url=f"http://{srv.http_url}", headers=AUTH, timeout=TIMEOUT_S) as c:
        for job in JOBS:
            r = c.post("/v2/training/jobs", json={"job_id": job, "entry": ENTRY})
            assert r.status_code == 201, r.text
        assert c.delete(f"/v2/training/jobs/{JOBS[1]}").status_code == 200
    yield srv
    assert srv.proc.poll() is None, "the server died while being fuzzed:\n" + srv.output()
    log = srv.output(None)
    assert srv.stop() == 0, srv.output()
    assert "internal error" not in log and "Traceback" not in log, log


@pytest.fixture(scope="module")
def training_schema(training_server):
    return schemathesis.openapi.from_url(f"http://{training_server.http_url}/openapi.json")


def training_operations(schema) -> list:
    return [o for o in (r.ok() for r in schema.get_all_operations()) if o.path.startswith("/v2/training/")]


def test_openapi_lists_every_training_route_with_its_body(training_schema):
    """/openapi.json lists the seven training routes; a submit's body is the TrainingSpec and a
    resume's the optional ``{"gpu_type": ...}``."""
    ops = {o.label: o for o in training_operations(training_schema)}
    assert set(ops) == TRAINING_OPERATIONS
    (spec,) = ops["POST /v2/training/jobs"].body
    assert spec.media_type == "application/json" and spec.is_required
    (resume,) = ops["POST /v2/training/jobs/{job_id}/resume"].body
    assert resume.media_type == "application/json" and not resume.is_required


def error_names_the_problem(ctx, response, case):
    """Every 4xx is ``{"error": "<non-empty message>"}``."""
    if 400 <= response.status_code < 500:
        body = response.json()
        assert isinstance(body, dict) and isinstance(body.get("error"), str) and body["error"].strip(), (
            f"{response.status_code} without an error message: {response.text[:200]}"
        )


KNOWN_JOB = st.sampled_from([None, None, *JOBS])  # None: the id schemathesis generated
RUNNABLE = st.booleans()  # a submit's body names the allowed entry, the tenant and a one-T4 gang


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_training_openapi_fuzz(training_schema, training_server, mode):
    """Every training operation with generated paths and bodies, with the training token."""
    ops = training_operations(training_schema)
    tried = 0
    for op in ops:

        @settings(max_examples=N, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy(generation_mode=mode), job=KNOWN_JOB, runnable=RUNNABLE)
        def run(case, job, runnable):
            if job is not None and "job_id" in (case.path_parameters or {}):
                case.path_parameters["job_id"] = job
            if runnable and isinstance(case.body, dict) and case.operation.label == "POST /v2/training/jobs":
                body = {k: v for k, v in case.body.items() if k not in ("workers", "min_workers", "gpu_type")}
                case.body = {**body, "entry": ENTRY, "tenant": TENANT}  # one T4 gang: the cluster's
            response = case.call(headers=AUTH, timeout=TIMEOUT_S)
            tally.rest(case.operation.label, response.status_code)
            case.validate_response(response, checks=[not_a_server_error, error_names_the_problem])

        t0 = time.perf_counter()
        try:
            run()
            tried += 1
        except Unsatisfiable:  # no negative input exists for a GET without parameters
            continue
        finally:
            print(f"{mode.value} {op.label}: {time.perf_counter() - t0:.2f} s")
    assert tried >= (len(ops) if mode is GenerationMode.POSITIVE else 2)
    with httpx.Client(base_url=f"http://{training_server.http_url}", headers=AUTH, timeout=TIMEOUT_S) as c:
        assert c.get("/v2/health/ready").status_code == 200
        assert c.get("/v2/training/jobs").status_code == 200
        assert c.get("/v2/training/placement").status_code == 200
