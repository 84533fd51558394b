"""sloserve/loadtests/dashboards.py's pure parts: the command lines it runs, the Prometheus config it writes,
the queries and links it prints (the run itself: `make dashboards`; its helpers also serve
tests/integration/test_prometheus.py against a real Prometheus)."""

from __future__ import annotations

import re
import sys
import urllib.parse
from pathlib import Path

import pytest
import yaml

from sloserve.cli.main import build_parser
from sloserve.loadtests import dashboards as d

ROOT = Path(__file__).resolve().parents[2]


def _shipped() -> dict:
    return yaml.safe_load((d.PROM_DIR / "prometheus.yml").read_text())


def test_prometheus_config_scrapes_the_local_gateway_every_interval(tmp_path):
    shipped = _shipped()
    before = yaml.safe_dump(shipped)
    cfg = d.prometheus_config(shipped, ["127.0.0.1:4567"], tmp_path, interval_s=1)
    assert yaml.safe_dump(shipped) == before, "the shipped config is not modified in place"
    assert cfg["global"]["scrape_interval"] == cfg["global"]["evaluation_interval"] == "1s"
    assert cfg["global"]["external_labels"] == shipped["global"]["external_labels"]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert jobs["sloserve"]["static_configs"][0]["targets"] == ["127.0.0.1:4567"]
    assert jobs["sloserve"]["metrics_path"] == "/metrics"
    assert jobs["ray"]["file_sd_configs"][0]["files"] == [str(tmp_path / "ray_sd.json")]
    for f in cfg["rule_files"]:  # absolute: Prometheus runs in the work directory
        assert Path(f).is_absolute() and Path(f).is_file(), f
    assert {Path(f).name for f in cfg["rule_files"]} == set(shipped["rule_files"])


def test_written_config_round_trips(tmp_path):
    path = d.write_prometheus_config(["127.0.0.1:1"], tmp_path, interval_s=2)
    cfg = yaml.safe_load(path.read_text())
    assert path.parent == tmp_path and cfg["global"]["scrape_interval"] == "2s"


def test_prometheus_listens_on_loopback_only(tmp_path):
    cmd = d.prometheus_command("/usr/bin/prometheus", tmp_path / "p.yml", tmp_path / "data", 9999)
    assert cmd[0] == "/usr/bin/prometheus"
    assert "--web.listen-address=127.0.0.1:9999" in cmd
    assert f"--config.file={tmp_path / 'p.yml'}" in cmd and f"--storage.tsdb.path={tmp_path / 'data'}" in cmd


def _sloserve_args(cmd: list[str]):
    assert cmd[:3] == [sys.executable, "-m", "sloserve.cli"]
    return build_parser().parse_args(cmd[3:])  # what sloserve's own CLI makes of it


def test_gateway_command_is_make_runs_server_on_loopback():
    args = _sloserve_args(d.gateway_command(8100, 8101))
    assert args.cmd == "serve" and args.repo == "model_repository" and args.host == "127.0.0.1"
    assert (args.http_port, args.grpc_port) == (8100, 8101)
    assert args.config is None and args.backend is None  # make run's defaults: Ray Serve replicas
    args = _sloserve_args(d.gateway_command(1, 2, config="deploy/sloserve.example.yaml", backend="inprocess"))
    assert args.config == "deploy/sloserve.example.yaml" and args.backend == "inprocess"


def test_load_command_is_a_bounded_loadtest_of_both_models():
    args = _sloserve_args(d.load_command(8100, 8101, 120, peak_rps=90, slo_ms=25))
    assert args.cmd == "loadtest"
    assert args.host == "http://127.0.0.1:8100" and args.grpc_host == "127.0.0.1:8101"
    assert args.duration == 120 and args.peak_rps == 90 and args.slo_ms == 25
    assert args.shape == "trace" and args.transport == "both" and args.models == "digits:3,heavy:1"
    for bad in (0, -1, d.MAX_DURATION_S + 1):
        with pytest.raises(ValueError, match="--duration"):
            d.load_command(1, 2, bad)


def test_queries_read_the_shipped_recording_rules():
    rules = {
        r["record"]
        for g in yaml.safe_load((d.PROM_DIR / "sloserve_recording_rules.yml").read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    names = [q.name for q in d.QUERIES]
    assert len(names) == len(set(names))
    assert {"attainment", "latency", "queue", "shed", "replicas"} <= set(names)
    for q in d.QUERIES:
        recorded = set(re.findall(r"\b[a-z_]+:[a-z_]+:[a-z0-9_]+\b", q.expr))
        assert recorded <= rules, (q.name, recorded - rules)
        assert q.expr.count("(") == q.expr.count(")"), q.name


def test_graph_links_open_prometheus_graph_tab_with_the_expression():
    q = d.QUERIES[0]
    url = d.graph_url("http://127.0.0.1:9090", q.expr, "10m")
    parts = urllib.parse.urlsplit(url)
    assert parts.path == "/graph"
    params = dict(urllib.parse.parse_qsl(parts.query))
    assert params["g0.expr"] == q.expr and params["g0.tab"] == "0" and params["g0.range_input"] == "10m"
    text = d.where_to_look("http://127.0.0.1:9090", 8100, 8101)
    assert "http://127.0.0.1:9090/graph" in text and all(q.expr in text for q in d.QUERIES)


def test_chromium_command_screenshots_the_url_headless(tmp_path):
    from sloserve.loadtests.screenshots import chromium_command

    cmd = chromium_command("chromium", tmp_path / "a.png", "http://127.0.0.1:1/graph", 1100, 900, tmp_path, False)
    assert cmd[0] == "chromium" and cmd[-1] == "http://127.0.0.1:1/graph"
    assert "--headless" in cmd and f"--screenshot={tmp_path / 'a.png'}" in cmd and "--window-size=1100,900" in cmd
    assert "--no-sandbox" not in cmd
    assert "--no-sandbox" in chromium_command("c", tmp_path / "a.png", "u", 1, 1, tmp_path, True)
