"""The systems a benchmark compares, each started as its own subprocess (its own process group)
on free 127.0.0.1 ports, serving the same ONNX file, answering the same V2 JSON request.

Shared by ``sloserve bench closed`` and the open-loop ``bench slo``: a :class:`Launch` knows how
to start a system, wait until it answers, scrape its batch statistics, and stop it (SIGTERM, then
SIGKILL of every process of its tree after a grace period; never ``ray stop``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from sloserve.loadtests.bench.procstat import tree
from sloserve.loadtests.promtext import prom_sum

ROOT = Path(__file__).resolve().parents[3]
PEERS_DIR = Path(__file__).resolve().parents[1] / "peers"
PEER_VENVS = ROOT / ".peers"
SYSTEMS = ("sloserve", "sloserve-ray", "triton", "mlserver", "rayserve")


def prioritise(nice: int):
    """A preexec_fn that sets the child's nice value AND its autogroup's: with autogroup scheduling
    (kernel.sched_autogroup_enabled=1) each session is a group scheduled fairly against the others,
    so a plain nice value only counts inside the group. Needs root for negative values."""
    if not nice:
        return None

    def _apply() -> None:
        try:
            os.nice(nice)
        except OSError:
            pass
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(str(nice))
        except OSError:
            pass

    return _apply


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass
class BatchingKnobs:
    max_batch_size: int = 32
    max_wait_ms: float = 2.0
    triton_instances: int = 1
    triton_preferred: list[int] | None = None
    triton_metrics: bool = False  # Triton's Prometheus metrics (batch statistics) cost it CPU: off at its best
    mlserver_workers: int = 1
    rayserve_num_cpus: float = 0.5
    rayserve_replicas: int = 1
    rayserve_mode: str = ""  # "opt": RAY_SERVE_THROUGHPUT_OPTIMIZED=1; "ha": that plus HAProxy (Ray Serve's best);
    # "ha0": "ha" with Ray's workers at niceness 0
    sloserve_policy: str = "timeout"
    sloserve_config: str | None = None  # a full config file instead of the generated one
    sloserve_backend: str = "inprocess"


@dataclass
class Launch:
    system: str
    argv: list[str]
    infer_url: str
    metrics_url: str | None
    headers: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    grace_s: float = 5.0
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    started_s: float = 0.0
    ready_s: float = 0.0
    cwd: Path | None = None  # another source tree (``--tree``); None: this one

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, log_dir: Path, nice: int = 0) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{self.system}-{int(time.time() * 1000)}.log"
        env = dict(os.environ)
        env.update(self.env)
        self.started_s = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd or ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=prioritise(nice),
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_ready(self, body: bytes, timeout_s: float = 180.0) -> float:
        """Poll the infer endpoint with the benchmark body until it answers 200; seconds taken."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.system} exited with {self.proc.returncode} before it was ready; "
                    f"log: {self.log_path}\n{self.log_tail()}"
                )
            try:
                req = urllib.request.Request(
                    self.infer_url,
                    data=body,
                    method="POST",
                    headers={"Content-Type": "application/json", **self.headers},
                )
                with urllib.request.urlopen(req, timeout=5) as r:
                    if r.status == 200:
                        json.loads(r.read())
                        self.ready_s = time.monotonic() - self.started_s
                        return self.ready_s
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:200]!r}"
            except (OSError, ValueError) as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(0.25)
        raise TimeoutError(
            f"{self.system} not ready after {timeout_s:.0f}s ({last}); log: {self.log_path}\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM the process group, wait, then SIGKILL whatever is left of the process tree."""
        if self.proc is None:
            return
        procs = tree(self.proc.pid)
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(0.3)
        survivors = [p for p in procs if p.is_running()]
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for p in survivors:
            try:
                p.kill()  # psutil checks the pid is still that process
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:] if self.log_path else ""
        except OSError:
            return ""

    # ---- batch statistics ----------------------------------------------------------------
    def scrape(self) -> str | None:
        """The system's Prometheus exposition text now, None if it has no endpoint or it failed."""
        if not self.metrics_url:
            return None
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
                return r.read().decode(errors="replace")
        except OSError:
            return None

    def batch_counters(self, model: str) -> tuple[float, float] | None:
        """(items, batches) executed so far, from the system's Prometheus endpoint, if it has one.
        Items are rows for sloserve and requests for Triton."""
        text = self.scrape()
        if text is None:
            return None
        if self.system.startswith("sloserve"):
            rows = prom_sum(text, "sloserve_batch_rows_sum", model)
            batches = prom_sum(text, "sloserve_batch_rows_count", model)
        elif self.system == "triton":
            rows = prom_sum(text, "nv_inference_request_success", model)
            batches = prom_sum(text, "nv_inference_exec_count", model)
        else:
            return None
        return rows, batches

    def compute_seconds(self, model: str) -> float | None:
        """Replica compute time spent so far (all batches), from the Prometheus endpoint; sloserve
        only. (Triton's ``nv_inference_compute_infer_duration_us`` adds a batch's time once per
        request in it, so it is not the replica's busy time.)"""
        if not self.system.startswith("sloserve"):
            return None
        text = self.scrape()
        return None if text is None else prom_sum(text, "sloserve_batch_compute_seconds_sum", model)


