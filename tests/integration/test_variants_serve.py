"""A model folder written by ``sloserve models variants`` is served as it is: the in-process server
loads it, lists its measured variants, and answers a request pinned to each variant (tritonclient,
HTTP and gRPC) with that variant's own answer."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from sloserve.cli.main import main
from tests.conftest import ServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def generated(model_repo, tmp_path_factory):
    """Variants of the demo digits model's ``large`` variant, with its ``small`` as an extra one."""
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("variants")
    d = load_digits()
    rows = np.random.default_rng(1).permutation(len(d.data))[:300]
    np.savez(root / "val.npz", x=d.data[rows].astype(np.float32), y=d.target[rows])
    repo = root / "repo"
    args = ["models", "variants", "--onnx", str(model_repo / "digits/large/model.onnx"), "--val", str(root / "val.npz")]
    extra = ["--extra-variant", f"tiny={model_repo / 'digits/small/model.onnx'}", "--profile-iters", "2"]
    assert main([*args, "--name", "digits_v", "--repo", str(repo), "--max-batch", "16", *extra]) == 0
    srv = ServerProcess(repo, "inprocess").wait_ready(60)
    yield srv, repo, d.data[rows[:5]].astype(np.float32)
    assert srv.stop() == 0, srv.output()


def test_every_generated_variant_serves_its_own_answer(generated):
    srv, repo, x = generated
    http = httpclient.InferenceServerClient(srv.http_url)
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    md = http.get_model_metadata("digits_v")
    variants = [v["name"] for v in md["parameters"]["variants"]]
    assert {"fp32", "int8", "tiny"} <= set(variants)
    for variant in variants:
        sess = ort.InferenceSession(str(repo / "digits_v" / variant / "model.onnx"), providers=["CPUExecutionProvider"])
        want = sess.run(["label"], {"input": x})[0]
        hin = httpclient.InferInput("input", list(x.shape), "FP32")
        hin.set_data_from_numpy(x, binary_data=True)
        r = http.infer("digits_v", [hin], parameters={"variant": variant})
        assert r.get_response()["parameters"]["variant"] == variant
        assert (r.as_numpy("label") == want).all()
        gin = grpcclient.InferInput("input", list(x.shape), "FP32")
        gin.set_data_from_numpy(x)
        g = grpc.infer("digits_v", [gin], parameters={"variant": variant})
        assert g.get_response().parameters["variant"].string_param == variant
        assert (g.as_numpy("label") == want).all()
