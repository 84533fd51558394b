"""Which execution providers a session asks ONNX Runtime for: a pure function of the device asked for,
the providers the installed ONNX Runtime offers and whether a GPU is visible."""

from __future__ import annotations

import pytest

from sloserve.replica.runtime import CPU, CUDA, choose_providers

GPU_WHEEL = [CUDA, CPU]  # onnxruntime-gpu (lists CUDA whether or not a GPU is there)
CPU_WHEEL = [CPU]  # onnxruntime


@pytest.mark.parametrize(
    ("device", "available", "gpu_visible", "providers"),
    [
        ("auto", GPU_WHEEL, True, (CUDA, CPU)),  # a GPU host with the GPU wheel: CUDA, CPU for what it lacks
        ("auto", GPU_WHEEL, False, (CPU,)),  # the GPU wheel on a CPU host (or a replica given no GPU)
        ("auto", CPU_WHEEL, False, (CPU,)),
        ("auto", CPU_WHEEL, True, (CPU,)),  # a GPU host with the CPU wheel: the CPU, said loudly
        ("cpu", GPU_WHEEL, True, (CPU,)),
        ("cuda", GPU_WHEEL, True, (CUDA, CPU)),
        ("cuda", GPU_WHEEL, False, (CUDA, CPU)),  # asked for: tried, and an error if it does not start
        (
            "auto",
            ["TensorrtExecutionProvider", CUDA, CPU],
            True,
            (CUDA, CPU),
        ),  # other providers offered are not taken
    ],
)
def test_choice(device, available, gpu_visible, providers):
    choice = choose_providers(device, available, gpu_visible)
    assert choice.providers == providers
    assert choice.device == ("cuda" if providers[0] == CUDA else "cpu")


def test_a_gpu_the_installed_runtime_cannot_use_is_a_warning_naming_the_gpu_extra():
    choice = choose_providers("auto", CPU_WHEEL, gpu_visible=True)
    assert choice.warn and "sloserve[gpu]" in choice.why
    assert not choose_providers("auto", CPU_WHEEL, gpu_visible=False).warn
    assert not choose_providers("auto", GPU_WHEEL, gpu_visible=True).warn


def test_cuda_without_the_cuda_provider_is_an_error_naming_the_gpu_extra():
    with pytest.raises(RuntimeError, match=r"sloserve\[gpu\]"):
        choose_providers("cuda", CPU_WHEEL, gpu_visible=True)


def test_an_unknown_device_is_refused():
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        choose_providers("tpu", GPU_WHEEL, gpu_visible=True)


def test_without_onnx_runtime_the_import_names_both_extras(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if neither wheel were installed
    monkeypatch.delitem(sys.modules, "sloserve.replica.runtime")
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'sloserve\[cpu\]'.*pip install 'sloserve\[gpu\]'"):
        importlib.import_module("sloserve.replica.runtime")


def test_a_cuda_session_picks_cudnn_algorithms_by_heuristic(monkeypatch, tmp_path):
    """A served model meets every batch size; ONNX Runtime's default exhaustive cuDNN benchmark would
    run inside the first batch of each new size."""
    from sloserve.replica import runtime

    seen = {}

    class _Session:
        def __init__(self, path, sess_options=None, providers=None):
            seen["providers"] = providers

        def get_providers(self):
            return [runtime.CUDA, runtime.CPU]

    monkeypatch.setattr(
        runtime, "providers_for", lambda device: runtime.ProviderChoice((runtime.CUDA, runtime.CPU), "test")
    )
    monkeypatch.setattr(runtime.ort, "InferenceSession", _Session)
    runtime.make_session(tmp_path / "m.onnx", runtime.RuntimeOptions(device="cuda"))
    assert seen["providers"] == [(runtime.CUDA, {"cudnn_conv_algo_search": "HEURISTIC"}), runtime.CPU]
