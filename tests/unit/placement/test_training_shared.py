"""Several gateway processes over one training jobs directory (``sloserve serve --workers N``): every
manager sees the same jobs, a job id is taken once however many submit it at the same time, a run
started by one manager is seen and stopped through another, and one leader (a file lock) places the
jobs, another taking over when it goes. No Ray: the launcher is a stand-in."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from sloserve.training.harvest_jobs import HarvestJobs
from sloserve.training.job import DEMO_ENTRY, TrainingSpec
from sloserve.training.leader import LeaderLock, Leadership
from sloserve.training.manager import ABANDONED_S, TrainingManager


def spec(job_id: str = "j1") -> TrainingSpec:
    return TrainingSpec(job_id=job_id, entry=DEMO_ENTRY, workers=1, gpu_type="T4")


class _Run:
    """A stand-in run, shared by the launchers of all managers (as Ray's actors are)."""

    def __init__(self, actor_id: str):
        self.actor_id, self.running, self.stops = actor_id, True, 0

    def alive(self) -> bool:
        return self.running

    def preempt(self, grace_s: float) -> str:
        self.running, self.stops = False, self.stops + 1
        return "checkpointed"


class _Launcher:
    """Starts stand-in runs, and attaches to the one a job runs by its name, as ``RayLauncher`` does."""

    name = "fake"

    def __init__(self, runs: dict[str, _Run], barrier: threading.Barrier | None = None):
        self.runs, self.barrier = runs, barrier

    def check(self, spec: TrainingSpec) -> None:
        if self.barrier is not None:  # every submitter past the "exists?" check before any creates the job
            self.barrier.wait(10)

    def start(self, spec: TrainingSpec, job_dir) -> _Run:
        run = self.runs[spec.job_id] = _Run(f"actor-{len(self.runs)}-{spec.job_id}")
        return run

    def attach(self, record: dict) -> _Run | None:
        return self.runs.get(record["job_id"])


def managers(tmp_path, n: int = 2, barrier=None) -> list[TrainingManager]:
    runs: dict[str, _Run] = {}
    return [TrainingManager(tmp_path, launcher=_Launcher(runs, barrier)) for _ in range(n)]


def test_two_managers_over_one_directory_see_the_same_jobs(tmp_path):
    a, b = managers(tmp_path)
    a.submit(spec("j1"), start=False)
    b.submit(spec("j2"), start=False)
    assert [j.job_id for j in a.list()] == [j.job_id for j in b.list()] == ["j1", "j2"]
    assert b.get("j1").state == "queued"
    with pytest.raises(ValueError, match="exists"):
        b.submit(spec("j1"), start=False)
    b.cancel("j1")
    assert a.get("j1").state == "cancelled"


def test_concurrent_submits_of_one_id_give_one_job_and_one_exists_error(tmp_path):
    barrier = threading.Barrier(2)
    a, b = managers(tmp_path, barrier=barrier)
    results: list[object] = []

    def submit(m: TrainingManager) -> None:
        try:
            results.append(m.submit(spec("same"), start=False).state)
        except ValueError as e:
            results.append(e)

    threads = [threading.Thread(target=submit, args=(m,)) for m in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(map(type, results), key=str) == sorted([str, ValueError], key=str), results
    assert "queued" in results and any("exists" in str(r) for r in results)
    assert [j.job_id for j in a.list()] == ["same"]


def test_a_directory_left_by_a_crashed_submit_is_taken_over_only_once_abandoned(tmp_path):
    a, b = managers(tmp_path)
    (tmp_path / "j1").mkdir()  # another process between creating the directory and writing job.json
    with pytest.raises(ValueError, match="exists"):
        a.submit(spec("j1"), start=False)
    old = os.stat(tmp_path / "j1").st_mtime - ABANDONED_S - 1
    os.utime(tmp_path / "j1", (old, old))
    assert b.submit(spec("j1"), start=False).state == "queued"


def test_a_run_started_by_one_manager_is_seen_and_cancelled_through_another(tmp_path):
    a, b = managers(tmp_path)
    a.submit(spec("j1"))
    run = a.launcher.runs["j1"]  # type: ignore[attr-defined]
    assert b.get("j1").state == "running"  # attached: b never started it
    assert b.handle("j1") is run
    info = b.cancel("j1")
    assert (info.state, run.stops, run.running) == ("cancelled", 1, False)
    assert a.get("j1").state == "cancelled"


def test_a_stale_handle_gives_way_to_the_run_another_manager_started(tmp_path):
    a, b = managers(tmp_path)
    a.submit(spec("j1"))
    first = a.launcher.runs["j1"]  # type: ignore[attr-defined]
    b.preempt("j1")
    b.start("j1")  # a new run, started by b; a still holds the first one's handle
    second = b.launcher.runs["j1"]  # type: ignore[attr-defined]
    assert second is not first and not first.running
    assert a.get("j1").state == "running"
    assert a.handle("j1") is second


def test_a_job_held_by_hand_is_held_for_every_manager(tmp_path):
    a, b = managers(tmp_path)
    a.submit(spec("j1"))
    HarvestJobs(a).preempt("j1")
    assert HarvestJobs(b).is_held("j1") and b.get("j1").state == "preempted"
    HarvestJobs(b).start("j1")
    assert not HarvestJobs(a).is_held("j1") and a.get("j1").state == "running"


def test_one_leader_at_a_time_and_the_next_takes_over_when_it_lets_go(tmp_path):
    first, second = LeaderLock(tmp_path / ".leader"), LeaderLock(tmp_path / ".leader")
    assert first.try_acquire() and first.held
    assert not second.try_acquire() and not second.held
    assert first.try_acquire()  # (held: stays held)
    first.release()
    assert second.try_acquire() and second.held
    assert not first.try_acquire()
    second.release()


def test_a_dead_leaders_lock_is_freed_by_the_kernel(tmp_path):
    path = tmp_path / ".leader"
    code = (
        "import sys; from sloserve.training.leader import LeaderLock\n"
        f"assert LeaderLock({str(path)!r}).try_acquire()\n"
        "print('leading', flush=True); sys.stdin.read()\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    p = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "leading"
        mine = LeaderLock(path)
        assert not mine.try_acquire()  # the other process leads
        p.kill()
        p.wait(10)
        assert mine.try_acquire()  # it died: its lock went with it
        mine.release()
    finally:
        if p.poll() is None:
            p.kill()


def test_followers_read_what_the_leader_published(tmp_path):
    leader, follower = Leadership(tmp_path), Leadership(tmp_path)
    assert leader.try_lead() and not follower.try_lead()
    assert follower.view() == {}
    leader.publish({"round": 3}, {"j1": {"attained_gpu_s": 1.5, "queue_position": 0}})
    seen = follower.view()
    assert seen["report"] == {"round": 3} and seen["jobs"]["j1"]["attained_gpu_s"] == 1.5
    assert seen["leader_pid"] == os.getpid()
    leader.resign()
    assert follower.try_lead() and follower.leads
    follower.resign()
