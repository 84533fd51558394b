"""``dynamic_batching`` in a config.json: Triton's queue policy for sloserve's own layout, checked as a
config.pbtxt's is, and the ``fixed`` policy's defaults."""

import pytest
from pydantic import ValidationError

from sloserve.gateway.queuepolicy import QueueRules
from sloserve.gateway.repository import ConfigOverride
from sloserve.models.schema import ModelConfig

BASE = {
    "name": "m",
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}],
    "max_batch_size": 16,
    "variants": [{"name": "small", "accuracy": 0.9, "cost_flops": 1.0}],
}


def test_a_config_json_carries_tritons_queue_policy():
    cfg = ModelConfig.model_validate(
        {
            **BASE,
            "dynamic_batching": {
                "priority_levels": 2,
                "default_priority_level": 2,
                "default_queue_policy": {"default_timeout_us": 5000, "allow_timeout_override": True},
                "priority_queue_policy": {"1": {"timeout_action": "DELAY", "max_queue_size": 3}},
            },
        }
    )
    rules = QueueRules.of(cfg.dynamic_batching)
    assert [rules.level(p) for p in (0, 1, 2, 3)] == [2, 1, 2, 2]
    assert rules.limit(2, None).timeout_s == 0.005 and rules.limit(2, 1000).timeout_s == 0.001
    assert rules.limit(1, None).delay and rules.limit(1, None).max_queued == 3
    assert QueueRules.of(ModelConfig.model_validate(BASE).dynamic_batching).levels == 0  # none: sloserve's own


def test_the_fixed_policy_takes_the_delay_and_preferred_sizes_unless_it_gives_its_own():
    db = {"max_queue_delay_us": 2500, "preferred_batch_sizes": [4, 8]}
    cfg = ModelConfig.model_validate({**BASE, "batching": {"policy": "fixed"}, "dynamic_batching": db})
    assert cfg.batching == {"policy": "fixed", "max_queue_delay_ms": 2.5, "preferred_batch_sizes": [4, 8]}
    own = {"policy": "fixed", "max_queue_delay_ms": 1.0}
    cfg = ModelConfig.model_validate({**BASE, "batching": own, "dynamic_batching": db})
    assert cfg.batching["max_queue_delay_ms"] == 1.0
    cfg = ModelConfig.model_validate({**BASE, "batching": {"policy": "slo"}, "dynamic_batching": db})
    assert cfg.batching == {"policy": "slo"}  # the slo policy chooses its own sizes and waits


@pytest.mark.parametrize(
    "db, words",
    [
        ({"preferred_batch_sizes": [4, 32]}, "preferred_batch_sizes [32] outside 1..max_batch_size (16)"),
        ({"priority_levels": 2, "default_priority_level": 3}, "default_priority_level 3 is above priority_levels 2"),
        ({"priority_levels": 2, "priority_queue_policy": {"5": {}}}, "priority_queue_policy levels [5] outside"),
        ({"default_queue_policy": {"timeout_action": "DROP"}}, "timeout_action"),
        ({"max_queue_delay": 5}, "max_queue_delay"),
    ],
)
def test_a_bad_dynamic_batching_is_refused_naming_the_key(db, words):
    with pytest.raises(ValidationError, match="dynamic_batching") as e:
        ModelConfig.model_validate({**BASE, "dynamic_batching": db})
    assert words in str(e.value)


def test_a_load_may_override_dynamic_batching():
    o = ConfigOverride.model_validate({"dynamic_batching": {"priority_levels": 3, "default_priority_level": 1}})
    cfg = ModelConfig.model_validate({**BASE, **o.as_config()})
    assert cfg.dynamic_batching is not None and cfg.dynamic_batching.priority_levels == 3
