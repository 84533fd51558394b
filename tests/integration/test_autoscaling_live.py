"""The swayam policy live, as Ray Serve's custom autoscaling policy, fed by the gateway's rates:
a load step scales the deployment up, and it scales back in after the keep-alive, within bounds."""

import json
import threading
import time
import urllib.request

import pytest

from sloserve.loadtests.emulated import slow_variant_repo
from sloserve.loadtests.promtext import samples
from tests.conftest import ServerProcess

pytestmark = pytest.mark.integration
BODY = json.dumps(
    {
        "inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}],
        "parameters": {"slo_ms": 200},
    }
).encode()


@pytest.fixture(scope="module")
def scaling_server(model_repo, tmp_path_factory):
    """digits with one variant whose replicas take 20 ms a batch (fault_delay_ms), batches of <= 4,
    and a profile that says so: one replica serves ~150 rows/s within the SLO."""
    import shutil

    repo = slow_variant_repo(model_repo, tmp_path_factory.mktemp("repo"), "digits", "small", 20, 4)
    # a second model whose replicas hold all three variants (shared_replicas): one Serve deployment
    shutil.copytree(model_repo / "digits", repo / "trio", ignore=shutil.ignore_patterns("profiles", ".built"))
    trio = json.loads((repo / "trio" / "config.json").read_text())
    trio["name"] = "trio"
    (repo / "trio" / "config.json").write_text(json.dumps(trio))
    settings = repo / "settings.json"
    settings.write_text(
        json.dumps(
            {
                "models": {
                    "digits": {
                        "fault_delay_ms": 20,
                        "slo_ms": 200,
                        # the keep-alive alone scales in (no quantile hold, no seasonal term): a short test's load
                        "autoscaling": {
                            "min_replicas": 1,
                            "max_replicas": 3,
                            "startup_s": 2,
                            "keep_alive_s": 6,
                            "interval_s": 1,
                            "predictor": "last",
                            "hold_quantile": 0,
                            "season_periods_s": [],
                        },
                    },
                    "trio": {
                        "shared_replicas": True,
                        "slo_ms": 500,
                        "autoscaling": {
                            "min_replicas": 1,
                            "max_replicas": 2,
                            "startup_s": 2,
                            "keep_alive_s": 6,
                            "interval_s": 1,
                        },
                    },
                }
            }
        )
    )
    s = ServerProcess(repo, "ray", ["--config", str(settings)]).wait_ready()
    s.repo_dir = repo
    yield s
    s.stop()


def running_replicas(server) -> int:
    with urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10) as r:
        for s in samples(r.read().decode(), "sloserve_replicas", model="digits", state="running"):
            return int(s.value)
    return -1


def load(server, stop: threading.Event, counts: dict):
    def worker():
        while not stop.is_set():
            req = urllib.request.Request(
                f"http://{server.http_url}/v2/models/digits/infer",
                data=BODY,
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    r.read()
                counts["ok"] += 1
            except Exception:  # refusals count too: the point here is the offered load
                counts["err"] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(12)]
    for t in threads:
        t.start()
    return threads


def wait_for(pred, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.5)
    return False


def test_load_step_scales_up_then_back_in(scaling_server):
    s = scaling_server
    assert wait_for(lambda: running_replicas(s) == 1, 30)
    stop, counts = threading.Event(), {"ok": 0, "err": 0}
    threads = load(s, stop, counts)
    try:
        scaled = wait_for(lambda: running_replicas(s) >= 2, 45)
        peak = running_replicas(s)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    assert scaled, f"no scale-up under load ({counts}):\n{s.output()}"
    assert peak <= 3  # max_replicas
    assert counts["ok"] > 0
    # No traffic: after the 6 s keep-alive the swayam policy scales back to min_replicas.
    assert wait_for(lambda: running_replicas(s) == 1, 60), f"no scale-in:\n{s.output()}"


def infer(server, model: str, variant: str | None) -> dict:
    headers = {"content-type": "application/json", **({"x-variant": variant} if variant else {})}
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/infer", data=BODY, headers=headers, method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_shared_replicas_serve_every_variant_from_one_deployment(scaling_server):
    """trio's replicas hold small, medium and large: each pinned variant is answered by that variant's own
    session (its outputs), from the one deployment the gateway made for the model."""
    import numpy as np

    from sloserve.models.repository import ModelConfig
    from sloserve.replica.runtime import Replica, RuntimeOptions

    s = scaling_server
    x = {"input": np.array([json.loads(BODY)["inputs"][0]["data"]], np.float32)}
    expected = {
        v: Replica(s.repo_dir / "trio" / v / "model.onnx", RuntimeOptions(device="cpu"), ["probs"]).run(x)["probs"][0]
        for v in ("large", "medium", "small")
    }
    assert not np.allclose(expected["large"], expected["small"], atol=1e-4)  # the variants answer differently
    for v in ("large", "medium", "small"):
        out = infer(s, "trio", v)
        assert out["parameters"]["variant"] == v, out
        probs = next(o for o in out["outputs"] if o["name"] == "probs")["data"]
        assert np.allclose(probs, expected[v], atol=1e-4), (v, probs)  # the replica ran that variant's session
    # the most accurate variant (ties: the cheaper), as the build measured it here: large or medium
    best = ModelConfig.model_validate_json((s.repo_dir / "trio" / "config.json").read_text()).best_variant
    assert infer(s, "trio", None)["parameters"]["variant"] == best  # the most accurate, at this load
    with urllib.request.urlopen(f"http://{s.http_url}/metrics", timeout=10) as r:
        gauge = list(samples(r.read().decode(), "sloserve_replicas", model="trio", state="running"))
    # one deployment: its replicas are counted once, under the best variant (dashboards sum by model)
    assert len(gauge) == 1 and gauge[0].labels["variant"] == best and gauge[0].value == 1.0, gauge
