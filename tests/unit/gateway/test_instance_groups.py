"""A Triton model's ``instance_group``: the counts are its replicas per version, and ``KIND_CPU`` keeps
it on the CPU whatever the server's ``device``; the operator's per-model ``instances`` wins on Ray."""

from pathlib import Path

from sloserve.gateway.backends.threads import instances_of, opts_of
from sloserve.models.schema import InstanceGroup, LoadedModel, ModelConfig, TritonSettings
from sloserve.replica.runtime import RuntimeOptions

CFG = ModelConfig.model_validate(
    {
        "name": "m",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
        "variants": [{"name": "1", "accuracy": 0.0, "cost_flops": 0.0}],
    }
)


def model(*groups: InstanceGroup, triton: bool = True) -> LoadedModel:
    return LoadedModel(config=CFG, root=Path("."), triton=TritonSettings(instance_groups=groups) if triton else None)


def test_counts_add_up_to_the_replicas_per_version():
    cpu2, gpu1 = InstanceGroup(kind="KIND_CPU", count=2), InstanceGroup(kind="KIND_GPU", count=1, gpus=(0,))
    assert instances_of(model(cpu2, gpu1), 1) == 3
    assert instances_of(model(), 4) == 4  # no group: the server's instances
    assert instances_of(model(triton=False), 2) == 2 and instances_of(None, 2) == 2


def test_kind_cpu_keeps_the_model_on_the_cpu():
    auto = RuntimeOptions(device="auto")
    assert opts_of(model(InstanceGroup(kind="KIND_CPU")), auto).device == "cpu"
    mixed = model(InstanceGroup(kind="KIND_CPU"), InstanceGroup(kind="KIND_GPU"))
    assert opts_of(mixed, auto) is auto  # a GPU group: the server's device decides
    assert opts_of(model(InstanceGroup(kind="KIND_AUTO")), auto) is auto
    assert opts_of(model(), auto) is auto
