"""How many gateway workers `sloserve serve` starts by default, and what the supervisor does when one
exits (sloserve/gateway/workers.py)."""

from sloserve.gateway.workers import Supervisor, available_cores, default_workers


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


class _Exited:
    """A worker process that has exited with ``code``."""

    def __init__(self, code: int):
        self.exitcode = code
        self.pid = 4242

    def is_alive(self) -> bool:
        return False


def test_a_worker_that_exits_with_2_ends_the_service_and_others_restart(tmp_path):
    """Exit 2 means a bad setting or model, which every start would meet again: the supervisor stops
    the service with 2 instead of restarting that worker forever. Any other exit is restarted."""
    from sloserve.gateway.config import Settings

    sup = Supervisor(Settings(repo=tmp_path, backend="inprocess", http_port=0, grpc_port=0), 2)
    try:
        sup._started_at = {0: 0.0, 1: 0.0}
        sup.procs = {0: _Exited(1)}  # type: ignore[dict-item]
        assert sup.watch() is None and 0 in sup._due  # restarted after a back-off
        sup.procs = {1: _Exited(2)}  # type: ignore[dict-item]
        assert sup.watch() == 2
    finally:
        sup.close()
