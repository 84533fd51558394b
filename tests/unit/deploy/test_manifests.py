"""deploy/ manifests, checked without a cluster: they parse, Ray's own Serve schema accepts the Serve
configs, the import paths and their args build real Serve applications (without starting Ray), the
resources the replicas ask for are offered by a worker group, and the gateway pods' command and
settings are ones sloserve itself accepts and that find the deployed applications."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
SERVE_CONFIG = DEPLOY / "serve" / "sloserve.yaml"
RAYSERVICE = DEPLOY / "kuberay" / "rayservice.yaml"
EXAMPLE = DEPLOY / "sloserve.example.yaml"


def _yaml_files() -> list[Path]:
    return sorted(p for ext in ("*.yaml", "*.yml") for p in DEPLOY.rglob(ext))


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _kind(kind: str, name: str | None = None) -> dict:
    found = [d for d in _docs(RAYSERVICE) if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''} in {RAYSERVICE.name}, found {len(found)}"
    return found[0]


def _rayservice() -> dict:
    return _kind("RayService")


def _embedded_serve_config() -> dict:
    return yaml.safe_load(_rayservice()["spec"]["serveConfigV2"])


def _serve_configs() -> dict[str, dict]:
    return {
        "deploy/serve/sloserve.yaml": yaml.safe_load(SERVE_CONFIG.read_text()),
        "RayService serveConfigV2": _embedded_serve_config(),
    }


def _groups() -> list[dict]:
    return _rayservice()["spec"]["rayClusterConfig"]["workerGroupSpecs"]


def _ray_start_resources(params: dict) -> dict[str, float]:
    """KubeRay's rayStartParams.resources: a JSON object inside a quoted string, '"{\\"T\\": 1}"'."""
    raw = params.get("resources")
    if raw is None:
        return {}
    words = shlex.split(raw)  # the shell quoting KubeRay passes through to `ray start`
    assert len(words) == 1, raw
    return {k: float(v) for k, v in json.loads(words[0]).items()}


def _containers(pod_spec: dict) -> list[dict]:
    return pod_spec.get("containers", [])


def _demo_models() -> dict[str, list[str]]:
    from sloserve.modeltools.demo import DIGITS_VARIANTS, HEAVY_VARIANTS

    return {"digits": [v[0] for v in DIGITS_VARIANTS], "heavy": [v[0] for v in HEAVY_VARIANTS]}


# ---- parsing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_parses(path):
    docs = list(yaml.safe_load_all(path.read_text()))
    assert any(d is not None for d in docs), f"{path} is empty"


def test_the_manifests_this_suite_checks_exist():
    names = {p.relative_to(DEPLOY).as_posix() for p in _yaml_files()}
    assert {"serve/sloserve.yaml", "kuberay/rayservice.yaml", "sloserve.example.yaml"} <= names
    kinds = [d["kind"] for d in _docs(RAYSERVICE)]
    for kind in ("RayService", "Deployment", "Service", "ConfigMap", "PersistentVolumeClaim"):
        assert kind in kinds
    assert _rayservice()["apiVersion"] == "ray.io/v1"


# ---- Ray's own schema -----------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["deploy/serve/sloserve.yaml", "RayService serveConfigV2"])
def test_ray_serve_deploy_schema_accepts_the_serve_config(which):
    from ray.serve.schema import ServeDeploySchema

    cfg = _serve_configs()[which]
    schema = (
        ServeDeploySchema.model_validate(cfg)
        if hasattr(ServeDeploySchema, "model_validate")
        else ServeDeploySchema.parse_obj(cfg)
    )
    assert len(schema.applications) == sum(len(v) for v in _demo_models().values())
    # The gateway is the front door: no application is routed through a Serve HTTP proxy.
    assert all(app.route_prefix is None for app in schema.applications)
    assert str(schema.proxy_location.value) in ("Disabled", "HeadOnly")


def test_the_rayservice_deploys_the_same_applications_as_the_serve_config():
    plain, embedded = _serve_configs().values()
    assert plain["applications"] == embedded["applications"]
    assert plain["proxy_location"] == "Disabled"  # a plain cluster needs no proxy at all


