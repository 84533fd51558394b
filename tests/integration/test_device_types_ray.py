"""A model on two device types on Ray: this host's CPU and an emulated T4 (the embedded Ray's
``accelerator_type:T4`` resource; the replica runs its CPU session, then waits out the T4 profile).
One deployment per (variant, device type); a request may pin either type and the response says which
answered; the replica-runtime gauge names the T4's provider ``emulated``.

Two variants of heavy (not its 40 MB large one) keep it quick."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from sloserve.loadtests.emulated import emulated_type_repo
from sloserve.replica.runtime import device_type
from tests.conftest import ServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ray_two_types(model_repo, tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-types")
    repo = emulated_type_repo(model_repo, root / "repo", "heavy", "t4", 2.0, variants=["small", "medium"])
    settings = root / "types.json"
    settings.write_text(
        json.dumps(
            {
                "ray_num_cpus": 2,
                "emulated_gpus": {"T4": 1},
                "replica_gpu_fraction": 0.5,
                "models": {"heavy": {"device_types": ["cpu", "T4"]}},
            }
        )
    )
    s = ServerProcess(repo, "ray", ["--config", str(settings)]).wait_ready()
    yield s
    s.stop()
    s.kill()  # and whatever Ray processes a failed shutdown left in its process group


def test_each_pinned_device_type_answers_from_its_own_deployment(ray_two_types):
    http = httpclient.InferenceServerClient(ray_two_types.http_url)
    md = http.get_model_metadata("heavy")
    assert set(md["parameters"]["device_types"]) == {device_type("cpu"), "t4"}
    x = np.zeros((2, 1024), np.float32)
    for pin, want in (("cpu", device_type("cpu")), ("T4", "t4")):
        i = httpclient.InferInput("input", [2, 1024], "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        p = http.infer("heavy", [i], parameters={"device_type": pin, "variant": "medium"}).get_response()["parameters"]
        assert (p["device_type"], p["variant"]) == (want, "medium")
    with urllib.request.urlopen(f"http://{ray_two_types.http_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    emulated = [ln for ln in text.splitlines() if ln.startswith("sloserve_replica_runtime") and "emulated" in ln]
    assert emulated and all('"t4"' in ln for ln in emulated), emulated
