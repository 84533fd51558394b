"""The model repository API on a real server, driven by tritonclient over HTTP and gRPC, on the
default Ray backend and in-process: the index, a model copied into the repository while serving
and loaded, a load with a config override, a load that fails (400, the others keep serving), an
unload that answers what it admitted and then refuses, the config and statistics in Triton's shape.

Each backend gets one server over a temporary repository of one-variant copies of the demo
``digits`` model (one Serve application each, so Ray loads them quickly): ``digits``, and ``slow``
whose replicas hold every batch 400 ms (``fault_delay_ms``), which keeps requests in flight while it
is unloaded.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ServerProcess

pytestmark = pytest.mark.integration


def add_model(src, repo, name: str, edit=None) -> None:
    """A copy of the demo digits model's ``small`` variant as ``repo/name`` (``edit`` changes its config)."""
    d = repo / name
    (d / "small").mkdir(parents=True)
    shutil.copy(src / "digits" / "small" / "model.onnx", d / "small" / "model.onnx")
    cfg = json.loads((src / "digits" / "config.json").read_text())
    cfg["name"] = name
    cfg["variants"] = [v for v in cfg["variants"] if v["name"] == "small"]
    cfg.pop("default_variant", None)
    if edit is not None:
        edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module", params=["inprocess", "ray"])