def test_every_demo_model_and_variant_is_deployed_once():
    for which, cfg in _serve_configs().items():
        pairs = sorted((a["args"]["model"], a["args"]["variant"]) for a in cfg["applications"])
        want = sorted((m, v) for m, vs in _demo_models().items() for v in vs)
        assert pairs == want, which


# ---- import paths and builders ----------------------------------------------------------------------
def _build(app_cfg: dict):
    """Resolve and call the builder as `serve deploy` does (import_attr + Serve's own arg handling)."""
    from ray._common.utils import import_attr
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    builder = import_attr(app_cfg["import_path"])
    assert callable(builder), app_cfg["import_path"]
    return call_user_app_builder_with_args_if_necessary(builder, app_cfg.get("args", {}))


def _applications() -> list[tuple[str, dict]]:
    return [(which, a) for which, cfg in _serve_configs().items() for a in cfg["applications"]]


@pytest.mark.parametrize("which,app_cfg", _applications(), ids=lambda x: x if isinstance(x, str) else x["name"])
def test_import_path_builds_an_application_without_starting_ray(which, app_cfg):
    import ray
    from ray.serve import Application

    from sloserve.replica.ray_replica import OnnxReplica, deployment_name

    was_up = ray.is_initialized()
    app = _build(app_cfg)
    assert isinstance(app, Application)
    assert ray.is_initialized() == was_up, "building a Serve application must not start Ray"
    dep = app._bound_deployment
    args = app_cfg["args"]
    assert dep.func_or_class is OnnxReplica
    assert dep.name == deployment_name(args["model"], args["variant"], args["device"])
    # The app name is the one the gateway looks for: sloserve-<deployment name>.
    assert app_cfg["name"] == "sloserve-" + dep.name
    auto = dep._deployment_config.autoscaling_config  # Ray's own AutoscalingConfig, validated by .options()
    assert auto is not None, f"{app_cfg['name']}: autoscaling is off"
    assert (auto.min_replicas, auto.max_replicas) == (
        args["autoscaling"]["min_replicas"],
        args["autoscaling"]["max_replicas"],
    )
    assert auto.policy.policy_function == "sloserve.gateway.backends.ray_policy:SwayamRayPolicy"
    assert dep.max_ongoing_requests == args["pipeline_depth"]
    assert dep.init_args[:4] == (args["repo"], args["model"], args["variant"], args["device"])


def test_builder_args_name_real_runtime_options():
    from sloserve.replica.runtime import RuntimeOptions

    for _, app_cfg in _applications():
        RuntimeOptions(**app_cfg["args"].get("runtime", {}))  # unknown keys would raise TypeError


BUILD_APP_ARGS = {
    "repo",
    "model",
    "variant",
    "variants",
    "device",
    "num_replicas",
    "autoscaling",
    "num_cpus",
    "gpu_fraction",
    "pipeline_depth",
    "runtime",
    "health_check_period_s",
    "fault_delay_s",
    "channel_host",
}


def test_builder_args_are_ones_build_app_reads():
    """build_app reads its args with .get(): a misspelt key would be ignored silently, so check them."""
    import inspect

    from sloserve.replica.ray_replica import build_app

    src = inspect.getsource(build_app)
    assert all(f'"{k}"' in src for k in BUILD_APP_ARGS), "BUILD_APP_ARGS lists a key build_app does not read"
    for _, app_cfg in _applications():
        unknown = set(app_cfg["args"]) - BUILD_APP_ARGS
        assert not unknown, f"{app_cfg['name']}: args build_app does not read: {sorted(unknown)}"


def test_swayam_policy_accepts_its_kwargs():
    """Each application's policy_kwargs build the policy Ray's controller instantiates (SwayamRayPolicy,
    its swayam knobs through SwayamConfig). That they are what the gateway itself would deploy is
    tests/integration/test_deploy_configs.py (it needs the built repository)."""
    from sloserve.gateway.backends.ray_policy import SwayamRayPolicy

    for _, app_cfg in _applications():
        kwargs = app_cfg["args"]["autoscaling"]["policy"]["policy_kwargs"]
        policy = SwayamRayPolicy(**kwargs)
        assert policy.service.slo_s * 1e3 == pytest.approx(kwargs["slo_ms"])
        assert len(kwargs["batch_sizes"]) == len(kwargs["p99_ms"])


