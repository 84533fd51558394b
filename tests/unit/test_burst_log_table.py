"""sloserve/loadtests/bench/burst_log_table.py: each `@any` system against its own family's pinned variants."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "loadtests" / "bench" / "burst_log_table.py"


def _line(system: str, rnd: int, rate: int, effacc: float) -> str:
    return (
        f"  [{system} r{rnd}]   {rate}/s att 0.9900 good 1/s p50 1.0 p99 2.0 shed 0.000 effacc {effacc:.4f} srv 0.5\n"
    )


def _run(tmp_path: Path, lines: list[str]) -> str:
    log = tmp_path / "burst.log"
    log.write_text("".join(lines))
    out = subprocess.run([sys.executable, str(SCRIPT), str(log)], capture_output=True, text=True, check=True)
    return out.stdout


def test_any_is_compared_with_its_own_family(tmp_path):
    lines = []
    for r, (cpu_any, cpu_large, types_any, types_large) in enumerate(
        [(0.97, 0.50, 0.96, 0.98), (0.96, 0.60, 0.95, 0.98), (0.98, 0.55, 0.96, 0.98)], start=1
    ):
        lines += [
            _line("sloserve-slo@any", r, 900, cpu_any),
            _line("sloserve-slo@large", r, 900, cpu_large),
            _line("sloserve-slo@medium", r, 900, 0.931),
            _line("sloserve-slo-types@any", r, 900, types_any),
            _line("sloserve-slo-types@large", r, 900, types_large),
            _line("sloserve-slo-types@medium", r, 900, 0.931),
        ]
    out = _run(tmp_path, lines)
    # variants on the CPU: against slo@medium (0.931), not against large on both types (0.98)
    assert "sloserve-slo@any: median - best single (large/medium) median = +3.90 points" in out
    # pairs: against large on both types, and against the best one-type (variant, type) pair
    assert "sloserve-slo-types@any: median - best single (large/medium) median = -2.00 points" in out
    assert "sloserve-slo-types@any: median - best single pair (sloserve-slo@medium) median = +2.90 points" in out


def test_any_without_pinned_family_says_so(tmp_path):
    out = _run(tmp_path, [_line("sloserve-slo@any", 1, 900, 0.97), _line("sloserve-other@large", 1, 900, 0.9)])
    assert "no sloserve-slo@large or @medium rounds at this rate" in out
