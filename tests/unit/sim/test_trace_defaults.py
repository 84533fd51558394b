"""Every default trace path points inside the repository, at a file that is there (a fresh clone runs
the simulator's and the load tests' defaults without anything beside it)."""

from __future__ import annotations

from pathlib import Path

from sloserve.loadtests import trace_rates
from sloserve.loadtests.bench import arrivals as bench_arrivals
from sloserve.sim import bound, fallback_sweep, predict_eval, validate
from sloserve.sim.arrivals import (
    ALIBABA_GENAI_2026,
    AZURE_FUNCTIONS_2019,
    AZURE_LLM_2023,
    TRACES_DIR,
    from_counts,
    from_timestamps,
)

ROOT = Path(__file__).resolve().parents[3]


def test_the_traces_folder_is_in_the_repository_and_documented():
    assert TRACES_DIR.is_relative_to(ROOT) and (TRACES_DIR / "README.md").is_file()
    readme = (TRACES_DIR / "README.md").read_text()
    for path in sorted(TRACES_DIR.glob("*.csv")):
        assert path.name in readme, f"{path.name}: say where it comes from and its licence in the README"


def test_every_default_is_a_shipped_trace():
    defaults = [bound.TRACE, fallback_sweep.TRACE, predict_eval.TRACE, validate.TRACE]
    defaults += [trace_rates.DEFAULT_TRACE, bench_arrivals.TRACE_CSV]
    assert {Path(d) for d in defaults} == {AZURE_FUNCTIONS_2019}
    assert AZURE_FUNCTIONS_2019.is_file()


def test_the_shipped_traces_load():
    assert from_counts(AZURE_FUNCTIONS_2019, "aggregate_1350fn", 60).rates.size == 1440
    llm = from_timestamps(AZURE_LLM_2023, "t_s")
    assert llm.timestamps is not None and llm.timestamps.size == 19366
    assert from_counts(ALIBABA_GENAI_2026, "generative_qps", 57).rates.size == 1145
