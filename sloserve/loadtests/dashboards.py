"""``make dashboards``: a gateway, a bounded Locust load and a real Prometheus on this machine, for a look.

Starts, all on 127.0.0.1 and on free ports:

1. the gateway ``make run`` starts (``sloserve serve --repo model_repository``, replicas on an embedded
   Ray; ``--config`` for a settings file such as deploy/sloserve.example.yaml, ``--backend inprocess``
   for a quicker start);
2. Prometheus (Debian's package, installed with apt-get when missing) with
   deploy/prometheus/prometheus.yml rewritten to scrape that gateway every second and evaluate the
   shipped recording and alert rules every second;
3. ``sloserve loadtest``: Locust, headless, replaying a slice of the Azure Functions trace against
   both models over REST and gRPC for ``--duration`` seconds (600 at most);

then prints the Prometheus UI and a graph link for each of the main SLO queries (:data:`QUERIES`),
and keeps gateway and Prometheus up after the load until Ctrl-C (``--exit-after-load`` stops them
with the load), which stops everything it started. ``sloserve/loadtests/screenshots.py`` photographs the
graphs while it runs. The helpers here (finding or installing Prometheus, rewriting its config,
querying it) are also those of tests/integration/test_prometheus.py.

    python -m sloserve.loadtests.dashboards --duration 300            # what `make dashboards` runs
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sloserve.loadtests.debian import PackageUnavailable, ensure_package

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "deploy" / "prometheus"
MAX_DURATION_S = 600  # sloserve loadtest's own bound


@dataclass(frozen=True)
class Query:
    """One graph an operator watches: a PromQL expression over the shipped recording rules."""

    name: str  # file name of its screenshot (docs/img/dashboards-<name>.png)
    title: str
    expr: str
    look_for: str


# The main SLO queries: the overview and model dashboards' headline panels (deploy/grafana/), written
# over the recording rules of deploy/prometheus/sloserve_recording_rules.yml.
QUERIES: tuple[Query, ...] = (
    Query(
        "attainment",
        "SLO attainment by model (5m)",
        "model:sloserve_slo_attainment:ratio_rate5m",
        "the share of requests answered within their own slo_ms; the objective is 0.99",
    ),
    Query(
        "latency",
        "Latency p50 and p99 by model against the 20 ms SLO",
        "label_replace(histogram_quantile(0.5, sum by (model, le) (rate(sloserve_request_duration_seconds_bucket[1m]))),"
        ' "q", "p50", "", "")'
        " or label_replace(histogram_quantile(0.99, sum by (model, le) (rate(sloserve_request_duration_seconds_bucket[1m]))),"
        ' "q", "p99", "", "")'
        ' or label_replace(vector(0.020), "q", "SLO", "", "")',
        "p99 under the SLO line with room to spare; p99 close to the line means batches are sized to it",
    ),
    Query(
        "requests",
        "Requests/s by model and outcome",
        "sum by (model, outcome) (model_variant_outcome:sloserve_requests:rate1m)",
        "ok carries the load; shed, rejected, unavailable and timeout are the server's refusals",
    ),
    Query(
        "queue",
        "Rows queued by model",
        "model:sloserve_queue_rows:max",
        "near zero; a queue that grows and stays is load beyond what the replicas serve",
    ),
    Query(
        "shed",
        "Shed/s by model and reason",
        "sum by (model, reason) (rate(sloserve_shed_total[1m]))",
        "requests refused because they could not make their deadline (deadline, admission) or at the "
        "door of an overloaded gateway (overload)",
    ),
    Query(
        "replicas",
        "Running replicas by model and variant",
        'sum by (model, variant) (sloserve_replicas{state="running"})',
        "running replicas per variant; with autoscaling they follow the load (starting and stopping: "
        "the same gauge's other states)",
    ),
    Query(
        "batch",
        "Mean batch size by model and variant",
        "model_variant:sloserve_batch_rows:mean_1m",
        "batches grow with the load as long as the deadlines allow",
    ),
)


class PrometheusUnavailable(PackageUnavailable):
    """Prometheus is not installed and could not be installed here; the message says what to do."""


# ---------------------------------------------------------------- small helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def wait_for(url: str, proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    """Until ``url`` answers 200; an AssertionError with the process' output if it exits first."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise AssertionError(f"{what} exited with {proc.returncode} before it was ready:\n{out[-3000:]}")
        if http_get(url, 1.0)[0] == 200:
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not ready at {url} after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def ensure_prometheus() -> tuple[str, str]:
    """The paths of prometheus and promtool, installing Debian's package if needed (root or sudo)."""
    try:
        ensure_package("prometheus", lambda: bool(shutil.which("prometheus") and shutil.which("promtool")))
    except PackageUnavailable as e:
        raise PrometheusUnavailable(f"{e} Put prometheus and promtool (2.x) on PATH.") from None
    return str(shutil.which("prometheus")), str(shutil.which("promtool"))


