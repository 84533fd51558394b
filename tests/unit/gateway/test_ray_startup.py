"""Which local ``ray.init`` failures the Ray backend retries once (a busy box starts daemons late), and
how many CPUs the embedded Ray offers."""

from sloserve.gateway.backends.ray_local import startup_timed_out


def test_ray_start_up_timeouts_are_retried_and_nothing_else():
    assert startup_timed_out(RuntimeError("The raylet timed out during startup, see its log"))
    assert startup_timed_out(
        RuntimeError(
            "Timed out waiting for file /tmp/ray/session_2026-11-22_08-15-10_017811_30220/gcs_server_port_751fa7af"
        )
    )
    assert not startup_timed_out(RuntimeError("Timed out waiting for file /tmp/ray/other_file"))
    assert not startup_timed_out(ValueError("num_cpus must be positive"))


def _repo(tmp_path, variants: dict[str, int]):
    import json

    for model, n in variants.items():
        (tmp_path / model).mkdir()
        (tmp_path / model / "config.json").write_text(json.dumps({"variants": [{"name": f"v{i}"} for i in range(n)]}))
    return tmp_path


def test_the_embedded_ray_offers_the_cpus_its_start_up_replicas_reserve(tmp_path, monkeypatch):
    from sloserve.gateway.backends.ray_local import local_cpus, replica_cpus
    from sloserve.gateway.config import Settings

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    repo = _repo(tmp_path, {"digits": 3, "heavy": 3, "cnn": 3})
    s = Settings(repo=str(repo))
    assert replica_cpus(s) == 9 * 0.25 and local_cpus(s) == 3  # nine replicas of 0.25 do not fit in 2
    shared = Settings(repo=str(repo), models={"cnn": {"shared_replicas": True}})
    assert replica_cpus(shared) == 7 * 0.25 and local_cpus(shared) == 2  # never fewer than the cores
    more = Settings(repo=str(repo), models={"heavy": {"instances": 2}}, replica_num_cpus=0.5)
    assert replica_cpus(more) == (3 + 6 + 3) * 0.5 and local_cpus(more) == 6
    assert local_cpus(Settings(repo=str(tmp_path / "missing"))) == 2


def test_a_triton_models_instance_groups_reserve_their_replicas(tmp_path, model_repo):
    """Two versions with ``instance_group`` counts 2 + 1: three replicas of each, and one of the
    one-variant sloserve model beside them; the operator's ``instances`` wins."""
    import shutil

    from sloserve.gateway.backends.ray_local import replica_cpus
    from sloserve.gateway.config import Settings

    for v in ("1", "2"):
        (tmp_path / "t" / v).mkdir(parents=True)
        shutil.copy(model_repo / "digits" / "small" / "model.onnx", tmp_path / "t" / v / "model.onnx")
    (tmp_path / "t" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\nversion_policy: { all { } }\n'
        "instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_CPU } ]\n"
    )
    _repo(tmp_path, {"s": 1})
    assert replica_cpus(Settings(repo=str(tmp_path))) == (2 * 3 + 1) * 0.25
    assert replica_cpus(Settings(repo=str(tmp_path), models={"t": {"instances": 1}})) == 3 * 0.25


def test_a_gateway_whose_lease_ran_out_is_not_ready():
    """On a cluster the slots come by lease: a gateway that cannot renew its lease (the lease actor went
    with the Ray head) holds no slot, so it says not ready even while replicas on other nodes live."""
    import time

    from sloserve.gateway.backends.ray import RayServeBackend
    from sloserve.gateway.backends.ray_capacity import LeaseClient
    from sloserve.gateway.backends.ray_watch import ReplicaWatch

    backend = RayServeBackend.__new__(RayServeBackend)
    backend.watch = watch = ReplicaWatch.__new__(ReplicaWatch)
    backend._ready, watch.connected, watch.leases = True, True, None
    assert backend.ready()
    lease = LeaseClient("g", None, set, lambda a: 0.0, lambda a: [], lambda a: {}, lambda a: None)
    watch.leases = lease
    lease._valid_until = time.monotonic() + 1.0
    assert backend.ready()
    lease._valid_until = time.monotonic() - 0.01
    assert not backend.ready()
