"""Every alert and recording rule in deploy/prometheus has a `promtool test rules` unit test next to
it (deploy/prometheus/tests/*_test.yml), and those tests pass: each alert fires on the series that
should fire it and stays silent on a healthy one; each recording rule gives the value worked out by
hand. Prometheus's promtool is Debian's (installed when missing, as the metrics tests do)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from sloserve.loadtests.dashboards import PROM_DIR, ensure_prometheus

TEST_FILES = sorted((PROM_DIR / "tests").glob("*_test.yml"))


def _rules(kind: str) -> set[str]:
    names = set()
    for path in sorted(PROM_DIR.glob("*rules.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {r[kind] for r in group["rules"] if kind in r}
    return names


def _tests() -> list[dict]:
    return [t for path in TEST_FILES for t in yaml.safe_load(path.read_text())["tests"]]


def test_promtool_passes_every_rule_test():
    _, promtool = ensure_prometheus()
    assert TEST_FILES
    run = subprocess.run(
        [promtool, "test", "rules", *map(str, TEST_FILES)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_alert_is_tested_firing_and_silent():
    fired, silent = set(), set()
    for t in _tests():
        for case in t.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else silent).add(case["alertname"])
    alerts = _rules("alert")
    assert alerts
    assert not alerts - fired, f"alerts no test fires: {sorted(alerts - fired)}"
    assert not alerts - silent, f"alerts no test checks silent: {sorted(alerts - silent)}"


def test_every_recording_rule_is_tested():
    exprs = " ".join(case["expr"] for t in _tests() for case in t.get("promql_expr_test", []))
    untested = {r for r in _rules("record") if r not in exprs}
    assert not untested, f"recording rules no promql_expr_test reads: {sorted(untested)}"


def test_rule_tests_name_the_shipped_rule_files():
    for path in TEST_FILES:
        for f in yaml.safe_load(path.read_text())["rule_files"]:
            assert (path.parent / f).resolve().parent == Path(PROM_DIR).resolve(), (path, f)
