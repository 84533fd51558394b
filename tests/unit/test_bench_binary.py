"""``bench closed --binary``: the binary body carries exactly the tensor the JSON body carries."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from sloserve.gateway.transports.codec import decode_rest
from sloserve.loadtests.bench import closed
from sloserve.loadtests.bench.systems import binary_body


def test_binary_body_decodes_to_the_json_body_tensor():
    data = np.random.default_rng(0).random(1024, dtype=np.float32)
    js = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 1024], "datatype": "FP32", "data": [float(x) for x in data]}]}
    ).encode()
    wire, headers = binary_body(js)
    assert headers["Content-Type"] == "application/octet-stream"
    n = int(headers["Inference-Header-Content-Length"])
    assert len(wire) == n + 4096
    dt_a, a = decode_rest(js, None, "heavy", None).inputs["input"]
    dt_b, b = decode_rest(wire, n, "heavy", None).inputs["input"]
    assert dt_a == dt_b == "FP32" and b.shape == (1, 1024)
    np.testing.assert_array_equal(a, b)


def test_binary_is_refused_for_a_peer_without_the_extension(tmp_path):
    p = argparse.ArgumentParser()
    closed.add_arguments(p)
    args = p.parse_args(
        [
            "--repo",
            str(tmp_path),
            "--model",
            "heavy",
            "--variant",
            "large",
            "--systems",
            "sloserve,mlserver",
            "--binary",
        ]
    )
    with pytest.raises(SystemExit, match="mlserver do not take KServe's binary tensor extension"):
        closed.run(args)


def test_bench_slo_binary_is_refused_for_peers_without_the_extension(monkeypatch):
    from sloserve.loadtests.bench import slo

    p = argparse.ArgumentParser()
    slo.add_arguments(p)
    args = p.parse_args(["--systems", "sloserve-slo,triton,rayserve", "--binary"])
    monkeypatch.setattr(slo, "run", _must_not_run)  # a regression must fail here, not start servers
    with pytest.raises(SystemExit, match="rayserve do not take KServe's binary tensor extension"):
        slo.main_args(args)


def _must_not_run(_args):
    raise AssertionError("refused arguments reached the run")


def test_the_open_loop_generator_sends_the_binary_body_with_its_headers(tmp_path):
    from array import array

    from sloserve.loadtests.bench.gen import Generator
    from sloserve.loadtests.bench.slo import generator_headers

    js = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
    ).encode()
    wire, body_headers = binary_body(js)
    (tmp_path / "body").write_bytes(wire)
    spec = {
        "port": 1,
        "path": "/v2/models/heavy/infer",
        "body_file": str(tmp_path / "body"),
        **generator_headers({"x-slo-ms": "20"}, body_headers),
    }
    head, _, body = Generator(spec, array("d", [0.0])).request.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert [x for x in lines if x.lower().startswith("content-type")] == ["Content-Type: application/octet-stream"]
    assert f"Inference-Header-Content-Length: {body_headers['Inference-Header-Content-Length']}" in lines
    assert "x-slo-ms: 20" in lines and f"Content-Length: {len(wire)}" in lines and body == wire
    # without --binary: JSON, as before
    (tmp_path / "json").write_bytes(js)
    spec = {**spec, "body_file": str(tmp_path / "json"), **generator_headers({"x-slo-ms": "20"}, None)}
    spec.pop("content_type")
    head, _, _ = Generator(spec, array("d", [0.0])).request.partition(b"\r\n\r\n")
    assert "Content-Type: application/json" in head.decode().split("\r\n")


def test_rows_per_request_body_and_saturation(model_repo):
    """``bench closed --rows-per-request``: the body holds that many real images, and saturation is
    rows/s over the compute bound of this machine's profile."""
    from sloserve.loadtests.bench.systems import request_body
    from sloserve.replica.runtime import device_type

    body = request_body(model_repo, "digits", rows=8)
    dt, a = decode_rest(body, None, "digits", None).inputs["input"]
    assert a.shape == (8, 64) and len({row.tobytes() for row in a}) > 1  # eight different images
    here = device_type()
    bound = {here: {"bound_rps_capped": 2000.0, "cap": 32, "bound_rps_any_batch": 2500.0}}
    summary = {"sloserve": {"rps": 225.0, "rows_per_s": 1800.0}, "triton": {"rps": 100.0, "rows_per_s": 800.0}}
    sat = closed.saturation(summary, bound)
    assert sat == {"device_type": here, "bound_rows_per_s": 2000.0, "sloserve": 0.9, "triton": 0.4}
    assert "no profile" in closed.saturation(summary, {})["error"]


def test_rows_per_request_beyond_the_max_batch_is_refused(tmp_path):
    p = argparse.ArgumentParser()
    closed.add_arguments(p)
    args = p.parse_args(["--repo", str(tmp_path), "--systems", "sloserve", "--rows-per-request", "64"])
    with pytest.raises(SystemExit, match="--rows-per-request 64 must be 1 to --max-batch-size"):
        closed.run(args)


def test_the_per_round_bound_is_ort_alone_at_the_profiles_best_batch(model_repo):
    """--bound-each-round: rows/s of the variant's own session at the batch the profile peaks at; the
    round's saturation is its rows/s over the mean of the bound before and after it."""
    from sloserve.loadtests.bench.systems import compute_bound
    from sloserve.replica.runtime import device_type

    prof = compute_bound(model_repo, "digits", "large", 32)[device_type()]
    assert 1 <= prof["batch"] <= 32 and prof["bound_rps_capped"] > 0
    rb = closed.RoundBound(model_repo, "digits", "large", prof["batch"], warm_s=0.05, measure_s=0.1)
    assert rb.feeds["input"].shape == (prof["batch"], 64)
    a, b = rb.rows_per_s(), rb.rows_per_s()
    assert a > 0 and b > 0 and 0.2 < a / b < 5  # the same measurement twice: the same order of magnitude
    summary = {"sloserve": {"rows_per_s": 1800.0, "round_saturation": 0.93}}
    sat = closed.saturation(summary, {device_type(): {"bound_rps_capped": 2000.0}})
    assert sat["sloserve"] == 0.9 and sat["sloserve_per_round_median"] == 0.93
