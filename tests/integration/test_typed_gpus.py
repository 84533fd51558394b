"""Device types as Ray resources, on a CPU box: the embedded Ray emulates one T4 and one A100
(`emulated_gpus` -> `accelerator_type:<T>` custom resources + GPUs), `digits` runs on the T4 and
`heavy` on the A100. Both answer over HTTP and gRPC; their replicas hold the right resources and
report the device type they run as; two replicas at gpu_fraction 0.5 fill a GPU and a third waits.

A trimmed repository copy (two variants per model, no 40 MB heavy/large) keeps it quick.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, ServerProcess

pytestmark = pytest.mark.integration
VARIANTS = ("small", "medium")
DEVICES = {"digits": "T4", "heavy": "A100"}


@pytest.fixture(scope="module")
def typed_server(model_repo, tmp_path_factory):
    repo = tmp_path_factory.mktemp("typed-repo")
    for model in DEVICES:
        cfg = json.loads((model_repo / model / "config.json").read_text())
        cfg["variants"] = [v for v in cfg["variants"] if v["name"] in VARIANTS]
        if cfg.get("default_variant") not in (None, *VARIANTS):
            cfg["default_variant"] = None
        (repo / model).mkdir()
        (repo / model / "config.json").write_text(json.dumps(cfg))
        for v in VARIANTS:
            shutil.copytree(model_repo / model / v, repo / model / v)
    settings = repo / "typed.json"
    settings.write_text(
        json.dumps(
            {
                "ray_num_cpus": 2,
                "emulated_gpus": {"T4": 1, "A100": 1},
                "replica_gpu_fraction": 0.5,
                "models": {m: {"device_type": d} for m, d in DEVICES.items()},
            }
        )
    )
    s = ServerProcess(repo, "ray", ["--config", str(settings)]).wait_ready()
    s.repo = repo
    yield s
    s.stop()
    s.kill()  # and whatever Ray processes a failed shutdown left in its process group


def gcs_address(server) -> str:
    m = re.search(r"started a local Ray at (\S+)", server.output())
    assert m, server.output()
    return m.group(1)


def test_both_models_answer_over_http_and_grpc(typed_server):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    s = typed_server
    width = {"digits": 64, "heavy": 1024}
    for mod, url in ((httpclient, s.http_url), (grpcclient, s.grpc_url)):
        client = mod.InferenceServerClient(url)
        try:
            for model, n in width.items():
                x = np.full((2, n), 3.0, dtype=np.float32)
                inp = mod.InferInput("input", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                for variant in VARIANTS:
                    res = client.infer(model, [inp], parameters={"variant": variant, "slo_ms": 10000})
                    assert res.as_numpy("probs").shape == (2, 10), (mod.__name__, model, variant)
                    assert res.as_numpy("label").shape == (2,)
        finally:
            client.close()


# Runs in a fresh interpreter: RAY_AUTH_MODE must be set before Ray is imported, and the pytest
# process may have imported Ray already (tests/unit/deploy does).
PROBE = r"""
import json, os, sys, time
import numpy as np
import ray
from ray import serve
from ray._private.state import state as gcs_state
from ray.core.generated import gcs_pb2
from sloserve.replica.ray_replica import actor_options

gcs, devices, variants = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3].split(",")
ray.init(address=gcs, log_to_driver=False)
out = {"total": ray.cluster_resources(), "available": ray.available_resources()}
status = serve.status()
out["apps"] = {name: {"status": str(app.status.value if hasattr(app.status, "value") else app.status),
                      "replicas": {d: dict(st.replica_states) for d, st in app.deployments.items()}}
               for name, app in status.applications.items()}

def replicas(app):
    # The app's replica actors from the GCS actor table (the state API needs the dashboard, which
    # the embedded Ray leaves out): state, resources asked for, and resources granted.
    cls = f"ServeReplica:{app}:{app[len('sloserve-'):]}"
    out = []
    for raw in gcs_state._connect_and_get_accessor().get_actor_table(None, None):
        a = gcs_pb2.ActorTableData.FromString(raw)
        if a.class_name == cls and a.state != gcs_pb2.ActorTableData.DEAD:
            out.append({"state": gcs_pb2.ActorTableData.ActorState.Name(a.state),
                        "resources": dict(a.required_resources),
                        "granted": {m.name: sum(r.quantity for r in m.resource_ids) for m in a.resource_mapping}})
    return out

