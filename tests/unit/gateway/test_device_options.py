"""A model on several device types, as the data plane sees it: its options from the profiles (dominated
ones dropped), the policy's keys, and each request's allowed options (pinned variant, pinned device
type, unknown type). Nothing is started: the backend computes the options on the first ask."""

import json
from pathlib import Path

import numpy as np
import pytest

from sloserve.batching.options import split_key, variant_of
from sloserve.gateway.backends.threads import InProcessBackend
from sloserve.gateway.config import Settings
from sloserve.gateway.dataplane import DataPlane
from sloserve.gateway.errors import InvalidArgument
from sloserve.gateway.requestcheck import allowed_variants
from sloserve.gateway.types import InferRequest, RequestParams
from sloserve.loadtests.emulated import emulated_type_repo
from sloserve.models.repository import ModelRepository
from sloserve.replica.runtime import RuntimeOptions, device_type

EMUL = "emul-slow"


def dominate(root: Path, model: str, worse: str, better: str) -> None:
    """Make ``worse`` dominated by ``better`` by construction, whatever this machine's build measured
    (scikit-learn's numerics, so the demo models' accuracies, differ by CPU): less accurate, and no
    faster at any profiled batch size on any device type."""
    cfg_path = root / model / "config.json"
    cfg = json.loads(cfg_path.read_text())
    acc = {v["name"]: v["accuracy"] for v in cfg["variants"]}
    for v in cfg["variants"]:
        if v["name"] == worse:
            v["accuracy"] = round(acc[better] - 0.01, 4)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    for prof in sorted((root / model / better / "profiles").glob("*.json")):
        theirs = json.loads(prof.read_text())
        own_path = root / model / worse / "profiles" / prof.name
        own = json.loads(own_path.read_text())
        assert own["batch_sizes"] == theirs["batch_sizes"], prof
        for key in ("p50_ms", "p99_ms"):
            own[key] = [max(o, 1.5 * t) for o, t in zip(own[key], theirs[key], strict=True)]
        own["throughput_rps"] = [b / (x / 1e3) for b, x in zip(own["batch_sizes"], own["p50_ms"], strict=True)]
        own_path.write_text(json.dumps(own, indent=2))


def make_plane(model_repo, root, types) -> DataPlane:
    emulated_type_repo(model_repo, root, "heavy", EMUL, 3.0)
    emulated_type_repo(model_repo, root, "digits", EMUL, 3.0)
    dominate(root, "digits", "large", "medium")
    repo = ModelRepository(root).load()
    settings = Settings(backend="inprocess", repo=root, models={m: {"device_types": t} for m, t in types.items()})
    backend = InProcessBackend(repo, RuntimeOptions(device="cpu"), device_types=types)
    return DataPlane(repo, backend, settings)


@pytest.fixture(scope="module")
def plane(model_repo, tmp_path_factory):
    return make_plane(model_repo, tmp_path_factory.mktemp("opts") / "repo", {"heavy": ["cpu", EMUL]})


def req(model: str = "heavy", **params) -> InferRequest:
    return InferRequest(model, None, {}, params=RequestParams(**params))


def test_options_rank_variants_by_accuracy_and_types_fastest_first(plane):
    m = plane.models["heavy"]
    cpu = device_type("cpu")
    assert m.device_types == (cpu, EMUL)
    assert [variant_of(k) for k in m.keys] == ["large", "large", "medium", "medium", "small", "small"]
    assert [split_key(k, "")[1] for k in m.keys[:2]] == [cpu, EMUL]  # the CPU is 3x faster than the emulated type
    assert m.policy.context.variants == m.keys
    assert m.metadata()["parameters"]["device_types"] == [cpu, EMUL]
    assert allowed_variants(m, req()) == tuple(m.keys)


def test_a_pinned_variant_runs_on_any_type_and_a_pinned_type_on_that_type_only(plane):
    m = plane.models["heavy"]
    cpu = device_type("cpu")
    assert allowed_variants(m, req(variant="medium")) == (f"medium@{cpu}", f"medium@{EMUL}")
    assert allowed_variants(m, req(device_type="CPU")) == tuple(k for k in m.keys if k.endswith(cpu))
    assert allowed_variants(m, req(variant="large", device_type=EMUL)) == (f"large@{EMUL}",)
    assert allowed_variants(m, req(min_accuracy=0.9, device_type=EMUL)) == (f"large@{EMUL}", f"medium@{EMUL}")


def test_an_unknown_device_type_is_refused_with_the_models_types(plane):
    m = plane.models["heavy"]
    with pytest.raises(InvalidArgument) as e:
        allowed_variants(m, req(device_type="tpu"))
    assert "tpu" in str(e.value) and EMUL in str(e.value) and device_type("cpu") in str(e.value)


def test_a_one_type_model_keeps_plain_variant_keys(plane):
    m = plane.models["digits"]
    assert m.plan is None and m.keys == m.by_accuracy
    assert allowed_variants(m, req("digits")) == m.default_variants
    assert allowed_variants(m, req("digits", device_type="cpu")) == m.default_variants  # its one type may be pinned
    with pytest.raises(InvalidArgument, match="unknown device_type"):
        allowed_variants(m, req("digits", device_type=EMUL))


def test_a_dominated_option_leaves_the_fallback_chain_but_a_pinned_variant_is_served(model_repo, tmp_path):
    """digits' large made less accurate than its medium and slower on every type (:func:`dominate`):
    out of the fallback chain on both, yet a request pinning it runs on its own options, fastest type first."""
    p = make_plane(model_repo, tmp_path / "repo", {"digits": ["cpu", EMUL]})
    m = p.models["digits"]
    cpu = device_type("cpu")
    assert m.plan is not None and {d for d, _ in m.plan.dropped} >= {f"large@{cpu}", f"large@{EMUL}"}
    assert "large" not in {variant_of(k) for k in m.plan.keys}
    assert m.keys[-2:] == [f"large@{cpu}", f"large@{EMUL}"]  # served, ranked after every fallback
    assert "large" not in {variant_of(k) for k in allowed_variants(m, req("digits"))}
    assert "large" not in {variant_of(k) for k in allowed_variants(m, req("digits", min_accuracy=0.0))}
    assert allowed_variants(m, req("digits", variant="large")) == (f"large@{cpu}", f"large@{EMUL}")
    assert allowed_variants(m, req("digits", variant="large", device_type=EMUL)) == (f"large@{EMUL}",)
    assert m.policy.context.variants == m.keys


@pytest.mark.asyncio
async def test_a_pinned_dominated_variant_is_answered_by_its_own_replicas(model_repo, tmp_path):
    p = make_plane(model_repo, tmp_path / "repo", {"digits": ["cpu", EMUL]})
    await p.start()
    try:
        m = p.models["digits"]
        x = np.zeros([1, *m.config.inputs[0].shape], dtype=np.float32)
        params = RequestParams(variant="large", slo_ms=5000)
        out = await p.infer(InferRequest("digits", None, {m.config.inputs[0].name: ("FP32", x)}, params=params))
        assert out.parameters["variant"] == "large" and out.parameters["device_type"] == device_type("cpu")
    finally:
        await p.stop()
