"""Gavel's throughput table for serving options (variant, device type): read from the option's
variant's profile on each GPU type, keyed by the option; placement ranks types by it per cost."""

from sloserve.autoscaler.placement.cost import rank_types, throughputs_from_profile
from sloserve.autoscaler.placement.types import Gpu, PlacementConfig, PlacementSnapshot
from sloserve.batching.profile import ProfileTable

TABLE = ProfileTable.from_points(
    {
        ("m", "large", "t4"): ([1, 8, 32], [4.0, 6.0, 12.0], [5.0, 7.0, 14.0]),
        ("m", "large", "a100"): ([1, 8, 32], [1.0, 1.5, 3.0], [1.2, 1.8, 3.6]),
    }
)


def test_an_option_key_reads_its_variants_profile_per_type():
    out = throughputs_from_profile(
        TABLE,
        [("m", "large@t4"), ("m", "large")],
        ["T4", "A100"],
        {"m": 0.02},
        device_type_of={"T4": "t4", "A100": "a100"},
    )
    assert out[("m", "large@t4", "T4")] == out[("m", "large", "T4")]
    assert out[("m", "large@t4", "A100")] > out[("m", "large@t4", "T4")]


def test_placement_prefers_the_type_with_most_requests_per_cost():
    tput = throughputs_from_profile(
        TABLE, [("m", "large@t4")], ["T4", "A100"], {"m": 0.02}, device_type_of={"T4": "t4", "A100": "a100"}
    )
    snap = PlacementSnapshot(gpus=(Gpu("T4:0", "T4", 16000), Gpu("A100:0", "A100", 40000)), replica_throughput_rps=tput)
    cheap_t4 = PlacementConfig(gpu_cost_per_hour={"T4": 0.1, "A100": 4.0})
    assert rank_types(snap, cheap_t4, "m", "large@t4", ["T4", "A100"])[0] == "T4"
    assert (
        rank_types(snap, PlacementConfig(gpu_cost_per_hour={"T4": 1.0, "A100": 1.0}), "m", "large@t4", ["T4", "A100"])[
            0
        ]
        == "A100"
    )
