"""How many gateway workers `sloserve serve` starts by default (gateway/workers.py)."""

from gateway.workers import available_cores, default_workers


def test_default_workers_follow_the_cores():
    assert default_workers(1) == 1
    assert default_workers(2) == 1  # this box: the replicas and the load need the other core
    assert default_workers(4) == 2
    assert default_workers(16) == 8
    assert default_workers(64) == 8


def test_a_containers_cpu_limit_counts_not_the_nodes_cores(tmp_path):
    limit = tmp_path / "cpu.max"
    limit.write_text("200000 100000\n")  # limits.cpu: 2
    assert available_cores(limit) <= 2
    limit.write_text("150000 100000\n")  # 1.5 CPUs: 2 cores' worth of threads
    assert available_cores(limit) <= 2
    limit.write_text("max 100000\n")
    assert available_cores(limit) >= 1
    assert available_cores(tmp_path / "absent") >= 1