def peer_python(name: str) -> str:
    exe = PEER_VENVS / name / "bin" / "python"
    if not exe.exists():
        raise FileNotFoundError(f"{exe} is missing: run sloserve/loadtests/peers/setup.sh first")
    return str(exe)


def make_launch(system: str, repo: Path, model: str, variant: str, knobs: BatchingKnobs, tmp_dir: Path) -> Launch:
    onnx = (repo / model / variant / "model.onnx").resolve()
    if not onnx.exists():
        raise FileNotFoundError(f"{onnx} is missing: run `sloserve models build --repo {repo}`")
    http, grpc = free_ports(2)
    url = f"http://127.0.0.1:{http}/v2/models/{model}/infer"
    if system in ("sloserve", "sloserve-ray"):
        backend = "ray" if system == "sloserve-ray" else knobs.sloserve_backend
        cfg = knobs.sloserve_config
        if cfg is None:
            cfg_path = tmp_dir / f"sloserve-{model}.json"
            cfg_path.parent.mkdir(parents=True, exist_ok=True)
            cfg_path.write_text(
                json.dumps(
                    {
                        "models": {
                            model: {
                                "batching": {
                                    "policy": knobs.sloserve_policy,
                                    "max_wait_ms": knobs.max_wait_ms,
                                    "max_batch_size": knobs.max_batch_size,
                                }
                            }
                        }
                    }
                )
            )
            cfg = str(cfg_path)
        argv = [
            sys.executable,
            "-m",
            "sloserve.cli",
            "serve",
            "--backend",
            backend,
            "--repo",
            str(repo),
            "--host",
            "127.0.0.1",
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--config",
            cfg,
            "--log-level",
            "warning",
        ]
        # the variant is pinned by header so that the JSON body stays byte-identical for every system
        # a Ray backend starts its own local Ray (children of the gateway: stopped with its tree)
        return _with_tmp(
            Launch(
                system,
                argv,
                url,
                f"http://127.0.0.1:{http}/metrics",
                headers={"x-variant": variant},
                grace_s=15.0 if backend == "ray" else 5.0,
            ),
            tmp_dir,
        )
    if system == "triton":
        metrics = free_port()
        argv = [
            peer_python("triton"),
            str(PEERS_DIR / "triton_server.py"),
            "--onnx",
            str(onnx),
            "--model",
            model,
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--metrics-port",
            str(metrics),
            "--max-queue-delay-us",
            str(int(knobs.max_wait_ms * 1000)),
            "--instances",
            str(knobs.triton_instances),
            "--max-batch-size",
            str(knobs.max_batch_size),
        ]
        if knobs.triton_preferred:
            argv += ["--preferred-batch-size", *map(str, knobs.triton_preferred)]
        if knobs.triton_metrics:
            argv.append("--metrics")
        return _with_tmp(
            Launch(
                system, argv, url, f"http://127.0.0.1:{metrics}/metrics" if knobs.triton_metrics else None, grace_s=2.0
            ),
            tmp_dir,
        )
    if system == "mlserver":
        metrics = free_port()
        argv = [
            peer_python("mlserver"),
            str(PEERS_DIR / "mlserver_runtime.py"),
            "--onnx",
            str(onnx),
            "--model",
            model,
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--metrics-port",
            str(metrics),
            "--max-batch-size",
            str(knobs.max_batch_size),
            "--max-batch-time-ms",
            str(knobs.max_wait_ms),
            "--parallel-workers",
            str(knobs.mlserver_workers),
        ]
        return _with_tmp(Launch(system, argv, url, None), tmp_dir)
    if system == "rayserve":
        argv = [
            sys.executable,
            str(PEERS_DIR / "rayserve_server.py"),
            "--onnx",
            str(onnx),
            "--model",
            model,
            "--http-port",
            str(http),
            "--max-batch-size",
            str(knobs.max_batch_size),
            "--batch-wait-ms",
            str(knobs.max_wait_ms),
            "--num-cpus",
            str(knobs.rayserve_num_cpus),
            "--replicas",
            str(knobs.rayserve_replicas),
        ]
        if knobs.rayserve_mode == "opt":
            argv.append("--throughput-optimized")
        elif knobs.rayserve_mode in ("ha", "ha0"):
            argv.append("--haproxy")
        # ha0: Ray's workers (the replicas, the HAProxy manager and its HAProxy) at niceness 0, as
        # sloserve's embedded Ray starts its own, instead of Ray's default 15 below the load generator
        env = {"RAY_worker_niceness": "0"} if knobs.rayserve_mode == "ha0" else {}
        return _with_tmp(Launch(system, argv, url, None, env=env, grace_s=15.0), tmp_dir)
    raise ValueError(f"unknown system {system!r}; choose from {', '.join(SYSTEMS)}")