out["actors"], out["reported"] = {}, {}
width = {"digits": 64, "heavy": 1024}
for model, dev in devices.items():
    for v in variants:
        dep = f"{model}-{v}-{dev.lower()}"
        app = "sloserve-" + dep
        out["actors"][app] = replicas(app)
        h = serve.get_deployment_handle(dep, app_name=app)
        outputs, compute_s, device = h.run_batch.remote({"input": np.ones((1, width[model]), np.float32)}).result()
        out["reported"][app] = device

# A third GPU replica on the T4, asking for exactly what a replica asks for (actor_options is what
# build_app gives Serve): the two digits replicas already hold 0.5 + 0.5 of its one GPU.
# (A plain actor, because serve.run waits for its application to come up, which this one must not.)
class Probe:
    def ready(self):
        return True

probe = ray.remote(**actor_options("T4", 0.25, 0.5))(Probe).options(name="sloserve-typed-gpu-probe").remote()
ref = probe.ready.remote()
ready, _ = ray.wait([ref], timeout=5)  # given 5 s to (wrongly) start
states = [gcs_pb2.ActorTableData.ActorState.Name(gcs_pb2.ActorTableData.FromString(raw).state)
          for raw in gcs_state._connect_and_get_accessor().get_actor_table(None, None)
          if gcs_pb2.ActorTableData.FromString(raw).name == "sloserve-typed-gpu-probe"]
out["probe"] = {"started": bool(ready), "states": states, "available": ray.available_resources()}
ray.kill(probe)
print("PROBE-RESULT " + json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def probe(typed_server):
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    try:
        r = subprocess.run(
            [sys.executable, "-c", PROBE, gcs_address(typed_server), json.dumps(DEVICES), ",".join(VARIANTS)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the probe did not finish in 120 s:\n{(e.stderr or b'')[-5000:]!r}") from None
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("PROBE-RESULT ")]
    assert r.returncode == 0 and lines, f"probe failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(lines[-1].split(" ", 1)[1])


def test_emulated_gpus_are_ray_resources(probe):
    total = probe["total"]
    assert total["GPU"] == 2
    assert total["accelerator_type:T4"] == 1 and total["accelerator_type:A100"] == 1


def test_replicas_landed_on_their_device_type(probe):
    for model, dev in DEVICES.items():
        for v in VARIANTS:
            app = f"sloserve-{model}-{v}-{dev.lower()}"
            assert probe["apps"][app]["status"] == "RUNNING", probe["apps"]
            (actor,) = probe["actors"][app]
            assert actor["state"] == "ALIVE"
            res = actor["resources"]
            assert res.get("GPU") == 0.5, res
            assert res.get(f"accelerator_type:{dev}", 0) > 0, res
            other = {f"accelerator_type:{d}" for d in DEVICES.values()} - {f"accelerator_type:{dev}"}
            assert not other & set(res), res
            assert actor["granted"].get("GPU") == 0.5, actor


def test_each_replica_reports_its_device_type(probe):
    for model, dev in DEVICES.items():
        for v in VARIANTS:
            assert probe["reported"][f"sloserve-{model}-{v}-{dev.lower()}"] == dev.lower()


def test_two_half_gpu_replicas_fill_an_emulated_gpu_and_a_third_waits(probe):
    # Two replicas per type at 0.5 GPU each: every GPU is taken ...
    assert probe["available"].get("GPU", 0) == 0, probe["available"]
    # ... so a third T4 replica is created but cannot be placed: it stays pending, not alive.
    assert not probe["probe"]["started"], probe["probe"]
    assert probe["probe"]["states"] == ["PENDING_CREATION"], probe["probe"]
    assert probe["probe"]["available"].get("GPU", 0) == 0


def test_the_server_still_answers_after_the_probe(typed_server, probe):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(typed_server.http_url)
    try:
        x = np.zeros((1, 64), dtype=np.float32)
        inp = httpclient.InferInput("input", [1, 64], "FP32")
        inp.set_data_from_numpy(x)
        assert client.infer("digits", [inp]).as_numpy("label").shape == (1,)
    finally:
        client.close()
