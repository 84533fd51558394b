"""Which local ``ray.init`` failures the Ray backend retries once (a busy box starts daemons late)."""

from gateway.backends.ray_local import startup_timed_out


def test_ray_start_up_timeouts_are_retried_and_nothing_else():
    assert startup_timed_out(RuntimeError("The raylet timed out during startup, see its log"))
    assert startup_timed_out(
        RuntimeError(
            "Timed out waiting for file /tmp/ray/session_2026-11-22_08-15-10_017811_30220/gcs_server_port_751fa7af"
        )
    )
    assert not startup_timed_out(RuntimeError("Timed out waiting for file /tmp/ray/other_file"))
    assert not startup_timed_out(ValueError("num_cpus must be positive"))
