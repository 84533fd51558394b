"""The event-loop lag probe (sloserve/gateway/looplag.py): its estimate, the loop's own share of it, its idle stop,
and the door it drives."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from sloserve.batching.errors import DeadlineUnreachable
from sloserve.gateway.backends.threads import InProcessBackend
from sloserve.gateway.config import Settings
from sloserve.gateway.dataplane import DataPlane
from sloserve.gateway.looplag import LoopLag
from sloserve.models.repository import ModelRepository
from sloserve.replica.runtime import RuntimeOptions


def test_estimate_is_a_capped_ewma_of_probe_lateness():
    lag = LoopLag(alpha=0.5, cap_s=0.01)
    lag.observe(0.004)
    assert lag.estimate_s == pytest.approx(0.002)
    lag.observe(0.004)
    assert lag.estimate_s == pytest.approx(0.003)
    lag.observe(1.0)  # one long stall counts as the cap, not a second
    assert lag.estimate_s == pytest.approx(0.0065)
    lag.observe(-0.001)  # a timer early (clock granularity) counts as no lag
    assert lag.estimate_s == pytest.approx(0.00325)


def test_probe_runs_only_while_requests_come():
    t = [0.0]
    ran = []

    class Loop:  # a fake loop: timers are run by hand, time moves by hand
        def call_later(self, delay, cb):
            ran.append(cb)
            return self

        def cancel(self):
            pass

    lag = LoopLag(period_s=0.005, alpha=1.0, idle_s=1.0, clock=lambda: t[0])
    lag.start(Loop())
    assert ran == []  # bound, but no probe before the first request
    assert lag.touch() == 0.0 and len(ran) == 1
    t[0] = 0.008  # the timer fires 3 ms late
    ran.pop()()
    assert lag.estimate_s == pytest.approx(0.003) and len(ran) == 1  # re-armed: a request came < 1 s ago
    t[0] = 2.0  # no request for 2 s: the probe stops and forgets
    ran.pop()()
    assert ran == [] and lag.estimate_s == 0.0
    lag.touch()  # the next arrival starts it again
    assert len(ran) == 1


def test_a_busy_loop_shows_up_in_the_estimate():
    async def main():
        lag = LoopLag(period_s=0.002, alpha=0.5)
        lag.start()
        lag.touch()
        await asyncio.sleep(0.01)
        quiet = lag.estimate_s
        for _ in range(5):  # five iterations that each hold the loop ~8 ms
            lag.touch()
            end = lag.clock() + 0.008
            while lag.clock() < end:
                pass
            await asyncio.sleep(0)
        busy = lag.estimate_s
        lag.stop()
        return quiet, busy

    quiet, busy = asyncio.run(main())
    assert busy > quiet and busy > 0.002


def test_the_latest_probe_is_kept_beside_the_mean():
    """The door reads the mean only while the latest probe is late too: after one stall (a collection, a
    large body's decode) the next on-time probe lets it go, though the mean is still high."""
    lag = LoopLag(alpha=0.2, cap_s=0.05)
    lag.observe(0.5)  # one stall: capped
    assert lag.estimate_s == pytest.approx(0.01) and lag.last_s == pytest.approx(0.05)
    lag.observe(0.0002)
    assert lag.estimate_s > 0.005 and lag.last_s == pytest.approx(0.0002)


def test_own_lag_weighs_each_probe_by_the_loops_cpu_share():
    """A probe late because the loop worked through its own backlog counts in full; one late because
    another process had the core (the loop's thread barely ran) counts for what the loop ran."""
    lag = LoopLag(alpha=1.0)
    lag.observe(0.008, busy=1.0)
    assert lag.own_estimate_s == pytest.approx(0.008) and lag.own_last_s == pytest.approx(0.008)
    lag.observe(0.008, busy=0.05)
    assert lag.estimate_s == pytest.approx(0.008) and lag.own_estimate_s == pytest.approx(0.0004)
    lag.observe(0.008, busy=3.0)  # clock granularity: a share over 1 counts as 1
    assert lag.own_last_s == pytest.approx(0.008)


def test_a_probe_measures_the_loop_threads_cpu_over_its_interval():
    t, cpu = [0.0], [0.0]
    ran = []

    class Loop:
        def call_later(self, delay, cb):
            ran.append(cb)
            return self

        def cancel(self):
            pass

    lag = LoopLag(period_s=0.005, alpha=1.0, clock=lambda: t[0], cpu_clock=lambda: cpu[0])
    lag.start(Loop())
    lag.touch()
    t[0], cpu[0] = 0.013, 0.0005  # 8 ms late, the loop ran 0.5 ms of the 13: another process had the core
    ran.pop()()
    assert lag.estimate_s == pytest.approx(0.008) and lag.own_estimate_s == pytest.approx(0.008 * 0.5 / 13)
    t[0], cpu[0] = 0.026, 0.0125  # 8 ms late again, the loop ran 12 of the 13 ms: its own backlog
    ran.pop()()
    assert lag.own_last_s == pytest.approx(0.008 * 12 / 13)


def test_the_door_refuses_for_the_loops_own_lag_only(model_repo, tmp_path):
    """``loop_lag_shed_ms``: a loop late by twice the setting because another process held the core
    refuses nothing; the same lateness while the loop's thread ran the whole time refuses every request."""
    shutil.copytree(model_repo / "digits", tmp_path / "repo" / "digits")
    repo = ModelRepository(tmp_path / "repo").load()
    settings = Settings(repo=tmp_path / "repo", backend="inprocess", loop_lag_shed_ms=5)
    plane = DataPlane(repo, InProcessBackend(repo, RuntimeOptions(device="cpu")), settings)
    assert plane.loop_lag is not None
    for _ in range(50):
        plane.loop_lag.observe(0.012, busy=0.1)
    assert plane.loop_lag.estimate_s > 0.011
    plane.admission.door("digits")  # not refused
    for _ in range(50):
        plane.loop_lag.observe(0.012, busy=1.0)
    with pytest.raises(DeadlineUnreachable, match="event loop runs 12.0 ms behind"):
        plane.admission.door("digits")
