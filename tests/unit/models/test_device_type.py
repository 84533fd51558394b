"""A profile is named after the hardware ONNX Runtime really runs on."""

from __future__ import annotations

import pytest

from sloserve.replica import runtime


@pytest.fixture(autouse=True)
def _fresh_caches():
    runtime.device_type.cache_clear()
    runtime.gpu_present.cache_clear()
    yield
    runtime.device_type.cache_clear()
    runtime.gpu_present.cache_clear()


def test_gpu_host_without_the_cuda_provider_profiles_as_its_cpu(monkeypatch):
    monkeypatch.setattr(runtime, "gpu_present", lambda: True)
    monkeypatch.setattr(runtime.ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert runtime.device_type("auto").startswith("cpu-")


def test_gpu_host_with_the_cuda_provider_profiles_as_its_gpu(monkeypatch):
    class Done:
        returncode, stdout = 0, "NVIDIA H100 80GB HBM3\n"

    monkeypatch.setattr(runtime, "gpu_present", lambda: True)
    monkeypatch.setattr(runtime, "_preload_cuda_libraries", lambda: None)
    monkeypatch.setattr(
        runtime.ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    monkeypatch.setattr(runtime.subprocess, "run", lambda *a, **k: Done())
    assert runtime.device_type("auto") == "nvidia-h100-80gb-hbm3"
    assert runtime.device_type("cpu").startswith("cpu-")


class _FakeSession:
    def __init__(self, path, sess_options=None, providers=None):
        names = [p[0] if isinstance(p, tuple) else p for p in providers]  # (name, options) or name
        self.providers = [p for p in names if p != "CUDAExecutionProvider"]  # CUDA failed to load

    def get_providers(self):
        return self.providers


def test_a_cuda_provider_that_does_not_load_is_an_error_when_cuda_was_asked_for(monkeypatch):
    monkeypatch.setattr(runtime, "_preload_cuda_libraries", lambda: None)
    monkeypatch.setattr(
        runtime.ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    monkeypatch.setattr(runtime.ort, "InferenceSession", _FakeSession)
    monkeypatch.setattr(runtime, "gpu_present", lambda: False)
    with pytest.raises(RuntimeError, match="could not start its CUDA provider"):
        runtime.make_session("m.onnx", runtime.RuntimeOptions(device="cuda"))
    monkeypatch.setattr(runtime, "gpu_present", lambda: True)
    s = runtime.make_session("m.onnx", runtime.RuntimeOptions(device="auto"))  # auto: a warning, the CPU
    assert s.get_providers() == ["CPUExecutionProvider"]