# ---------------------------------------------------------------- what runs (pure)
def prometheus_config(
    shipped: dict[str, Any], gateways: list[str], workdir: Path, interval_s: float = 1.0
) -> dict[str, Any]:
    """The shipped deploy/prometheus/prometheus.yml, rewritten for a local look: scrape and evaluate
    every ``interval_s``, rule files by absolute path, the ``sloserve`` job on ``gateways``
    (host:port), and the ``ray`` job's discovery file in ``workdir`` (none there: quiet)."""
    cfg = json.loads(json.dumps(shipped))  # a deep copy; the shipped dict stays as read
    every = f"{interval_s:g}s"
    cfg["global"].update(scrape_interval=every, evaluation_interval=every)
    cfg["rule_files"] = [str(PROM_DIR / f) for f in cfg["rule_files"]]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    jobs["sloserve"]["static_configs"][0]["targets"] = list(gateways)
    jobs["ray"]["file_sd_configs"][0]["files"] = [str(workdir / "ray_sd.json")]
    return cfg


def write_prometheus_config(gateways: list[str], workdir: Path, interval_s: float = 1.0) -> Path:
    shipped = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(prometheus_config(shipped, gateways, workdir, interval_s)))
    return path


def prometheus_command(prom_bin: str, config: Path, data_dir: Path, port: int) -> list[str]:
    """Prometheus on loopback only (its UI and API at http://127.0.0.1:<port>)."""
    return [
        prom_bin,
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        "--enable-feature=exemplar-storage",  # the latency histograms' exemplars link to their traces
    ]


def gateway_command(
    http_port: int, grpc_port: int, repo: str = "model_repository", config: str = "", backend: str = ""
) -> list[str]:
    """``make run``'s server (``sloserve serve --repo REPO``) on the given loopback ports."""
    cmd = [sys.executable, "-m", "sloserve.cli", "serve", "--repo", repo, "--host", "127.0.0.1"]
    cmd += ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--log-level", "warning"]
    if config:
        cmd += ["--config", config]
    if backend:
        cmd += ["--backend", backend]
    return cmd


def load_command(
    http_port: int, grpc_port: int, duration_s: float, peak_rps: float = 150.0, slo_ms: float = 20.0
) -> list[str]:
    """A bounded, trace-shaped Locust run on both models over REST and gRPC (``sloserve loadtest``)."""
    if not 0 < duration_s <= MAX_DURATION_S:
        raise ValueError(f"--duration must be in (0, {MAX_DURATION_S}] seconds, not {duration_s:g}")
    return [
        sys.executable,
        "-m",
        "sloserve.cli",
        "loadtest",
        "--host",
        f"http://127.0.0.1:{http_port}",
        "--grpc-host",
        f"127.0.0.1:{grpc_port}",
        "--transport",
        "both",
        "--shape",
        "trace",
        "--trace-start-minute",
        "712",
        "--seconds-per-minute",
        "10",
        "--peak-rps",
        f"{peak_rps:g}",
        "--rps-per-user",
        "15",
        "--models",
        "digits:3,heavy:1",
        "--slo-ms",
        f"{slo_ms:g}",
        "--min-attainment",
        "0",
        "--max-error-rate",
        "1",
        "--duration",
        f"{duration_s:g}",
        "-q",
    ]


def graph_url(base: str, expr: str, range_input: str = "5m") -> str:
    """Prometheus' own graph page for ``expr`` (its web UI, graph tab)."""
    params = {
        "g0.expr": expr,
        "g0.tab": "0",
        "g0.stacked": "0",
        "g0.show_exemplars": "0",
        "g0.range_input": range_input,
    }
    return f"{base}/graph?" + urllib.parse.urlencode(params)


def where_to_look(prom_base: str, http_port: int, grpc_port: int, range_input: str = "5m") -> str:
    lines = [
        f"sloserve gateway:  http://127.0.0.1:{http_port} (REST, /metrics)  127.0.0.1:{grpc_port} (gRPC)",
        f"Prometheus UI:     {prom_base}/graph   (alerts: {prom_base}/alerts, rules: {prom_base}/rules)",
        "The main SLO queries (docs/operations.md, 'Watching it under load'):",
    ]
    for q in QUERIES:
        lines += [f"  {q.title}:", f"    {q.expr}", f"    {graph_url(prom_base, q.expr, range_input)}"]
    return "\n".join(lines)