def parse_trees(specs: list[str] | None) -> dict[str, Path]:
    """``--tree LABEL=PATH`` options: other checkouts of sloserve a system can run from (``sloserve:LABEL``)."""
    trees: dict[str, Path] = {}
    for spec in specs or []:
        label, sep, path = spec.partition("=")
        tree = Path(path).resolve()
        if not sep or not label or not ((tree / "sloserve" / "cli").is_dir() or (tree / "gateway" / "cli").is_dir()):
            raise SystemExit(f"--tree {spec!r}: expected LABEL=PATH with PATH a sloserve checkout")
        trees[label] = tree
    return trees


def split_tree(system: str, trees: dict[str, Path]) -> tuple[str, Path | None]:
    """``sloserve-ray:before`` -> (``sloserve-ray``, the tree labelled ``before``); no label: (system, None)."""
    base, sep, label = system.partition(":")
    if not sep:
        return system, None
    if not base.startswith("sloserve"):
        raise SystemExit(f"{system!r}: only sloserve systems run from another tree")
    if label not in trees:
        raise SystemExit(f"{system!r}: no --tree {label}=PATH given")
    return base, trees[label]


def from_tree(launch: Launch, tree: Path | None) -> Launch:
    """Run a sloserve launch from another checkout: its own code (``python -m sloserve.cli`` with that tree
    first on the path, inherited by a local Ray's workers), this interpreter and its packages."""
    if tree is None:
        return launch
    argv = list(launch.argv)
    # a checkout from before the one ``sloserve`` package keeps its command line in gateway/cli
    cli = "sloserve.cli" if (tree / "sloserve" / "cli").is_dir() else "gateway.cli"
    if Path(argv[0]).name == "sloserve":
        argv = [sys.executable, "-m", cli, *argv[1:]]
    argv = [cli if a == "sloserve.cli" else a for a in argv]
    launch.argv = argv
    launch.cwd = tree
    launch.env["PYTHONPATH"] = str(tree)
    return launch


def _with_tmp(launch: Launch, tmp_dir: Path) -> Launch:
    """Temp files of the system (Triton's workspace, MLServer's settings) go under the bench's temp dir."""
    launch.env.setdefault("TMPDIR", str(tmp_dir))
    return launch


def request_body(repo: Path, model: str, index: int = 0, rows: int = 1) -> bytes:
    """A real input as a V2 JSON body: ``rows`` digits images (64 values each) or their 32x32
    upsamplings (1,024)."""
    import numpy as np
    from sklearn.datasets import load_digits

    cfg = json.loads((repo / model / "config.json").read_text())
    inp = cfg["inputs"][0]
    feats = int(np.prod(inp["shape"]))
    x = load_digits().data[index : index + rows].astype(np.float32)
    if feats == 1024:
        from sloserve.modeltools.demo import _upsample

        x = _upsample(x)
    elif feats != 64:
        x = np.random.default_rng(index).random((rows, feats), dtype=np.float32)
    data = [float(v) for v in x.ravel()]
    return json.dumps(
        {"inputs": [{"name": inp["name"], "shape": [rows, feats], "datatype": inp["datatype"], "data": data}]},
        separators=(",", ":"),
    ).encode()


def compute_bound(repo: Path, model: str, variant: str, max_batch: int) -> dict[str, Any]:
    """max over b of b / p50(b) from the variant's profile(s)."""
    res = {}
    for f in sorted((repo / model / variant / "profiles").glob("*.json")):
        p = json.loads(f.read_text())
        pairs = [(b, ms) for b, ms in zip(p["batch_sizes"], p["p50_ms"], strict=True) if ms]
        capped, best = max((b * 1e3 / ms, b) for b, ms in pairs if b <= max_batch)
        full = max(b * 1e3 / ms for b, ms in pairs)
        res[p.get("device_type", f.stem)] = {
            "bound_rps_capped": round(capped, 1),
            "cap": max_batch,
            "batch": best,
            "bound_rps_any_batch": round(full, 1),
        }
    return res


BINARY_SYSTEMS = ("sloserve", "sloserve-ray", "triton")


def binary_body(json_body: bytes) -> tuple[bytes, dict[str, str]]:
    """The same request in KServe V2's binary tensor extension (what ``tritonclient.http`` sends by
    default): a JSON header naming ``binary_data_size``, then the raw little-endian tensor bytes.
    Returns the body and the headers it needs. Triton and sloserve take it; MLServer and the Ray
    Serve peer do not."""
    import numpy as np

    from sloserve.gateway.types import V2_TO_NUMPY

    doc = json.loads(json_body)
    raw = b""
    for t in doc["inputs"]:
        arr = np.asarray(t.pop("data"), dtype=V2_TO_NUMPY[t["datatype"]]).astype(
            "<" + V2_TO_NUMPY[t["datatype"]].str[1:]
        )
        t["parameters"] = {"binary_data_size": arr.nbytes}
        raw += arr.tobytes()
    head = json.dumps(doc, separators=(",", ":")).encode()
    return head + raw, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}


def default_tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="sloserve-bench-"))
