"""``sloserve loadtest`` ends a Locust that hangs after writing its verdict, and keeps the verdict."""

from __future__ import annotations

import subprocess
import sys
import time

from sloserve.loadtests import run as lt


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_child_that_hangs_after_its_verdict_is_ended_with_the_verdicts_code(tmp_path, monkeypatch):
    monkeypatch.setattr(lt, "EXIT_GRACE_S", 0.5)
    f = tmp_path / "code"
    proc = subprocess.Popen(_child(f"import time; open({str(f)!r}, 'w').write('3\\n'); time.sleep(60)"))
    t0 = time.monotonic()
    assert lt._wait(proc, f, limit_s=30) == 3
    assert time.monotonic() - t0 < 10
    assert proc.poll() is not None


def test_a_child_that_exits_keeps_its_own_code(tmp_path):
    f = tmp_path / "code"
    proc = subprocess.Popen(_child(f"open({str(f)!r}, 'w').write('0\\n'); raise SystemExit(3)"))
    assert lt._wait(proc, f, limit_s=30) == 3


def test_a_child_that_never_gives_a_verdict_fails_at_the_limit(tmp_path, capsys):
    proc = subprocess.Popen(_child("import time; time.sleep(60)"))
    assert lt._wait(proc, tmp_path / "code", limit_s=0.5) == 4
    assert proc.poll() is not None
    assert "did not stop" in capsys.readouterr().err


def test_a_verdict_written_just_before_the_limit_still_counts(tmp_path, monkeypatch):
    monkeypatch.setattr(lt, "EXIT_GRACE_S", 30.0)  # the grace would outlast the limit
    f = tmp_path / "code"
    proc = subprocess.Popen(_child(f"import time; open({str(f)!r}, 'w').write('0\\n'); time.sleep(60)"))
    assert lt._wait(proc, f, limit_s=1.0) == 0
    assert proc.poll() is not None


def test_an_unreadable_code_is_no_verdict(tmp_path):
    f = tmp_path / "code"
    f.write_text("not a number")
    assert lt._read_code(f) is None
    assert lt._read_code(tmp_path / "missing") is None
    f.write_text("3\n")
    assert lt._read_code(f) == 3