# ---------------------------------------------------------------- Prometheus' API
def query(base: str, expr: str) -> list:
    """``/api/v1/query``; an AssertionError naming the expression if Prometheus refuses it."""
    status, body = http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    data = json.loads(body or b"{}")
    if status != 200 or data.get("status") != "success":
        raise AssertionError(f"query failed ({status}): {data.get('errorType')}: {data.get('error')}\n  {expr}")
    return data["data"]["result"]


def alerts_firing(base: str) -> set[str]:
    _, body = http_get(f"{base}/api/v1/alerts")
    try:
        alerts = json.loads(body)["data"]["alerts"]
    except (ValueError, KeyError):
        return set()
    return {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}


# ---------------------------------------------------------------- the run
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sloserve.loadtests.dashboards", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300.0, help=f"seconds of load (<= {MAX_DURATION_S})")
    p.add_argument("--peak-rps", type=float, default=150.0, help="requests/s of the trace's busiest minute")
    p.add_argument("--slo-ms", type=float, default=20.0, help="parameters.slo_ms of every request")
    p.add_argument("--repo", default="model_repository", help="model repository (make models builds it)")
    p.add_argument("--config", default="", help="gateway settings file, e.g. deploy/sloserve.example.yaml")
    p.add_argument("--backend", choices=["ray", "inprocess"], default="", help="default: the gateway's (ray)")
    p.add_argument("--prometheus-port", type=int, default=0, help="default: a free port")
    p.add_argument("--exit-after-load", action="store_true", help="stop everything when the load ends")
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        load_command(1, 2, a.duration)  # a bad --duration stops here, before anything starts
    except ValueError as e:
        print(f"dashboards: {e}", file=sys.stderr)
        return 2
    try:
        prom_bin, _ = ensure_prometheus()
    except PrometheusUnavailable as e:
        print(f"dashboards: {e}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sloserve-dashboards-"))
    http_port, grpc_port = free_port(), free_port()
    prom_port = a.prometheus_port or free_port()
    prom_base = f"http://127.0.0.1:{prom_port}"
    procs: list[tuple[str, subprocess.Popen]] = []
    interrupted = False

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        print(f"dashboards: starting the gateway on 127.0.0.1:{http_port} (log {work / 'gateway.log'})", flush=True)
        gw_log = (work / "gateway.log").open("w")
        gw = subprocess.Popen(
            gateway_command(http_port, grpc_port, a.repo, a.config, a.backend),
            cwd=ROOT,
            stdout=gw_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(("gateway", gw))
        config = write_prometheus_config([f"127.0.0.1:{http_port}"], work)
        prom = subprocess.Popen(
            prometheus_command(prom_bin, config, work / "data", prom_port),
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        procs.append(("prometheus", prom))
        wait_for(f"{prom_base}/-/ready", prom, 30, "prometheus")
        try:
            wait_for(f"http://127.0.0.1:{http_port}/v2/health/ready", gw, 300, "the gateway")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{(work / 'gateway.log').read_text(errors='replace')[-3000:]}") from None
        print(f"dashboards: starting {a.duration:g} s of Locust load (log {work / 'load.log'})", flush=True)
        load_log = (work / "load.log").open("w")
        load = subprocess.Popen(
            load_command(http_port, grpc_port, a.duration, a.peak_rps, a.slo_ms),
            cwd=ROOT,
            stdout=load_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(("load", load))
        print("\n" + where_to_look(prom_base, http_port, grpc_port) + "\n", flush=True)
        print("dashboards: Ctrl-C stops the gateway, the load and Prometheus.", flush=True)
        load.wait()
        print(f"dashboards: the load has ended (exit {load.returncode}; its SLO summary in {work / 'load.log'})")
        if not a.exit_after_load:
            print("dashboards: gateway and Prometheus stay up for a look; Ctrl-C stops them.", flush=True)
            while all(p.poll() is None for _, p in procs if p is not load):
                time.sleep(1)
    except KeyboardInterrupt:
        interrupted = True
    except AssertionError as e:
        print(f"dashboards: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for name, p in reversed(procs):  # the load first, then Prometheus, then the gateway (it stops Ray)
            stop(p, timeout_s=45 if name == "gateway" else 10)
        print(f"dashboards: stopped everything{' (Ctrl-C)' if interrupted else ''}; logs and data in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
