"""The training loop and its checkpoints, in-process: no Ray, no sleeps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from autoscaler.training.checkpoint import (
    clean_temp,
    list_checkpoints,
    load_latest,
    write_checkpoint,
)
from autoscaler.training.job import (
    PreemptSignal,
    TrainingRunner,
    TrainingSpec,
    preempt_then_kill,
)

SPEC = dict(dataset="synthetic", hidden=16, batch_size=32)


def _spec(**kw) -> TrainingSpec:
    return TrainingSpec(job_id="t", **{**SPEC, **kw})


@settings(max_examples=8, deadline=None)
@given(kill_at=st.integers(1, 35), every=st.integers(3, 15))
def test_crash_and_resume_loses_at_most_one_interval_and_is_exact(tmp_path_factory, kill_at, every):
    spec = _spec(total_iterations=40, checkpoint_every=every)
    d = tmp_path_factory.mktemp("job")
    crashed = TrainingRunner(spec, d)
    assert crashed.run(max_iterations=kill_at).iteration == kill_at  # then "crash": no final checkpoint
    again = TrainingRunner(spec, d)
    resumed = again.resume()
    assert kill_at - every <= resumed <= kill_at and resumed % every == 0
    again.run(resume=False)
    straight = TrainingRunner(spec, tmp_path_factory.mktemp("ref"))
    straight.run()
    for k in straight.params:
        np.testing.assert_array_equal(again.params[k], straight.params[k])


def test_preempt_request_checkpoints_at_the_boundary_and_loses_nothing(tmp_path):
    sig = PreemptSignal()
    r = TrainingRunner(_spec(total_iterations=100, checkpoint_every=40), tmp_path, signal=sig)
    r.run(max_iterations=13)
    sig.request()
    res = r.run(resume=False)
    assert (res.status, res.iteration, res.checkpoint_iteration) == ("preempted", 13, 13)
    assert TrainingRunner(_spec(total_iterations=100, checkpoint_every=40), tmp_path).resume() == 13


def test_learns_digits(tmp_path):
    res = TrainingRunner(TrainingSpec(job_id="d", total_iterations=150, checkpoint_every=150), tmp_path).run()
    assert res.status == "finished" and res.accuracy > 0.85


def test_corrupt_newest_checkpoint_falls_back_and_temp_files_are_cleaned(tmp_path):
    write_checkpoint(tmp_path, 10, {"w": np.arange(3)})
    newest = write_checkpoint(tmp_path, 20, {"w": np.arange(3) * 2})
    data = bytearray(newest.read_bytes())
    data[-5] ^= 0xFF  # a flipped bit in the payload
    newest.write_bytes(bytes(data))
    (tmp_path / ".ckpt-30.123.tmp").write_bytes(b"SLOCKPT1torn")
    bad = []
    c = load_latest(tmp_path, on_corrupt=lambda p, e: bad.append(p.name))
    assert c.iteration == 10 and c.arrays["w"].tolist() == [0, 1, 2] and bad == [newest.name]
    assert [p.name for p in clean_temp(tmp_path)] == [".ckpt-30.123.tmp"]


def test_failed_write_leaves_previous_checkpoint_and_no_temp(tmp_path):
    write_checkpoint(tmp_path, 10, {"w": np.ones(2)})

    def boom(tmp):
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_checkpoint(tmp_path, 20, {"w": np.zeros(2)}, mid_write_hook=boom)
    assert load_latest(tmp_path).iteration == 10 and not list(tmp_path.glob("*.tmp"))


def test_keeps_newest_two(tmp_path):
    for i in (1, 2, 3):
        write_checkpoint(tmp_path, i, {"w": np.ones(1)})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-0000000003.ckpt", "ckpt-0000000002.ckpt"]


def test_preempt_then_kill_kills_only_after_grace():
    calls = []
    assert (
        preempt_then_kill(lambda: calls.append("req"), lambda t: True, lambda: calls.append("kill"), 1.0)
        == "checkpointed"
    )
    assert (
        preempt_then_kill(
            lambda: calls.append("req"), lambda t: calls.append(t) or False, lambda: calls.append("kill"), 0.5
        )
        == "killed"
    )
    assert calls == ["req", "req", 0.5, "kill"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("batch_size", 10**7),
        ("num_gpus", 1000),
        ("total_iterations", 10**12),
        ("iteration_delay_s", 3600),
        ("memory_mib", 1 << 30),
        ("gpu_type", "T4; rm -rf /"),
        ("lr", 1e9),
    ],
)
def test_a_spec_asking_for_too_much_is_refused_naming_the_field(field, value):
    with pytest.raises(ValidationError, match=field):
        TrainingSpec(job_id="big", **{field: value})
