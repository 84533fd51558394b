"""The shipped deploy configs, started for real (their parsing and schema checks without a cluster are
tests/unit/deploy/test_manifests.py):

* ``sloserve serve --config deploy/sloserve.example.yaml`` (the SLO policy, autoscaling and the
  training harvest on; embedded Ray) on free loopback ports answers tritonclient, runs the harvest
  controller, and, with no token configured, refuses the training API with a 401 naming auth_tokens;
* the Serve config's autoscaling is exactly what a gateway deploys itself for the same settings;
* ``serve run deploy/serve/sloserve.yaml`` (its repo pointed at the demo repository) on a local Ray
  with emulated T4s and A100s brings up every application with the swayam policy, and a gateway
  started from the RayService's ConfigMap settings (``ray_deploy: false``) attaches to them and
  answers tritonclient over REST and gRPC.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.conftest import ServerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "sloserve.example.yaml"
SERVE_CONFIG = ROOT / "deploy" / "serve" / "sloserve.yaml"
RAYSERVICE = ROOT / "deploy" / "kuberay" / "rayservice.yaml"
WIDTH = {"digits": 64, "heavy": 1024}
RAY_ENV = {"RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def serve_repo(model_repo, tmp_path_factory):
    """The models the Serve config deploys (digits and heavy: the RayService's build job builds just those,
    ``sloserve models build --models digits,heavy``), copied from the demo repository: a gateway attaching with
    ``ray_deploy: false`` expects an application for every model of its repository."""
    import shutil

    repo = tmp_path_factory.mktemp("serve-repo")
    for model in sorted({a["args"]["model"] for a in yaml.safe_load(SERVE_CONFIG.read_text())["applications"]}):
        shutil.copytree(model_repo / model, repo / model)
    return repo


def configmap(key: str) -> str:
    (cm,) = [d for d in yaml.safe_load_all(RAYSERVICE.read_text()) if d and d["kind"] == "ConfigMap"]
    return cm["data"][key]


def infer_both_ways(http_url: str, grpc_url: str, models: tuple[str, ...] = ("digits", "heavy")) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    for mod in (httpclient, grpcclient):
        client = mod.InferenceServerClient(http_url if mod is httpclient else grpc_url)
        try:
            for model in models:
                x = mod.InferInput("input", [2, WIDTH[model]], "FP32")
                x.set_data_from_numpy(np.random.rand(2, WIDTH[model]).astype(np.float32) * 16)
                res = client.infer(model, [x])
                assert res.as_numpy("probs").shape == (2, 10), (mod.__name__, model)
        finally:
            client.close()


def wait_for_metric(http_url: str, prefix: str, timeout_s: float = 30.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://{http_url}/metrics", timeout=10) as r:
            if any(line.startswith(prefix) for line in r.read().decode().splitlines()):
                return True
        time.sleep(0.5)
    return False


# ---- the example gateway config -------------------------------------------------------------------
def test_example_config_serves_with_autoscaling_and_the_harvest_on(model_repo, tmp_path):
    srv = ServerProcess(
        model_repo,
        "ray",
        extra=["--config", str(EXAMPLE)],
        env={"SLOSERVE_TRAINING__JOBS_DIR": str(tmp_path / "training")},  # not the checkout's .sloserve
    )
    try:
        srv.wait_ready()
        infer_both_ways(srv.http_url, srv.grpc_url)
        # the harvest controller runs: its rounds export the jobs gauge
        assert wait_for_metric(srv.http_url, "sloserve_training_jobs{"), srv.output()
        # as shipped no token is configured: inference is open on loopback, the training API is not
        for path in ("/v2/training/placement", "/v2/training/jobs"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://{srv.http_url}{path}", timeout=10)
            assert e.value.code == 401 and "auth_tokens" in json.loads(e.value.read())["error"], path
    finally:
        assert srv.stop() == 0, srv.output()


# ---- the Serve config and the RayService's gateway settings ---------------------------------------
def test_serve_config_autoscaling_is_what_the_gateway_deploys(serve_repo):
    """For the ConfigMap's settings, the gateway's own autoscaling_config (what `ray_deploy: true`
    deploys) and each application's `autoscaling` arg agree: bounds, delays, windows, the policy,
    its SLO, batch limit and profile, and the swayam knobs after their defaults."""
    from sloserve.autoscaler.swayam import SwayamConfig
    from sloserve.gateway.backends.ray import APP_PREFIX, RayServeBackend
    from sloserve.gateway.config import Settings
    from sloserve.models.repository import ModelRepository
    from sloserve.replica.ray_replica import deployment_name

    raw = yaml.safe_load(configmap("sloserve.yaml"))
    settings = Settings.model_validate({**raw, "host": "127.0.0.1", "repo": str(serve_repo)})
    repo = ModelRepository(serve_repo).load()
    backend = RayServeBackend(repo=repo, opts=None, settings=settings)
    apps = {a["name"]: a for a in yaml.safe_load(SERVE_CONFIG.read_text())["applications"]}
    for model, loaded in repo.models.items():
        for v in loaded.config.variants:
            name = APP_PREFIX + deployment_name(model, v.name, backend.device_of(model))
            want = backend.autoscaling_config(model, v.name)
            got = apps[name]["args"]["autoscaling"]
            assert want is not None
            for cfg in (want, got):
                kw = cfg["policy"]["policy_kwargs"]
                kw["swayam"] = SwayamConfig.model_validate(kw["swayam"])
            assert got == want, name


HOLD_RAY = r"""
import json, sys, time
from sloserve.gateway.backends.ray_local import init_ray
from sloserve.gateway.config import Settings

