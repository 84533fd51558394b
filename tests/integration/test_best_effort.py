"""Requests that name no deadline are served best-effort, never refused for the model's default one.

64 concurrent tritonclient requests with no ``slo_ms``, on each demo model, against a server with its
default configuration (the ``slo`` policy), in-process and on Ray: every one is answered 200, as
Triton would answer them. The same burst with a deadline too tight for it is still refused in part
(503 with Retry-After): a request that names ``slo_ms`` keeps it.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration
BURST = 64


def burst(url: str, model: str, features: int, parameters: dict | None = None) -> tuple[int, list[str]]:
    """(answers, errors) of BURST requests sent at once."""
    client = httpclient.InferenceServerClient(url, concurrency=BURST, network_timeout=60.0)
    try:
        x = np.random.default_rng(0).random((1, features), dtype=np.float32)
        inp = httpclient.InferInput("input", [1, features], "FP32")
        inp.set_data_from_numpy(x)
        pending = [client.async_infer(model, [inp], parameters=parameters) for _ in range(BURST)]
        ok, errors = 0, []
        for p in pending:
            try:
                res = p.get_result()
            except InferenceServerException as e:
                errors.append(str(e))
                continue
            assert res.as_numpy("label").shape == (1,)
            ok += 1
        return ok, errors
    finally:
        client.close()


@pytest.mark.parametrize(("model", "features"), [("digits", 64), ("heavy", 1024)])
def test_a_burst_without_deadlines_is_answered_in_full(server, model, features):
    ok, errors = burst(server.http_url, model, features)
    assert ok == BURST, errors[:3]


def test_a_request_that_names_slo_ms_keeps_its_deadline(server):
    ok, errors = burst(server.http_url, "heavy", 1024, {"slo_ms": 0.01})  # no variant of heavy fits 10 us
    assert ok < BURST and errors, "a 10 us deadline cannot hold for a burst of 64"
    assert all("503" in e or "deadline" in e for e in errors), errors[:3]
