"""The machine-steadiness probe (sloserve/loadtests/bench/core_speed.py, procstat.core_speed_ms): its slow
spells and report from given samples, and the probe's refusals."""

from __future__ import annotations

import doctest

import pytest

from sloserve.loadtests.bench import core_speed
from sloserve.loadtests.bench.procstat import core_speed_ms


def test_doctests():
    assert doctest.testmod(core_speed).failed == 0


def test_report_counts_slow_samples_and_their_spells():
    times = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    ms = [1.0, 1.1, 2.0, 2.2, 1.0, 1.0, 1.6, 1.0]  # slow (>= 1.5x the fastest): 0.2-0.4, and 0.6-0.7
    rep = core_speed.report(times, ms)
    assert rep["fastest_ms"] == 1.0 and rep["max_ms"] == 2.2
    assert rep["slow_share_1.5x"] == pytest.approx(3 / 8)
    assert rep["slow_spells"] == 2
    assert rep["slow_spell_max_s"] == pytest.approx(0.2)
    assert core_speed.spells([0.0, 1.0], [True, True]) == [1.0]  # still slow at the end
    assert core_speed.spells([0.0, 1.0], [False, False]) == []


def test_the_probe_measures_cpu_and_refuses_nonsense():
    assert core_speed_ms(loops=1, n=1000) > 0
    for bad in ({"loops": 0}, {"n": 0}):
        with pytest.raises(ValueError, match="must be >= 1"):
            core_speed_ms(**bad)


def test_the_cli_refuses_a_bad_duration():
    with pytest.raises(SystemExit, match="--seconds"):
        core_speed.main(["--seconds", "0"])
