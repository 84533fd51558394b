"""Profiles measured on other hardware (sloserve/modeltools/measured, sloserve/sim/measured) reach the tables that use them."""

from __future__ import annotations

import json

import pytest

from sloserve.batching.profile import ProfileTable, write_profile
from sloserve.modeltools.demo import MEASURED_DIR, copy_measured_profiles
from sloserve.sim.profiles import default_profiles, measured_curves, service_for


def _profile(device: str, p50: list[float]) -> dict:
    return {
        "model": "heavy",
        "variant": "large",
        "device_type": device,
        "batch_sizes": [1, 64],
        "p50_ms": p50,
        "p99_ms": [x * 1.2 for x in p50],
        "throughput_rps": [1.0, 1.0],
    }


def test_build_copies_measured_profiles_without_overwriting_a_local_one(tmp_path):
    measured, repo = tmp_path / "measured", tmp_path / "repo"
    for dev, p50 in (("gpu-x", [0.2, 0.3]), ("cpu-here", [9.0, 9.0])):
        (measured / "heavy" / "large").mkdir(parents=True, exist_ok=True)
        (measured / "heavy" / "large" / f"{dev}.json").write_text(json.dumps(_profile(dev, p50)))
    (repo / "heavy" / "large").mkdir(parents=True)
    write_profile(repo / "heavy" / "large" / "profiles" / "cpu-here.json", _profile("cpu-here", [1.5, 11.5]))

    copied = copy_measured_profiles(repo, ["heavy"], log=lambda _: None, measured=measured)

    assert [p.name for p in copied] == ["gpu-x.json"]
    t = ProfileTable.load(repo)
    assert t.device_types("heavy", "large") == ["cpu-here", "gpu-x"]
    assert t.latency_s("heavy", "large", "cpu-here", 64, "p50") == pytest.approx(0.0115)  # local kept
    assert t.latency_s("heavy", "large", "gpu-x", 64, "p50") == pytest.approx(0.0003)


def test_build_skips_models_it_did_not_build(tmp_path):
    measured, repo = tmp_path / "measured", tmp_path / "repo"
    (measured / "other" / "v").mkdir(parents=True)
    (measured / "other" / "v" / "gpu-x.json").write_text("{}")
    (repo / "heavy" / "large").mkdir(parents=True)
    assert copy_measured_profiles(repo, ["heavy"], log=lambda _: None, measured=measured) == []


def test_shipped_h100_profiles_cover_every_demo_variant():
    shipped = {(p.parts[-3], p.parts[-2]) for p in MEASURED_DIR.glob("*/*/nvidia-h100-80gb-hbm3.json")}
    demo = {(m, v) for m in ("digits", "heavy", "cnn") for v in ("small", "medium", "large")}
    assert shipped == demo
    for p in MEASURED_DIR.glob("*/*/*.json"):
        doc = json.loads(p.read_text())
        assert "accuracy" not in doc  # accuracy belongs to this host's build, not to the device
        assert doc["runtime"]["providers"][0] == "CUDAExecutionProvider"


def test_sim_loads_measured_curves_under_their_alias(tmp_path):
    doc = {
        "alias": "gpu-x",
        "models": {"resnet50": {"batch_sizes": [1, 8], "p50_ms": [2.0, 3.0], "p99_ms": [2.5, 3.5]}},
    }
    (tmp_path / "gpu-x.json").write_text(json.dumps(doc))
    assert set(measured_curves(tmp_path)) == {("resnet50", "default", "gpu-x")}
    table = default_profiles(tmp_path)
    assert table.latency_s("resnet50", "default", "gpu-x", 8, "p99") == pytest.approx(0.0035)
    assert table.latency_s("resnet50", "default", "t4", 1, "p50") == pytest.approx(0.0019)  # published kept
    svc = service_for(table, "resnet50", "gpu-x", slo_ms=100)
    assert svc is not None


def test_sim_rejects_a_device_it_has_no_curve_for():
    with pytest.raises(KeyError, match="no profile for gpt2-gen on h100"):
        service_for(default_profiles(), "gpt2-gen", "h100", slo_ms=1000)


def test_shipped_h100_curves_are_in_the_default_table():
    t = default_profiles()
    for m in ("resnet50", "efficientnet-b0", "bert-base"):
        assert t.curves[(m, "default", "h100")].batch_sizes[-1] == 128


def test_a_host_without_its_own_profile_falls_back_to_one_of_the_same_kind():
    pts = {
        ("heavy", "large", "cpu-other"): ([1, 64], [1.5, 11.5], [2.0, 13.0]),
        ("heavy", "large", "nvidia-h100-80gb-hbm3"): ([1, 64], [0.19, 0.23], [0.2, 0.3]),
    }
    t = ProfileTable.from_points(pts)
    assert t.latency_s("heavy", "large", "cpu-this-host", 64, "p50") == pytest.approx(0.0115)
    assert t.latency_s("heavy", "large", "nvidia-a100", 64, "p50") == pytest.approx(0.00023)
