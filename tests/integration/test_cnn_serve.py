"""The ``cnn`` demo model serves through the in-process backend like the others: tritonclient lists
it in the repository index, reads its metadata (``[-1, 64]`` in, as ``digits``), and gets each
variant's own answer over HTTP and gRPC."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytestmark = pytest.mark.integration


def test_every_cnn_variant_serves_its_own_answer(servers, model_repo):
    from sklearn.datasets import load_digits

    srv = servers("inprocess")
    x = load_digits().data[:6].astype(np.float32)
    http = httpclient.InferenceServerClient(srv.http_url)
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        assert "cnn" in {m["name"] for m in http.get_model_repository_index()}
        md = http.get_model_metadata("cnn")
        assert md["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 64]}]
        variants = [v["name"] for v in md["parameters"]["variants"]]
        assert {"small", "medium", "large"} <= set(variants)
        for variant in variants:
            sess = ort.InferenceSession(
                str(model_repo / "cnn" / variant / "model.onnx"), providers=["CPUExecutionProvider"]
            )
            want = sess.run(["label"], {"input": x})[0]
            hin = httpclient.InferInput("input", list(x.shape), "FP32")
            hin.set_data_from_numpy(x, binary_data=True)
            r = http.infer("cnn", [hin], parameters={"variant": variant})
            assert r.get_response()["parameters"]["variant"] == variant
            assert (r.as_numpy("label") == want).all() and r.as_numpy("probs").shape == (6, 10)
            gin = grpcclient.InferInput("input", list(x.shape), "FP32")
            gin.set_data_from_numpy(x)
            g = grpc.infer("cnn", [gin], parameters={"variant": variant})
            assert g.get_response().parameters["variant"].string_param == variant
            assert (g.as_numpy("label") == want).all()
    finally:
        http.close()
        grpc.close()