# ---- resources: what the replicas ask for, the worker groups offer ----------------------------------
def _actor_options(app_cfg: dict) -> dict:
    return _build(app_cfg)._bound_deployment.ray_actor_options


def test_every_accelerator_a_replica_asks_for_is_offered_by_a_worker_group():
    offered = {}
    for g in _groups():
        for res, _n in _ray_start_resources(g["rayStartParams"]).items():
            offered.setdefault(res, []).append(g["groupName"])
    asked = set()
    for _, app_cfg in _applications():
        for res in _actor_options(app_cfg).get("resources", {}):
            asked.add(res)
            assert res in offered, f"{app_cfg['name']} needs {res}; no worker group offers it"
    assert {"accelerator_type:T4", "accelerator_type:A100"} <= asked


def test_each_gpu_type_has_room_for_its_replicas():
    """Per accelerator type: GPUs and CPUs the groups offer (initial pod count) cover the replicas'
    demand, and one replica fits on one pod."""
    apps = _embedded_serve_config()["applications"]
    demand: dict[str, dict[str, float]] = {}
    for app_cfg in apps:
        opts = _actor_options(app_cfg)
        n = app_cfg["args"]["autoscaling"]["min_replicas"]  # the replicas that start; the autoscaler adds pods
        for res in opts.get("resources", {}):
            d = demand.setdefault(res, {"GPU": 0.0, "CPU": 0.0, "max_gpu": 0.0, "max_cpu": 0.0})
            d["GPU"] += n * opts.get("num_gpus", 0)
            d["CPU"] += n * opts.get("num_cpus", 1)
            d["max_gpu"] = max(d["max_gpu"], opts.get("num_gpus", 0))
            d["max_cpu"] = max(d["max_cpu"], opts.get("num_cpus", 1))
    assert demand
    for res, d in demand.items():
        groups = [g for g in _groups() if res in _ray_start_resources(g["rayStartParams"])]
        gpus = sum(g["replicas"] * float(g["rayStartParams"]["num-gpus"]) for g in groups)
        cpus = sum(g["replicas"] * float(g["rayStartParams"]["num-cpus"]) for g in groups)
        assert gpus >= d["GPU"], f"{res}: replicas need {d['GPU']} GPUs, groups offer {gpus}"
        assert cpus >= d["CPU"], f"{res}: replicas need {d['CPU']} CPUs, groups offer {cpus}"
        assert all(float(g["rayStartParams"]["num-gpus"]) >= d["max_gpu"] for g in groups)
        assert all(float(g["rayStartParams"]["num-cpus"]) >= d["max_cpu"] for g in groups)


def test_worker_groups_match_their_gpu_type_in_kubernetes_too():
    """Each group: GPUs asked of Kubernetes = num-gpus given to Ray, and the pods are pinned to nodes
    with that accelerator (nodeSelector or node affinity on an accelerator label)."""
    for g in _groups():
        params = g["rayStartParams"]
        (acc,) = [r.split(":", 1)[1] for r in _ray_start_resources(params) if r.startswith("accelerator_type:")]
        spec = g["template"]["spec"]
        (c,) = _containers(spec)
        for kind in ("requests", "limits"):
            assert float(c["resources"][kind]["nvidia.com/gpu"]) == float(params["num-gpus"]), g["groupName"]
            assert float(c["resources"][kind]["cpu"]) == float(params["num-cpus"]), g["groupName"]
        selector = json.dumps([spec.get("nodeSelector"), spec.get("affinity")])
        assert "nvidia.com/gpu.product" in selector or "gke-accelerator" in selector, g["groupName"]
        assert acc.lower() in selector.lower(), f"group {g['groupName']} is not pinned to {acc} nodes"
        assert g["template"]["metadata"]["labels"]["sloserve.io/accelerator"] == acc
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]


