"""``bench closed --binary``: the binary body carries exactly the tensor the JSON body carries."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from gateway.codec import decode_rest
from loadtests.bench import closed
from loadtests.bench.systems import binary_body


def test_binary_body_decodes_to_the_json_body_tensor():
    data = np.random.default_rng(0).random(1024, dtype=np.float32)
    js = json.dumps({"inputs": [{"name": "input", "shape": [1, 1024], "datatype": "FP32",
                                 "data": [float(x) for x in data]}]}).encode()
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
    args = p.parse_args(["--repo", str(tmp_path), "--model", "heavy", "--variant", "large",
                         "--systems", "sloserve,mlserver", "--binary"])
    with pytest.raises(SystemExit, match="mlserver do not take KServe's binary tensor extension"):
        closed.run(args)


def test_bench_slo_binary_is_refused_for_peers_without_the_extension():
    from loadtests.bench import slo
    p = argparse.ArgumentParser()
    slo.add_arguments(p)
    args = p.parse_args(["--systems", "sloserve-slo,triton,rayserve", "--binary"])
    with pytest.raises(SystemExit, match="rayserve do not take KServe's binary tensor extension"):
        slo.main_args(args)