# The embedded Ray a gateway starts, with the GPUs the Serve config's comment tells you to emulate.
init_ray(Settings(emulated_gpus={"T4": 2, "A100": 2}, ray_num_cpus=2), autoscaled=True)
import ray
from ray import serve
from ray.serve.scripts import cli

cli.main(["run", "--non-blocking", sys.argv[1]], standalone_mode=False)  # `serve run CONFIG`, in this driver
print("GCS " + ray.get_runtime_context().gcs_address, flush=True)
client = serve.context._get_global_client()
for _ in range(600):  # the controller builds each application (import_path + args) before it lists it
    apps = client.get_serve_details().get("applications", {})
    if len(apps) == len(json.loads(sys.argv[2])) and all(a.get("deployments") for a in apps.values()):
        break
    time.sleep(0.2)
print("APPS " + json.dumps({name: [
    ((d.get("deployment_config") or {}).get("autoscaling_config") or {}).get("policy", {}).get("policy_function")
    for d in app.get("deployments", {}).values()] for name, app in apps.items()}), flush=True)
sys.stdin.read()  # until the test closes our stdin
serve.shutdown()
ray.shutdown()
"""


def test_serve_config_runs_and_the_configmap_gateway_attaches(serve_repo, tmp_path):
    cfg = yaml.safe_load(SERVE_CONFIG.read_text())
    for app in cfg["applications"]:
        app["args"]["repo"] = str(serve_repo)  # the docs' sed "s#/models#$PWD/model_repository#"
    serve_cfg = tmp_path / "serve.yaml"
    serve_cfg.write_text(yaml.safe_dump(cfg))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_RAY, str(serve_cfg), json.dumps([a["name"] for a in cfg["applications"]])],
        cwd=ROOT,
        env={**os.environ, **RAY_ENV},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    gw = None
    try:
        said: dict[str, str] = {}
        lines = []
        while "APPS" not in said:
            line = holder.stdout.readline()
            assert line, f"the Ray holder exited ({holder.poll()}):\n{''.join(lines)[-5000:]}"
            lines.append(line)
            word, _, rest = line.strip().partition(" ")
            if word in ("GCS", "APPS"):
                said[word] = rest
        policies = json.loads(said["APPS"])
        assert sorted(policies) == sorted(a["name"] for a in cfg["applications"])
        assert all(p == ["sloserve.gateway.backends.ray_policy:SwayamRayPolicy"] for p in policies.values()), policies

        gw_cfg = tmp_path / "sloserve.yaml"
        gw_cfg.write_text(configmap("sloserve.yaml"))
        gw = ServerProcess(
            serve_repo,
            "ray",  # as in the ConfigMap (ray_deploy: false): it attaches to the applications above
            extra=["--config", str(gw_cfg), "--host", "127.0.0.1", "--ray-address", said["GCS"]],
            env=RAY_ENV,
        )
        gw.wait_ready(180)
        infer_both_ways(gw.http_url, gw.grpc_url)
        assert gw.stop() == 0, gw.output()
    finally:
        if gw is not None and gw.proc.poll() is None:
            gw.kill()
        holder.stdin.close()
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(holder.pid, 9)
            holder.wait()
        # what the embedded Ray left in the holder's process group goes too
        try:
            os.killpg(holder.pid, 9)
        except ProcessLookupError:
            pass