def test_head_runs_no_replicas_and_exposes_the_ray_client_port():
    head = _rayservice()["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    ports = {p["containerPort"] for c in _containers(head["template"]["spec"]) for p in c.get("ports", [])}
    assert {6379, 8265, 10001} <= ports


# ---- the model repository volume ------------------------------------------------------------------
def _pod_specs() -> dict[str, dict]:
    rc = _rayservice()["spec"]["rayClusterConfig"]
    specs = {"head": rc["headGroupSpec"]["template"]["spec"]}
    specs.update({f"worker:{g['groupName']}": g["template"]["spec"] for g in rc["workerGroupSpecs"]})
    specs["gateway"] = _kind("Deployment", "sloserve-gateway")["spec"]["template"]["spec"]
    specs["harvest"] = _kind("Deployment", "sloserve-harvest")["spec"]["template"]["spec"]
    return specs


def test_every_pod_mounts_the_model_repository_where_the_replicas_read_it():
    claim = _kind("PersistentVolumeClaim", "sloserve-models")["metadata"]["name"]
    assert "ReadWriteMany" in _kind("PersistentVolumeClaim", claim)["spec"]["accessModes"]
    repos = {a["args"]["repo"] for a in _embedded_serve_config()["applications"]}
    assert len(repos) == 1
    (repo,) = repos
    for name, spec in _pod_specs().items():
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = [
            m
            for c in _containers(spec)
            for m in c.get("volumeMounts", [])
            if vols.get(m["name"], {}).get("persistentVolumeClaim", {}).get("claimName") == claim
        ]
        assert [m["mountPath"] for m in mounts] == [repo], name


# ---- the gateways -----------------------------------------------------------------------------------
def _gateway_container(deployment: str = "sloserve-gateway") -> dict:
    (c,) = _containers(_kind("Deployment", deployment)["spec"]["template"]["spec"])
    return c


def _gateway_settings(tmp_path: Path, monkeypatch, deployment: str = "sloserve-gateway"):
    """What `sloserve serve` resolves in the gateway pod: its command line parsed by sloserve's own
    parser, over the ConfigMap's settings file mounted where the command says."""
    from sloserve.cli.main import build_parser
    from sloserve.cli.serve import settings_from_args

    c = _gateway_container(deployment)
    argv = c["command"] + c.get("args", [])
    assert argv[0] == "sloserve"
    args = build_parser().parse_args(argv[1:])
    assert args.cmd == "serve"
    spec = _kind("Deployment", deployment)["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [m for m in c["volumeMounts"] if "configMap" in vols[m["name"]]]
    cm = _kind("ConfigMap", vols[mount["name"]]["configMap"]["name"])
    rel = Path(args.config).relative_to(mount["mountPath"])
    local = tmp_path / rel
    local.write_text(cm["data"][str(rel)])
    # The pod's environment from its Secrets (a placeholder token; the manifest must name the Secret).
    env = {e["name"]: e for e in c["env"]}
    assert env["SLOSERVE_AUTH_TOKENS"]["valueFrom"]["secretKeyRef"]["name"] == "sloserve-gateway-tokens"
    monkeypatch.setenv("SLOSERVE_AUTH_TOKENS", "placeholder-token-0123 *")
    settings = settings_from_args(args, local)  # exactly what `sloserve serve` resolves
    return args, settings


def test_gateway_command_parses_and_its_settings_validate(tmp_path, monkeypatch):
    _, s = _gateway_settings(tmp_path, monkeypatch)
    assert s.backend == "ray"
    assert s.ray_deploy is False, "gateways attach to the RayService's replicas; they must not deploy them"
    assert s.host == "0.0.0.0"
    head_svc = _rayservice()["metadata"]["name"] + "-head-svc"
    assert s.ray_address == f"ray://{head_svc}:10001"
    ports = {p["name"]: p["containerPort"] for p in _gateway_container()["ports"]}
    assert (ports["http"], ports["grpc"]) == (s.http_port, s.grpc_port)
    svc = _kind("Service", "sloserve-gateway")
    assert (
        svc["spec"]["selector"].items()
        <= _kind("Deployment", "sloserve-gateway")["spec"]["template"]["metadata"]["labels"].items()
    )
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {"http", "grpc"}
    assert _kind("Deployment", "sloserve-gateway")["spec"]["replicas"] >= 2  # no single point of failure


def test_gateway_finds_exactly_the_applications_the_rayservice_deploys(tmp_path, monkeypatch):
    """With ray_deploy false the gateway derives app and deployment names from the repository and its
    models.<m>.device_type; they must be the ones serveConfigV2 deploys, with the same pipeline depth."""
    from sloserve.gateway.backends.ray import APP_PREFIX, RayServeBackend
    from sloserve.replica.ray_replica import deployment_name

    _, s = _gateway_settings(tmp_path, monkeypatch)
    backend = RayServeBackend(repo=SimpleNamespace(models={}), opts=None, settings=s)
    expected = {
        APP_PREFIX + deployment_name(m, v, backend.device_of(m)) for m, vs in _demo_models().items() for v in vs
    }
    apps = _embedded_serve_config()["applications"]
    assert expected == {a["name"] for a in apps}
    assert {a["args"]["pipeline_depth"] for a in apps} == {s.pipeline_depth}
    assert s.repo == Path(apps[0]["args"]["repo"])


def test_the_gateways_run_the_slo_policy_and_feed_the_autoscaler(tmp_path, monkeypatch):
    """The front door batches with the SLO policy and stamps its rates for swayam (models.<m>.autoscaling,
    with the bounds serveConfigV2 deploys); the gateway pods share the replicas' slots by lease, with
    their shares measured, none configured."""
    _, s = _gateway_settings(tmp_path, monkeypatch)
    assert s.default_policy == "slo"
    assert not s.training.enabled, "the harvest runs in one pod only (sloserve-harvest)"
    assert _kind("Deployment", "sloserve-gateway")["spec"]["replicas"] > 1
    assert s.capacity_leases in ("auto", "on") and s.ray_address, "several gateway pods must share slots by lease"
    for a in _embedded_serve_config()["applications"]:
        args = a["args"]
        auto = s.models[args["model"]].autoscaling
        assert auto is not None, f"{args['model']}: the gateways do not stamp rates for its autoscaler"
        assert (auto.min_replicas, auto.max_replicas) == (
            args["autoscaling"]["min_replicas"],
            args["autoscaling"]["max_replicas"],
        ), a["name"]


def test_one_harvest_gateway_runs_the_training_harvest(tmp_path, monkeypatch):
    """sloserve-harvest: one pod (Recreate), the training harvest on, its jobs_dir on a ReadWriteMany
    volume that every GPU worker mounts at the same path (the jobs run there and write their
    checkpoints), attached to the same applications, sending no rate stamps (it takes no traffic)."""
    from sloserve.gateway.backends.ray import APP_PREFIX, RayServeBackend
    from sloserve.replica.ray_replica import deployment_name

    dep = _kind("Deployment", "sloserve-harvest")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    args, s = _gateway_settings(tmp_path, monkeypatch, "sloserve-harvest")
    assert args.cmd == "serve"
    assert s.training.enabled and s.backend == "ray" and s.ray_deploy is False
    assert all(o.autoscaling is None for o in s.models.values())
    apps = _embedded_serve_config()["applications"]
    assert {a["args"]["gpu_fraction"] for a in apps} == {s.replica_gpu_fraction}
    backend = RayServeBackend(repo=SimpleNamespace(models={}), opts=None, settings=s)
    assert {
        APP_PREFIX + deployment_name(a["args"]["model"], a["args"]["variant"], backend.device_of(a["args"]["model"]))
        for a in apps
    } == {a["name"] for a in apps}
    claim = "sloserve-training"
    assert "ReadWriteMany" in _kind("PersistentVolumeClaim", claim)["spec"]["accessModes"]
    for name, spec in _pod_specs().items():
        if name == "harvest" or name.startswith("worker:"):
            vols = {v["name"]: v for v in spec.get("volumes", [])}
            mounts = [
                m["mountPath"]
                for c in _containers(spec)
                for m in c.get("volumeMounts", [])
                if vols.get(m["name"], {}).get("persistentVolumeClaim", {}).get("claimName") == claim
                and not m.get("readOnly")
            ]
            assert mounts == [str(s.training.jobs_dir)], name
    svc = _kind("Service", "sloserve-harvest")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    front = _kind("Service", "sloserve-gateway")["spec"]["selector"]
    assert not front.items() <= dep["spec"]["template"]["metadata"]["labels"].items(), "no inference to the harvest"


def test_gpu_workers_push_autoscaling_metrics_often():
    """The swayam policy's look-back (10 s) needs the replicas' metric pushes more often than Ray's 10 s."""
    look_back = {a["args"]["autoscaling"]["look_back_period_s"] for a in _embedded_serve_config()["applications"]}
    for g in _groups():
        (c,) = _containers(g["template"]["spec"])
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert float(env["RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S"]) < min(look_back), g["groupName"]


def _uncomment_examples(text: str) -> str:
    """The example file with its commented `key: value` lines (at any indentation) switched on."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^( {0,6})# ([a-z_]+):( .*)?$", line)  # not the notes that continue a line, further right
        if m and not m[2].startswith("example"):
            line = f"{m[1]}{m[2]}:{m[3] or ''}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_example_settings_file_validates_including_its_commented_examples(tmp_path):
    from sloserve.gateway.config import load_settings

    s = load_settings(EXAMPLE)
    assert s.backend == "ray" and s.ray_deploy is True
    f = tmp_path / "example.yaml"
    f.write_text(_uncomment_examples(EXAMPLE.read_text()))
    s2 = load_settings(f)
    assert s2.ray_address == "auto" and s2.ray_num_cpus == 2
    assert s2.models["digits"].device_type == "T4" and s2.models["heavy"].device_type == "A100"
    assert s2.models["digits"].slo_ms == 20 and s2.models["digits"].instances == 2


def test_example_settings_turn_the_features_on():
    from sloserve.gateway.config import load_settings

    s = load_settings(EXAMPLE)
    assert s.default_policy == "slo"
    assert s.training.enabled
    for model in _demo_models():
        assert s.models[model].autoscaling is not None, model


# The example's values that are not the defaults: each is marked "on here" in the file.
ON_HERE = {"models", "training.enabled"}


def test_example_values_are_the_defaults_except_those_marked_on_here():
    """The file says its values are the defaults except the lines marked "on here": check it, key by
    key, against the pydantic defaults (autoscaling knobs against AutoscalingSettings')."""
    from sloserve.gateway.config import AutoscalingSettings, Settings, TrainingSettings

    raw = yaml.safe_load(EXAMPLE.read_text())
    text = EXAMPLE.read_text()
    defaults = Settings.model_construct()
    differ = []
    for key, value in raw.items():
        if key == "models":
            continue
        if key == "training":
            tdef = TrainingSettings()
            for k, v in value.items():
                if TrainingSettings.model_validate({k: v}).model_dump()[k] != tdef.model_dump()[k]:
                    differ.append(f"training.{k}")
            continue
        field = Settings.model_fields[key]
        want = field.get_default(call_default_factory=True)
        got = Settings.model_validate({"host": defaults.host, key: value}).model_dump()[key]
        if got != (want if not hasattr(want, "model_dump") else want.model_dump()):
            differ.append(key)
    assert set(differ) <= ON_HERE, f"not defaults, yet not marked 'on here': {sorted(set(differ) - ON_HERE)}"
    for key in ON_HERE:
        leaf = key.split(".")[-1]
        assert re.search(rf"^\s*{leaf}:.*# on here \(default", text, re.M), f"{key} is not marked 'on here'"
    auto_def = AutoscalingSettings().model_dump()
    for model, over in raw["models"].items():
        auto = over["autoscaling"]
        assert all(AutoscalingSettings.model_validate(auto).model_dump()[k] == auto_def[k] for k in auto), model
