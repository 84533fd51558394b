"""sloserve/loadtests/dashboards.py's pure parts: the command lines it runs, the Prometheus config it writes,
the queries and links it prints (the run itself: `make dashboards`; its helpers also serve
tests/integration/test_prometheus.py against a real Prometheus); and the Grafana dashboards of
deploy/grafana/: the committed JSON is what build_dashboards.py writes with Grafana's builders, the
panels read only metrics sloserve exports, and the latency panels link exemplars to traces."""

from __future__ import annotations

import json
import re
import subprocess
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


# ---------------------------------------------------------------- Grafana dashboards
GRAFANA = ROOT / "deploy" / "grafana"
DASH_DIR = GRAFANA / "dashboards"
LATENCY_BUCKETS = ("sloserve_request_duration_seconds_bucket", "sloserve_training_reclaim_seconds_bucket")


def _boards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASH_DIR.glob("*.json"))}


def _targets(board: dict):
    for p in board["panels"]:
        for t in p.get("targets", []):
            yield p, t


def test_committed_dashboards_are_what_the_builder_writes(tmp_path):
    """Nobody edits the JSON by hand: build_dashboards.py (Grafana's typed builders) regenerates it
    byte for byte."""
    r = subprocess.run(
        [sys.executable, str(GRAFANA / "build_dashboards.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    built = sorted(p.name for p in tmp_path.glob("*.json"))
    assert built == sorted(_boards()), built
    assert built == [f"sloserve-{n}.json" for n in ("autoscaler", "model", "overview", "training")]
    for name in built:
        assert (tmp_path / name).read_text() == (DASH_DIR / name).read_text(), (
            f"deploy/grafana/dashboards/{name} differs from build_dashboards.py's output: "
            "edit build_dashboards.py, run it, and commit both"
        )


def test_dashboards_are_well_formed():
    """Unique uids and panel ids, panels inside the 24-column grid without overlaps, a unit and
    Prometheus targets on `${datasource}` in every panel, and the variables the queries use."""
    uids = set()
    for name, board in _boards().items():
        assert board["uid"] not in uids and name == f"{board['uid']}.json"
        uids.add(board["uid"])
        assert board["tags"] == ["sloserve"] and board["title"].startswith("sloserve / ")
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        has_model = name != "sloserve-training.json"
        assert ("model" in variables) == has_model, name
        if has_model:
            m = variables["model"]
            assert m["type"] == "query" and m["multi"] and m["includeAll"] and m["allValue"] == ".*"
            assert m["datasource"]["uid"] == "${datasource}"
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)) and 0 not in ids, name
        cells = set()
        for p in board["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, (name, p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{name}: panel {p['title']!r} overlaps another"
                    cells.add((x, y))
            if p["type"] == "row":
                assert not p["collapsed"] and not p["panels"], (name, p["title"])
                continue
            assert p["type"] in ("timeseries", "stat", "heatmap"), (name, p["title"])
            assert p["fieldConfig"]["defaults"].get("unit"), (name, p["title"])
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, p["title"])
            assert p["targets"], (name, p["title"])
            refs = [t["refId"] for t in p["targets"]]
            assert refs == [chr(ord("A") + i) for i in range(len(refs))], (name, p["title"])
            for t in p["targets"]:
                assert t["datasource"] == p["datasource"] and t["expr"] and t["range"], (name, p["title"])
                assert t["expr"].count("(") == t["expr"].count(")"), (name, p["title"])
                assert has_model or "$model" not in t["expr"], (name, p["title"])


def _exported_series() -> set[str]:
    """The series names sloserve's gateway registry exports (a counter's _total, a histogram's
    _bucket/_sum/_count), and the recording rules' names."""
    from sloserve.gateway.metrics import Metrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = {f.name + s for f in Metrics().registry.collect() for s in suffixes.get(f.type, ("",))}
    rules = yaml.safe_load((d.PROM_DIR / "sloserve_recording_rules.yml").read_text())["groups"]
    return names | {r["record"] for g in rules for r in g["rules"] if "record" in r}


def test_panels_read_only_series_that_exist():
    exported = _exported_series()
    assert "sloserve_request_duration_seconds_bucket" in exported and "sloserve_preemptions_total" in exported
    for name, board in _boards().items():
        for p, t in _targets(board):
            # metric names: level:metric:ops recording rules, or sloserve_* series (ray_* are Ray's own)
            used = set(re.findall(r"\b(?:[a-z_]+:[a-z_]+:[a-z0-9_]+|sloserve_[a-z0-9_]+)\b", t["expr"]))
            assert used or "ray_serve_" in t["expr"], (name, p["title"], t["expr"])
            assert used <= exported, (name, p["title"], sorted(used - exported))


def test_training_dashboard_shows_the_harvest_and_its_cost():
    exprs = {
        p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in _boards()["sloserve-training.json"]["panels"]
    }
    wanted = {
        "jobs by state": "sloserve_training_jobs",
        "harvested GPU-seconds": "sloserve_training_gpu_seconds_total",
        "preemptions": "sloserve_preemptions_total",
        "lost work": "sloserve_training_lost_work_seconds_total",
        "reclaim latency": "sloserve_training_reclaim_seconds_bucket",
    }
    for what, metric in wanted.items():
        assert any(metric in e for e in exprs.values()), f"no training panel shows {what} ({metric})"


def test_latency_panels_ask_for_exemplars():
    """Every time series or heatmap query over a latency histogram's buckets asks for exemplars
    (Grafana runs one exemplar query per metric); stats do not draw them, other queries have none."""
    with_exemplars = 0
    for name, board in _boards().items():
        for p, t in _targets(board):
            latency = any(b in t["expr"] for b in LATENCY_BUCKETS)
            wanted = latency and p["type"] in ("timeseries", "heatmap")
            assert bool(t.get("exemplar")) == wanted, (name, p["title"], t["refId"])
            with_exemplars += wanted
    assert with_exemplars >= 4


def test_exemplars_link_to_the_provisioned_tracing_datasource():
    provisioned = [
        ds
        for f in sorted((GRAFANA / "provisioning" / "datasources").glob("*.yml"))
        for ds in yaml.safe_load(f.read_text())["datasources"]
    ]
    by_uid = {ds["uid"]: ds for ds in provisioned}
    assert len(by_uid) == len(provisioned)
    (prom,) = [ds for ds in provisioned if ds["type"] == "prometheus"]
    links = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert [link["name"] for link in links] == ["trace_id"]
    tracing = by_uid[links[0]["datasourceUid"]]
    assert tracing["type"] in ("tempo", "jaeger", "zipkin"), tracing