def served(request, model_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp(f"repo-{request.param}")
    add_model(model_repo, repo, "digits")
    add_model(model_repo, repo, "slow")
    settings = repo.parent / f"settings-{request.param}.json"
    settings.write_text(json.dumps({"models": {"slow": {"fault_delay_ms": 400}}}))
    srv = ServerProcess(repo, request.param, extra=["--config", str(settings)])
    srv.wait_ready()
    yield srv, repo, model_repo
    assert srv.stop() == 0, srv.output()


def clients(srv):
    return (
        httpclient.InferenceServerClient(srv.http_url, network_timeout=300.0),
        grpcclient.InferenceServerClient(srv.grpc_url),
    )


def infer(client, model: str, rows: int = 1):
    mod = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    i = mod.InferInput("input", [rows, 64], "FP32")
    i.set_data_from_numpy(np.random.default_rng(rows).random((rows, 64), dtype=np.float32) * 16)
    if mod is grpcclient:
        return client.infer(model, [i], client_timeout=120.0)
    return client.infer(model, [i])


def states(index) -> dict[str, tuple[str, str]]:
    """name -> (state, reason), from either client's index."""
    if isinstance(index, list):
        return {m["name"]: (m["state"], m.get("reason", "")) for m in index}
    return {m.name: (m.state, m.reason) for m in index.models}


def test_the_index_lists_every_model_folder_with_its_state(served):
    srv, repo, src = served
    h, g = clients(srv)
    add_model(src, repo, "spare")
    for index in (h.get_model_repository_index(), g.get_model_repository_index()):
        st = states(index)
        assert st["digits"] == ("READY", "") and st["slow"] == ("READY", "")
        assert st["spare"] == ("UNAVAILABLE", "not loaded")
    assert not h.is_model_ready("spare") and not g.is_model_ready("spare")


def test_a_model_copied_in_while_serving_loads_and_answers(served):
    srv, repo, src = served
    h, g = clients(srv)
    add_model(src, repo, "added")
    h.load_model("added")
    assert states(g.get_model_repository_index())["added"] == ("READY", "")
    assert h.is_model_ready("added") and g.is_model_ready("added")
    assert infer(g, "added", 3).as_numpy("label").shape == (3,)
    assert infer(h, "added").as_numpy("probs").shape == (1, 10)
    assert infer(h, "digits").as_numpy("probs").shape == (1, 10)  # the others served throughout


def test_a_load_with_a_config_override_replaces_those_keys(served):
    srv, repo, src = served
    h, g = clients(srv)
    if "added" not in states(h.get_model_repository_index()):
        add_model(src, repo, "added")
    g.load_model("added", config=json.dumps({"max_batch_size": 4, "slo_ms": 80}))
    cfg = h.get_model_config("added")
    assert cfg["max_batch_size"] == 4 and cfg["parameters"]["slo_ms"]["string_value"] == "80.0"
    assert g.get_model_config("added").config.max_batch_size == 4
    assert infer(h, "added", 4).as_numpy("label").shape == (4,)
    with pytest.raises(InferenceServerException, match="max_batch_size 4"):
        infer(h, "added", 5)


def test_a_model_that_fails_to_load_is_a_400_naming_it_and_the_others_serve(served):
    srv, repo, src = served
    h, g = clients(srv)
    add_model(src, repo, "broken", lambda c: c["inputs"][0].update(name="pixels"))
    with pytest.raises(InferenceServerException) as ei:
        h.load_model("broken")
    assert ei.value.status() == "400" and "fix 'inputs'" in ei.value.message(), ei.value
    with pytest.raises(InferenceServerException, match="INVALID_ARGUMENT"):
        g.load_model("broken")
    state, reason = states(g.get_model_repository_index())["broken"]
    assert state == "UNAVAILABLE" and "pixels" in reason
    with pytest.raises(InferenceServerException, match="never-there.*has no .*config.json"):
        g.load_model("never-there")
    # a bad override leaves the model serving as it was
    with pytest.raises(InferenceServerException, match="'max_batch_size'"):
        h.load_model("digits", config=json.dumps({"max_batch_size": 0}))
    assert infer(g, "digits").as_numpy("label").shape == (1,)
    # the request sizes the gateway reads were set at start by the largest request it served then
    add_model(src, repo, "wide", lambda c: c.update(max_batch_size=1024))
    with pytest.raises(InferenceServerException, match="max_request_bytes") as ei:
        h.load_model("wide")
    assert ei.value.status() == "400" and "1024 rows" in ei.value.message(), ei.value
    assert h.is_server_ready()


def test_unload_answers_what_it_admitted_then_refuses(served):
    srv, _, _ = served
    h, g = clients(srv)
    results: list = []

    def call(i: int) -> None:
        try:
            results.append(infer(httpclient.InferenceServerClient(srv.http_url), "slow", 1 + i % 2))
        except Exception as e:  # recorded: the assertion says which
            results.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while _inflight_bytes(srv) < 3 * 64 * 4 and time.monotonic() < deadline:  # all three admitted
        time.sleep(0.01)
    assert time.monotonic() < deadline, "the three requests were never in flight together"
    g.unload_model("slow")
    for t in threads:
        t.join(30)
    assert all(not isinstance(r, Exception) for r in results), results
    assert len(results) == 3
    assert not h.is_model_ready("slow") and not g.is_model_ready("slow")
    assert states(h.get_model_repository_index())["slow"] == ("UNAVAILABLE", "unloaded")
    for client in (h, g):
        with pytest.raises(InferenceServerException, match="model 'slow' is unavailable \\(unloaded\\)"):
            infer(client, "slow")
    assert h.is_server_ready()  # the server serves on without it


def _inflight_bytes(srv) -> float:
    with urllib.request.urlopen(f"http://{srv.http_url}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("sloserve_inflight_bytes "):
                return float(line.split()[1])
    return 0.0


def test_config_and_statistics_in_tritons_shape(served):
    srv, _, _ = served
    h, g = clients(srv)
    cfg = h.get_model_config("digits")
    assert cfg["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [64]}]
    assert [o["name"] for o in cfg["output"]] == ["probs", "label"]
    gcfg = g.get_model_config("digits", as_json=True)["config"]
    assert gcfg["name"] == "digits" and gcfg["input"][0]["data_type"] == "TYPE_FP32"

    before = h.get_inference_statistics("digits")["model_stats"][0]
    for rows in (1, 2, 3):
        infer(g, "digits", rows)
    after = h.get_inference_statistics("digits")["model_stats"][0]
    ok = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert ok == 3 and after["inference_count"] - before["inference_count"] == 6
    assert after["execution_count"] > before["execution_count"]
    for what in ("success", "queue", "compute_infer"):
        assert after["inference_stats"][what]["ns"] > before["inference_stats"][what]["ns"]
    assert sum(b["compute_infer"]["count"] for b in after["batch_stats"]) == after["execution_count"]
    gstats = g.get_inference_statistics("digits", "1").model_stats[0]
    assert gstats.name == "digits" and gstats.version == "1" and gstats.inference_count >= 6
    names = [s["name"] for s in h.get_inference_statistics()["model_stats"]]
    assert "digits" in names and names == sorted(names)
    with pytest.raises(InferenceServerException, match="no version '7'"):
        g.get_inference_statistics("digits", "7")
