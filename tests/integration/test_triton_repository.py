"""A Triton model repository served unchanged (on the default Ray backend and in-process), beside
sloserve's own layout: ``digits_triton/config.pbtxt`` with ``1/model.onnx`` and ``2/model.onnx`` (the
demo digits model's small and large variants), called with tritonclient over HTTP and gRPC with
model_version "1", "2" and none; a Triton model that is refused (another platform) while the rest
serves; a Triton model copied in while serving and loaded; and a sloserve-layout model beside them.
"""

from __future__ import annotations

import json
import shutil
import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess

pytestmark = pytest.mark.integration

CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 16
version_policy: { all { } }
input [ { name: "input" data_type: TYPE_FP32 dims: [ 8, 8 ] reshape: { shape: [ 64 ] } } ]
output [
  { name: "probs" data_type: TYPE_FP32 dims: [ 10 ] },
  { name: "label" data_type: TYPE_INT64 dims: [ 1 ] reshape: { shape: [ ] } }
]
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 500 }
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "slo_ms" value: { string_value: "40" } }
"""


def triton_folder(src, repo, name: str, config: str, versions=(("1", "small"), ("2", "large"))) -> None:
    d = repo / name
    for version, variant in versions:
        (d / version).mkdir(parents=True)
        shutil.copy(src / "digits" / variant / "model.onnx", d / version / "model.onnx")
    (d / "config.pbtxt").write_text(textwrap.dedent(config).lstrip("\n"))


def sloserve_folder(src, repo, name: str) -> None:
    (repo / name / "small").mkdir(parents=True)
    shutil.copy(src / "digits" / "small" / "model.onnx", repo / name / "small" / "model.onnx")
    cfg = json.loads((src / "digits" / "config.json").read_text())
    cfg.update(name=name, variants=[v for v in cfg["variants"] if v["name"] == "small"])
    # Triton's queue policy in sloserve's own layout: two priority levels, level 2 by default
    cfg["dynamic_batching"] = {"priority_levels": 2, "default_priority_level": 2}
    cfg.pop("default_variant", None)
    (repo / name / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module", params=["inprocess", "ray"])
def served(request, model_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp(f"triton-repo-{request.param}")
    triton_folder(model_repo, repo, "digits_triton", CONFIG)
    sloserve_folder(model_repo, repo, "digits")
    srv = ServerProcess(repo, request.param)
    srv.wait_ready()
    yield srv, repo, model_repo
    assert srv.stop() == 0, srv.output()


def clients(srv):
    return (
        httpclient.InferenceServerClient(srv.http_url, network_timeout=300.0),
        grpcclient.InferenceServerClient(srv.grpc_url),
    )


def infer(client, model: str, version: str = "", rows: int = 2, **params):
    mod = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    x = mod.InferInput("input", [rows, 64], "FP32")
    x.set_data_from_numpy(np.random.default_rng(rows).random((rows, 64), dtype=np.float32) * 16)
    kw = {"client_timeout": 120.0} if mod is grpcclient else {}
    return client.infer(model, [x], model_version=version, parameters=params or None, **kw)


def answered(result) -> tuple[str, str]:
    """(model_version, variant) of an answer, from either client."""
    r = result.get_response()
    if isinstance(r, dict):
        return r["model_version"], r["parameters"]["variant"]
    p = r.parameters["variant"]
    return r.model_version, getattr(p, p.WhichOneof("parameter_choice"))


@pytest.mark.parametrize("kind", ["http", "grpc"])
@pytest.mark.parametrize("version", ["1", "2", ""])
def test_every_version_answers_over_both_protocols(served, kind, version):
    srv, _, _ = served
    client = clients(srv)[0 if kind == "http" else 1]
    res = infer(client, "digits_triton", version, rows=3)
    assert res.as_numpy("probs").shape == (3, 10) and res.as_numpy("label").shape == (3, 1)  # label's dims
    assert np.allclose(res.as_numpy("probs").sum(axis=1), 1.0, atol=1e-4)
    assert answered(res)[0] == (version or "2")


def test_a_version_is_a_variant(served):
    """The request parameter ``variant`` pins a version (versions are the model's variants); a request
    naming none is served by the latest version (the default variant)."""
    srv, _, _ = served
    h, g = clients(srv)
    for client in (h, g):
        assert answered(infer(client, "digits_triton", variant="1"))[1] == "1"
        assert answered(infer(client, "digits_triton", variant="2"))[1] == "2"
        assert answered(infer(client, "digits_triton"))[1] == "2"


def test_model_version_selects_the_version_that_runs(served):
    srv, _, _ = served
    h, g = clients(srv)
    for client in (h, g):
        assert answered(infer(client, "digits_triton", "1"))[1] == "1"


def test_an_unknown_version_is_refused(served):
    srv, _, _ = served
    h, g = clients(srv)
    for client in (h, g):
        with pytest.raises(InferenceServerException, match="no version '3'"):
            infer(client, "digits_triton", "3")


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_reshape_clients_send_and_receive_the_config_dims(served, kind):
    """``input`` is ``dims: [8, 8]`` reshaped to the graph's [64], ``label`` ``dims: [1]`` reshaped to [];
    a client sends and receives the dims, as with Triton, and the model's own shape still serves."""
    srv, _, _ = served
    client = clients(srv)[0 if kind == "http" else 1]
    mod = httpclient if kind == "http" else grpcclient
    rows = np.random.default_rng(7).random((3, 64), dtype=np.float32) * 16
    x = mod.InferInput("input", [3, 8, 8], "FP32")
    x.set_data_from_numpy(rows.reshape(3, 8, 8))
    res = client.infer("digits_triton", [x], model_version="1")
    x64 = mod.InferInput("input", [3, 64], "FP32")
    x64.set_data_from_numpy(rows)
    flat = client.infer("digits_triton", [x64], model_version="1")
    assert res.as_numpy("label").shape == (3, 1)
    assert np.allclose(res.as_numpy("probs"), flat.as_numpy("probs"), atol=1e-5)  # the same rows, reshaped
    md = client.get_model_metadata("digits_triton")
    shapes = (
        {t["name"]: t["shape"] for t in md["inputs"] + md["outputs"]}
        if kind == "http"
        else {t.name: list(t.shape) for t in (*md.inputs, *md.outputs)}
    )
    assert shapes == {"input": [-1, 8, 8], "probs": [-1, 10], "label": [-1, 1]}
    bad = mod.InferInput("input", [3, 4, 16], "FP32")
    bad.set_data_from_numpy(rows.reshape(3, 4, 16))
    with pytest.raises(InferenceServerException, match=r"expects \[-1, 8, 8\]"):
        client.infer("digits_triton", [bad])


def test_a_config_json_model_takes_tritons_priority_levels(served):
    srv, _, _ = served
    h, g = clients(srv)
    assert h.get_model_config("digits")["dynamic_batching"]["priority_levels"] == 2
    assert g.get_model_config("digits").config.dynamic_batching.default_priority_level == 2
    for client, mod in ((h, httpclient), (g, grpcclient)):
        x = mod.InferInput("input", [2, 64], "FP32")
        x.set_data_from_numpy(np.ones((2, 64), np.float32))
        for priority in (1, 2):  # tritonclient's own argument
            assert client.infer("digits", [x], priority=priority).as_numpy("label").shape == (2,)


def test_instance_group_counts_are_the_replicas_per_version(served):
    """``count: 2`` of ``KIND_CPU``: two replicas of each version, on the CPU; the sloserve-layout model
    beside it keeps the server's one."""
    import urllib.request

    from sloserve.loadtests.promtext import samples

    srv, _, _ = served
    with urllib.request.urlopen(f"http://{srv.http_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    running = {}
    for sample in samples(text, "sloserve_replicas", state="running"):
        key = (sample.labels["model"], sample.labels["variant"])
        running[key] = running.get(key, 0) + sample.value
    assert running[("digits_triton", "1")] == running[("digits_triton", "2")] == 2, running
    assert running[("digits", "small")] == 1, running


def test_metadata_and_config_in_tritons_shape(served):
    srv, _, _ = served
    h, g = clients(srv)
    md = h.get_model_metadata("digits_triton")
    assert md["versions"] == ["1", "2"] and md["platform"] == "onnxruntime_onnx"
    assert [t["name"] for t in md["inputs"]] == ["input"]
    cfg = g.get_model_config("digits_triton").config
    assert cfg.max_batch_size == 16 and [t.name for t in cfg.input] == ["input"]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8] and cfg.instance_group[0].count == 2
    hc = h.get_model_config("digits_triton")
    assert hc["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert hc["instance_group"][0]["kind"] == "KIND_CPU"
    assert h.get_model_config("digits_triton")["parameters"]["slo_ms"]["string_value"] == "40.0"
    assert h.is_model_ready("digits_triton") and g.is_model_ready("digits_triton", "1")


def test_a_broken_triton_model_is_refused_and_the_rest_serves(served):
    srv, repo, src = served
    h, g = clients(srv)
    triton_folder(src, repo, "broken_triton", CONFIG.replace("onnxruntime_onnx", "tensorflow_savedmodel"))
    index = {m["name"]: m for m in h.get_model_repository_index()}
    assert index["broken_triton"]["state"] == "UNAVAILABLE" and index["digits_triton"]["state"] == "READY"
    for client in (h, g):
        with pytest.raises(InferenceServerException) as ei:
            client.load_model("broken_triton")
        msg = ei.value.message()
        assert "broken_triton/config.pbtxt:1: 'platform'" in msg and "tensorflow_savedmodel" in msg, msg
        assert str(repo) not in msg  # the client reads paths relative to the repository
    state, reason = {m.name: (m.state, m.reason) for m in g.get_model_repository_index().models}["broken_triton"]
    assert state == "UNAVAILABLE" and "'platform'" in reason
    assert answered(infer(g, "digits_triton", "1"))[0] == "1"
    assert infer(h, "digits").as_numpy("label").shape == (2,)


def test_a_triton_model_copied_in_while_serving_loads(served):
    srv, repo, src = served
    h, g = clients(srv)
    triton_folder(src, repo, "added_triton", 'backend: "onnxruntime"\nmax_batch_size: 8\n', versions=(("3", "medium"),))
    g.load_model("added_triton")
    assert h.is_model_ready("added_triton")
    res = infer(h, "added_triton", "3", rows=4)
    assert res.as_numpy("label").shape == (4,) and answered(res) == ("3", "3")
