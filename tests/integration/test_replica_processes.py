"""``replica_processes``: in-process backend replicas that compute in worker processes
(sloserve/gateway/backends/processes.py). Same answers as ONNX Runtime in the test's own process; a worker killed with
a batch in flight fails that batch explicitly (503 + Retry-After), is started again and serves the next
one; a batch whose deadline passed while it queued behind another is skipped, not run late; stop
leaves no worker behind; a model that cannot be loaded is a ModelLoadError naming the file."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time

import numpy as np
import onnxruntime as ort
import psutil
import pytest

from sloserve.gateway.backends.base import ModelLoadError
from sloserve.gateway.backends.processes import WorkerGone
from sloserve.gateway.backends.threads import InProcessBackend
from sloserve.gateway.errors import DeadlineExceeded
from sloserve.gateway.transports.status import http_status
from sloserve.models.repository import ModelRepository
from sloserve.replica.runtime import RuntimeOptions

pytestmark = pytest.mark.integration


def digits_only(model_repo, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(model_repo / "digits", repo / "digits")
    return ModelRepository(repo).load()


def workers() -> set[int]:
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if "sloserve.gateway.backends.processes" in p.cmdline():
                out.add(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


async def started(model_repo, tmp_path, **kw) -> InProcessBackend:
    """The digits model on worker processes, started."""
    b = InProcessBackend(digits_only(model_repo, tmp_path), RuntimeOptions(), processes=True, **kw)
    await b.start()
    return b


def signalled(b: InProcessBackend, variant: str, sig: int):
    """The one worker of digits/``variant``, sent ``sig``."""
    (w,) = b._workers[("digits", variant)]
    os.kill(w._proc.pid, sig)
    return w


async def until(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def reference(model_repo, variant: str, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(model_repo / "digits" / variant / "model.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(["probs"], {"input": x})[0]


async def test_workers_answer_like_ort_and_stop_cleanly(model_repo, tmp_path):
    before = workers()
    b = await started(model_repo, tmp_path, instances=2)
    try:
        assert len(workers() - before) == 3 * 2  # three variants, two instances each
        assert b.slots("digits", "large") == 2
        rng = np.random.default_rng(0)
        xs = [rng.random((n, 64), dtype=np.float32) for n in (1, 3, 17, 64)]
        results = await asyncio.gather(*(b.run("digits", "large", {"input": x}) for x in xs))
        for x, r in zip(xs, results, strict=True):
            np.testing.assert_allclose(r.outputs["probs"], reference(model_repo, "large", x), rtol=1e-5, atol=1e-6)
            assert r.outputs["label"].shape == (len(x),) and r.compute_s > 0
    finally:
        await b.stop()
    assert workers() == before


async def test_tiny_variants_stay_on_the_loop_and_only_the_rest_get_workers(model_repo, tmp_path):
    """A variant whose batch is under ``inline_below_s`` computes inline, as without workers (a trip
    through a worker's socket costs the loop more than such a batch): it gets no worker process. Measured
    on a 16-core host before this rule: a 3x burst of single-row requests drove `heavy/medium`, all of
    whose batches then went through a worker, to 0 on time for the whole peak."""
    before = workers()
    b = await started(model_repo, tmp_path, inline_below_s=1.0)  # every digits variant is "tiny" at 1 s
    try:
        assert workers() == before and not b._workers
        assert all(b._fast[("digits", v)] for v in ("small", "medium", "large"))
        x = np.random.default_rng(1).random((5, 64), dtype=np.float32)
        r = await b.run("digits", "large", {"input": x})
        np.testing.assert_allclose(r.outputs["probs"], reference(model_repo, "large", x), rtol=1e-5, atol=1e-6)
        assert b.replica_count("digits", "large") == 1
    finally:
        await b.stop()
    b = await started(model_repo, tmp_path / "2", inline_below_s=1e-9)  # nothing is that fast: all on workers
    try:
        assert len(workers() - before) == 3 and not any(b._fast.values())
        assert not b._replicas  # the profile said "not tiny": no session was loaded in the gateway to probe
    finally:
        await b.stop()
    assert workers() == before


async def test_a_killed_worker_fails_its_batch_explicitly_and_comes_back(model_repo, tmp_path):
    b = await started(model_repo, tmp_path, fault_delay_s={"digits": 0.5})
    try:
        (w,) = b._workers[("digits", "small")]
        x = {"input": np.zeros((2, 64), np.float32)}
        in_flight = asyncio.ensure_future(b.run("digits", "small", x))
        await asyncio.sleep(0.2)  # the worker is inside the batch's 0.5 s chaos delay
        os.kill(w._proc.pid, signal.SIGKILL)
        with pytest.raises(WorkerGone) as e:
            await asyncio.wait_for(in_flight, 5)
        assert http_status(e.value) == 503 and e.value.retry_after_s and "exited" in e.value.message
        await until(lambda: w.available, 30, "the worker was not started again")  # without anyone asking
        r = await asyncio.wait_for(b.run("digits", "small", x), 10)
        assert r.outputs["label"].shape == (2,)
    finally:
        await b.stop()


async def test_a_batch_past_its_deadline_in_the_workers_queue_is_skipped(model_repo, tmp_path):
    b = await started(model_repo, tmp_path, pipeline_depth=2, fault_delay_s={"digits": 1.0})
    try:
        x = {"input": np.zeros((1, 64), np.float32)}
        first = asyncio.ensure_future(b.run("digits", "medium", x, timeout_s=5))
        await asyncio.sleep(0.05)
        t0 = time.monotonic()
        with pytest.raises(DeadlineExceeded):  # queued behind 1 s of work with 0.1 s to live
            await b.run("digits", "medium", x, timeout_s=0.1)
        assert time.monotonic() - t0 < 0.8
        assert (await first).outputs["label"].shape == (1,)
        # The skipped batch cost the worker nothing: the next one starts right after the first.
        t1 = time.monotonic()
        await b.run("digits", "medium", x, timeout_s=5)
        assert time.monotonic() - t1 < 1.0 + 0.7, "the worker ran the abandoned batch"
    finally:
        await b.stop()


async def test_a_bad_model_file_is_a_load_error_naming_it(model_repo, tmp_path):
    repo = digits_only(model_repo, tmp_path)
    (tmp_path / "repo" / "digits" / "medium" / "model.onnx").write_bytes(b"not onnx")
    before = workers()
    b = InProcessBackend(repo, RuntimeOptions(), processes=True)
    with pytest.raises(ModelLoadError) as e:
        await b.start()
    assert "digits" in str(e.value) and "medium" in str(e.value) and "model.onnx" in str(e.value)
    await asyncio.sleep(0.2)
    assert workers() == before


def test_workers_default_to_depth_two_and_an_explicit_depth_wins(model_repo):
    from sloserve.gateway.config import load_settings
    from sloserve.gateway.server import make_backend

    repo = ModelRepository(model_repo).load()

    def depth(**kw):
        return make_backend(load_settings(None, repo=str(model_repo), backend="inprocess", **kw), repo).pipeline_depth

    assert depth() == 1 and depth(replica_processes=True) == 2
    assert depth(replica_processes=True, inprocess_pipeline_depth=1) == 1
    assert depth(inprocess_pipeline_depth=3) == 3


async def test_with_two_workers_a_dead_one_is_skipped_while_it_restarts(model_repo, tmp_path):
    b = await started(model_repo, tmp_path, instances=2)
    try:
        first, second = b._workers[("digits", "large")]
        os.kill(first._proc.pid, signal.SIGKILL)
        await until(lambda: not first.available, 10, "the gateway did not see the worker go")
        x = {"input": np.zeros((2, 64), np.float32)}
        for _ in range(10):  # every batch goes to the live worker, none gets the 503
            assert (await b.run("digits", "large", x)).outputs["label"].shape == (2,)
        assert second.available
    finally:
        await b.stop()


async def test_stop_during_a_restart_leaves_nothing_and_does_not_hang(model_repo, tmp_path):
    before = workers()
    b = await started(model_repo, tmp_path)
    w = signalled(b, "small", signal.SIGKILL)
    await until(lambda: w._restarting is not None, 10, "no restart began")
    await asyncio.wait_for(b.stop(), 15)
    await asyncio.sleep(0.3)
    assert w._restarting.done() and not w.available
    assert workers() == before


async def test_a_signal_to_the_process_group_does_not_end_a_worker(model_repo, tmp_path):
    """Ctrl-C or systemd's stop signal the whole group: workers keep serving until the gateway closes
    their sockets, so the gateway can drain what is in flight."""
    b = await started(model_repo, tmp_path)
    try:
        w = signalled(b, "medium", signal.SIGTERM)
        os.kill(w._proc.pid, signal.SIGINT)
        await asyncio.sleep(0.3)
        assert w._proc.poll() is None and w.available
        assert (await b.run("digits", "medium", {"input": np.zeros((1, 64), np.float32)})).outputs["label"].shape == (
            1,
        )
    finally:
        await b.stop()


async def test_a_stalled_worker_never_blocks_the_event_loop(model_repo, tmp_path):
    """A worker that stops reading (SIGSTOP here) with batches far larger than the socket's buffer:
    the sends wait on the loop, the loop keeps running, and the batches end at their timeouts."""
    b = await started(model_repo, tmp_path)
    w = signalled(b, "large", signal.SIGSTOP)
    try:
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.ensure_future(ticker())
        big = {"input": np.zeros((40_000, 64), np.float32)}  # 10 MB a batch
        t0 = time.monotonic()
        results = await asyncio.gather(
            *(b.run("digits", "large", big, timeout_s=0.5) for _ in range(3)), return_exceptions=True
        )
        took = time.monotonic() - t0
        t.cancel()
        assert all(isinstance(r, DeadlineExceeded) for r in results), results
        assert took < 3 and ticks >= 0.5 * took / 0.01 * 0.5, (took, ticks)  # the loop ran all along
        os.kill(w._proc.pid, signal.SIGCONT)
        # Every frame went out whole although its caller gave up: the worker reads them (skips the
        # three, past their deadlines) and answers the next batch.
        r = await asyncio.wait_for(b.run("digits", "large", {"input": np.ones((2, 64), np.float32)}, timeout_s=10), 20)
        assert r.outputs["label"].shape == (2,) and w.available
    finally:
        os.kill(w._proc.pid, signal.SIGCONT)
        await b.stop()


async def test_stop_with_a_frame_half_sent_to_a_stalled_worker(model_repo, tmp_path):
    before = workers()
    b = await started(model_repo, tmp_path)
    w = signalled(b, "small", signal.SIGSTOP)
    pending = asyncio.ensure_future(b.run("digits", "small", {"input": np.zeros((40_000, 64), np.float32)}))
    await asyncio.sleep(0.2)
    channel = w._channel
    assert channel._sending  # the frame is still going out
    await asyncio.wait_for(b.stop(), 15)
    with pytest.raises(WorkerGone):
        await asyncio.wait_for(pending, 5)
    assert not channel._sending
    await asyncio.sleep(0.3)
    assert workers() == before
