"""The pure parts of the training runtime: job specs, entries, verified checkpoint directories, the
preemption protocol, the demo's config and model (no Ray)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sloserve.training.checkpoint import (
    CorruptCheckpoint,
    checkpoint_dir_name,
    latest_good,
    list_checkpoints,
    next_run,
    verify,
    write_manifest,
)
from sloserve.training.job import EntryError, TrainingSpec, preempt_then_kill, resolve_entry


def _ckpt(root, run, iteration, payload=b"w"):
    d = root / f"run-{run}" / checkpoint_dir_name(iteration)
    d.mkdir(parents=True)
    (d / "state.pt").write_bytes(payload)
    write_manifest(d, iteration, {"loss": 1.0 / iteration})
    return d


def test_checkpoints_are_newest_first_across_runs_and_verified(tmp_path):
    _ckpt(tmp_path, 1, 50)
    _ckpt(tmp_path, 1, 100)
    _ckpt(tmp_path, 2, 150)
    (tmp_path / "run-2" / "not-a-checkpoint").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == [checkpoint_dir_name(i) for i in (150, 100, 50)]
    good = latest_good(tmp_path)
    assert good is not None and good.iteration == 150 and good.metrics["loss"] == pytest.approx(1 / 150)
    assert next_run(tmp_path) == 3 and next_run(tmp_path / "none") == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "drop-file", "manifest"])
def test_a_corrupt_newest_checkpoint_is_named_and_the_previous_good_one_used(tmp_path, damage):
    _ckpt(tmp_path, 1, 50)
    bad = _ckpt(tmp_path, 2, 100, payload=b"weights" * 100)
    if damage == "flip":
        (bad / "state.pt").write_bytes(b"Weights" * 100)
    elif damage == "truncate":
        (bad / "state.pt").write_bytes(b"weights" * 50)
    elif damage == "drop-file":
        (bad / "state.pt").unlink()
    else:
        (bad / "sloserve.json").write_text("{not json")
    with pytest.raises(CorruptCheckpoint):
        verify(bad)
    named = []
    good = latest_good(tmp_path, lambda p, e: named.append((p.parent.name, p.name, str(e))))
    assert good is not None and good.iteration == 50
    assert [(r, n) for r, n, _ in named] == [("run-2", checkpoint_dir_name(100))]
    assert bad.exists()  # left for a person to look at


def test_preempt_then_kill_kills_only_after_grace():
    calls: list = []
    assert preempt_then_kill(lambda: calls.append("req"), lambda t: True, lambda: calls.append("kill"), 1.0) == (
        "checkpointed"
    )
    assert (
        preempt_then_kill(
            lambda: calls.append("req"), lambda t: calls.append(t) or False, lambda: calls.append("kill"), 0.5
        )
        == "killed"
    )
    assert calls == ["req", "req", 0.5, "kill"]


@pytest.mark.parametrize(
    "entry, why",
    [
        ("no_such_package.train:main", "cannot import no_such_package.train"),
        ("sloserve.training.demo:no_such_function", "has no function no_such_function"),
        ("sloserve.training.demo:DEFAULTS", "has no function DEFAULTS"),
        ("not an entry", "is not package.module:function"),
    ],
)
def test_an_entry_that_cannot_be_imported_is_a_clear_error(entry, why):
    with pytest.raises(EntryError, match=why):
        resolve_entry(entry)


def test_the_demo_entry_resolves():
    from sloserve.training import demo

    assert resolve_entry("sloserve.training.demo:train") is demo.train


@pytest.mark.parametrize(
    "field, value",
    [
        ("workers", 1000),
        ("total_iterations", 10**12),
        ("memory_mib", 1 << 30),
        ("gpu_type", "T4; rm -rf /"),
        ("entry", "os:system; rm"),
        ("job_id", "../etc"),
        ("tenant", "a b"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_field(field, value):
    with pytest.raises(ValidationError, match=field):
        TrainingSpec(**{"job_id": "big", field: value})


def test_min_workers_above_workers_is_refused():
    with pytest.raises(ValidationError, match="min_workers"):
        TrainingSpec(job_id="j", workers=2, min_workers=3)


def test_demo_config_is_checked_and_the_cnn_classifies_8x8_digits():
    import torch

    from sloserve.training import demo

    with pytest.raises(ValueError, match="unknown config keys"):
        demo.check_config({"iteration": 10})
    with pytest.raises(ValueError, match="lr"):
        demo.check_config({"lr": -1})
    assert demo.check_config({"iterations": 5})["checkpoint_every"] == 50
    x, y = demo.load_digits_tensors(torch.device("cpu"))
    assert x.shape == (1797, 1, 8, 8) and int(y.max()) == 9
    assert demo.build_model(4)(x[:3]).shape == (3, 10)


def test_session_outside_a_run_never_asks_to_stop():
    from sloserve.training import session

    assert session.should_stop(iteration=3, loss=0.5) is False
    assert (session.rank(), session.world_size()) == (0, 1)
