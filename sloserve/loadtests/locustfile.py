"""Locust load test for sloserve: KServe V2 over HTTP and gRPC, each request with its own SLO.

    locust -f sloserve/loadtests/locustfile.py --headless -H http://127.0.0.1:8000 -u 8 -t 15s
    locust -f sloserve/loadtests/locustfile.py,sloserve/loadtests/trace_shape.py --headless -H http://127.0.0.1:8000
    sloserve loadtest --host http://127.0.0.1:8000 --duration 15     # the same, bounded

Users:
* :class:`V2HttpUser` -- ``POST /v2/models/<model>/infer`` with V2 JSON, on Locust's lean
  FastHttpUser (geventhttpclient);
* :class:`V2GrpcUser` -- ``ModelInfer`` through ``tritonclient.grpc`` (grpc made gevent-friendly).

Every request carries ``parameters.slo_ms``. A request *attains* its SLO when it succeeds and its
client-side latency is within its slo_ms. At the end of a headless run the attainment (attained /
all requests) and the error rate (failed / all) are checked against ``--min-attainment`` and
``--max-error-rate``; when either misses, the process exits with code 3. A run within both exits 0
even with a few failed requests; exceptions raised in user code keep Locust's own codes (1, or 2
for unhandled greenlet exceptions). Options take environment variables too
(``SLOSERVE_LOCUST_SLO_MS`` ...: a prefix of their own, so that nothing the gateway reads is set by accident); ``--results-json`` writes the summary and a per-second timeline.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from urllib.parse import urlparse

import gevent
from locust import FastHttpUser, User, events, task
from locust import log as locust_log
from locust.env import Environment
from locust.runners import WorkerRunner
from locust.user.wait_time import constant_throughput

SHAPES = {"digits": 64, "heavy": 1024, "cnn": 64}
EXIT_SLO_MISSED = 3


# ------------------------------------------------------------------------------------ options
@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    g = parser.add_argument_group("sloserve")
    g.add_argument(
        "--models",
        env_var="SLOSERVE_LOCUST_MODELS",
        default="digits",
        help="models and weights, e.g. 'digits' or 'digits:3,heavy:1'",
    )
    g.add_argument(
        "--slo-ms",
        env_var="SLOSERVE_LOCUST_SLO_MS",
        type=float,
        default=50.0,
        help="per-request latency budget sent as parameters.slo_ms (ms)",
    )
    g.add_argument(
        "--min-attainment",
        env_var="SLOSERVE_LOCUST_MIN_ATTAINMENT",
        type=float,
        default=0.95,
        help="fail the run when fewer requests than this fraction attain their SLO",
    )
    g.add_argument(
        "--max-error-rate",
        env_var="SLOSERVE_LOCUST_MAX_ERROR_RATE",
        type=float,
        default=0.01,
        help="fail the run when more requests than this fraction fail",
    )
    g.add_argument(
        "--rps-per-user",
        env_var="SLOSERVE_LOCUST_RPS_PER_USER",
        type=float,
        default=20.0,
        help="requests per second each user paces itself to (0: back to back)",
    )
    g.add_argument(
        "--grpc-host",
        env_var="SLOSERVE_LOCUST_GRPC_HOST",
        default="",
        help="host:port of the gRPC endpoint (default: the HTTP host, port 8001)",
    )
    g.add_argument(
        "--results-json",
        env_var="SLOSERVE_LOCUST_RESULTS_JSON",
        default="",
        help="write the SLO summary and a per-second timeline to this file",
    )
    g.add_argument(
        "--exit-code-file",
        env_var="SLOSERVE_LOCUST_EXIT_CODE_FILE",
        default="",
        help="write the process's exit code here once the run's stats are out (sloserve "
        "loadtest uses it to end a process that then hangs on its way out)",
    )
    # Trace shape (sloserve/loadtests/trace_shape.py): see that module.
    g.add_argument(
        "--trace-file",
        env_var="SLOSERVE_LOCUST_TRACE_FILE",
        default="",
        help="per-minute arrival trace CSV (default: the Azure Functions 2019 day in sloserve/loadtests/traces/)",
    )
    g.add_argument(
        "--trace-kind",
        env_var="SLOSERVE_LOCUST_TRACE_KIND",
        choices=["counts", "timestamps"],
        default="counts",
        help="per-minute counts (a column per series), or request timestamps (a column of seconds)",
    )
    g.add_argument("--trace-column", env_var="SLOSERVE_LOCUST_TRACE_COLUMN", default="aggregate_1350fn")
    g.add_argument("--trace-start-minute", env_var="SLOSERVE_LOCUST_TRACE_START_MINUTE", type=int, default=540)
    g.add_argument("--trace-minutes", env_var="SLOSERVE_LOCUST_TRACE_MINUTES", type=int, default=15)
    g.add_argument(
        "--seconds-per-minute",
        env_var="SLOSERVE_LOCUST_SECONDS_PER_MINUTE",
        type=float,
        default=1.0,
        help="time compression: test seconds per trace minute",
    )
    g.add_argument(
        "--peak-rps",
        env_var="SLOSERVE_LOCUST_PEAK_RPS",
        type=float,
        default=150.0,
        help="the trace's busiest minute maps to this request rate",
    )


# ------------------------------------------------------------------------------------ tally
class Tally:
    """Counts of requests, failures and SLO attainment, overall and per second of the run."""

    def __init__(self) -> None:
        self.start = time.time()
        self.n = self.failed = self.attained = 0
        self.seconds: dict[int, list] = {}  # second -> [n, failed, attained, latencies_ms, batch_sum, batch_n]
        self.users: dict[int, tuple[int, float | None]] = {}  # second -> (users, target rps, if shaped)

    def add(self, latency_ms: float, slo_ms: float, ok: bool, batch: int | None = None) -> None:
        hit = ok and latency_ms <= slo_ms
        self.n += 1
        self.failed += not ok
        self.attained += hit
        s = self.seconds.get(int(time.time() - self.start))
        if s is None:
            s = self.seconds[int(time.time() - self.start)] = [0, 0, 0, [], 0, 0]
        s[0] += 1
        s[1] += not ok
        s[2] += hit
        if ok:
            s[3].append(round(latency_ms, 3))
        if batch:
            s[4] += batch
            s[5] += 1

    def merge(self, data: dict) -> None:
        """Fold in a worker's report (distributed runs)."""
        self.n += data["n"]
        self.failed += data["failed"]
        self.attained += data["attained"]
        for sec, v in data["seconds"].items():
            sec = int(float(sec) + data["start"] - self.start)
            s = self.seconds.setdefault(sec, [0, 0, 0, [], 0, 0])
            for i in (0, 1, 2, 4, 5):
                s[i] += v[i]
            s[3].extend(v[3])

    def drain(self) -> dict:
        data = {
            "n": self.n,
            "failed": self.failed,
            "attained": self.attained,
            "start": self.start,
            "seconds": self.seconds,
        }
        self.n = self.failed = self.attained = 0
        self.seconds = {}
        return data

    def summary(self, opts) -> dict:
        n = max(self.n, 1)
        attainment, error_rate = self.attained / n, self.failed / n
        timeline = []
        for sec in sorted(self.seconds):
            cnt, failed, hit, lat, bsum, bn = self.seconds[sec]
            lat.sort()
            users, target = self.users.get(sec, (None, None))
            timeline.append(
                {
                    "t_s": sec,
                    "requests": cnt,
                    "failed": failed,
                    "attainment": hit / cnt if cnt else None,
                    "p50_ms": _q(lat, 0.5),
                    "p99_ms": _q(lat, 0.99),
                    "mean_batch": bsum / bn if bn else None,
                    "users": users,
                    "target_rps": target,
                }
            )
        return {
            "requests": self.n,
            "failed": self.failed,
            "attained": self.attained,
            "attainment": attainment,
            "error_rate": error_rate,
            "slo_ms": opts.slo_ms,
            "min_attainment": opts.min_attainment,
            "max_error_rate": opts.max_error_rate,
            "passed": self.n > 0 and attainment >= opts.min_attainment and error_rate <= opts.max_error_rate,
            "timeline": timeline,
        }


def _q(xs: list[float], q: float) -> float | None:
    return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)] if xs else None


TALLY = Tally()


@events.test_start.add_listener
def _on_start(environment, **_kw) -> None:
    TALLY.drain()
    TALLY.start = time.time()
    TALLY.users.clear()
    if not isinstance(environment.runner, WorkerRunner):
        gevent.spawn(_sample_users, environment)


def _sample_users(environment) -> None:
    while environment.runner is not None and environment.runner.state not in ("stopped", "quitting"):
        sec = int(time.time() - TALLY.start)
        TALLY.users[sec] = (environment.runner.user_count, getattr(environment, "sloserve_target_rps", None))
        gevent.sleep(1.0)


@events.report_to_master.add_listener
def _to_master(client_id, data, **_kw) -> None:
    data["sloserve"] = TALLY.drain()


@events.worker_report.add_listener
def _from_worker(client_id, data, **_kw) -> None:
    if "sloserve" in data:
        TALLY.merge(data["sloserve"])


_EXIT_CODE_FILE = [""]


@events.init.add_listener
def _remember_exit_code_file(environment, **_kw) -> None:
    opts = environment.parsed_options
    _EXIT_CODE_FILE[0] = getattr(opts, "exit_code_file", "") if opts is not None else ""


@events.quitting.add_listener
def _verdict(environment, **_kw) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    opts = environment.parsed_options
    if opts is None:
        return
    s = TALLY.summary(opts)
    if opts.results_json:
        with open(opts.results_json, "w") as f:
            json.dump(s, f, indent=1)
    verdict = "PASS" if s["passed"] else "FAIL"
    print(
        f"\nsloserve SLO check: {verdict}: {s['requests']} requests, SLO attainment {s['attainment']:.4f} "
        f"(min {opts.min_attainment}) within slo_ms={opts.slo_ms:g}, error rate {s['error_rate']:.4f} "
        f"(max {opts.max_error_rate})",
        file=sys.stderr,
        flush=True,
    )
    if not s["passed"]:
        environment.process_exit_code = EXIT_SLO_MISSED
    elif (
        environment.process_exit_code is None
        and not environment.runner.exceptions
        and not locust_log.unhandled_greenlet_exception
    ):
        environment.process_exit_code = 0  # failures under --max-error-rate are within the contract


@events.quit.add_listener
def _record_exit_code(exit_code, **_kw) -> None:
    """Fired after the stats are printed, just before Locust exits: leave the code for the parent.

    With gRPC made gevent-friendly, the interpreter can hang on its way out after everything is
    printed (seen once in CI). ``sloserve loadtest`` waits a short grace after this file appears,
    then ends the process and returns the code written here, so the verdict is never lost to a hang.
    """
    path = _EXIT_CODE_FILE[0]
    if path:
        sys.stdout.flush()
        sys.stderr.flush()
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{exit_code}\n")
        os.replace(tmp, path)  # the parent reads a whole code or none


# ------------------------------------------------------------------------------------ users
def _pick_models(spec: str) -> tuple[list[str], list[float]]:
    names, weights = [], []
    for part in spec.split(","):
        name, _, w = part.strip().partition(":")
        if name not in SHAPES:
            raise SystemExit(f"sloserve locustfile: unknown model {name!r}; known: {sorted(SHAPES)}")
        names.append(name)
        weights.append(float(w or 1))
    return names, weights


def _paced(user) -> float:
    env = user.environment
    if getattr(env, "sloserve_open_loop", False):
        return _open_loop_wait(user, env)
    rate = env.parsed_options.rps_per_user
    return constant_throughput(rate)(user) if rate > 0 else 0.0


def _open_loop_wait(user, env) -> float:
    """A fixed pool of users sending the shape's current rate between them: each waits an
    exponential time at its share of the rate, less the time its last request took, so the pool's
    arrivals are close to Poisson at a rate that changes every second (a trace's clumps)."""
    now = time.monotonic()
    took = now - getattr(user, "_sloserve_woke", now)
    share = (getattr(env, "sloserve_target_rps", None) or 0.0) / max(env.runner.user_count, 1)
    wait = max(0.0, user.rng.expovariate(share) - took) if share > 0 else 1.0
    user._sloserve_woke = now + wait
    return wait


class _SloUser:
    environment: Environment  # set by the Locust User this is mixed into

    @property
    def options(self) -> argparse.Namespace:
        """The run's options (this file's and Locust's), parsed before any user starts."""
        opts = self.environment.parsed_options
        if opts is None:
            raise RuntimeError("sloserve locustfile: a user started before Locust parsed its options")
        return opts

    def setup_models(self) -> None:
        opts = self.options
        self.models, self.weights = _pick_models(opts.models)
        self.slo_ms = opts.slo_ms
        self.rng = random.Random()

    def choose(self) -> str:
        return self.rng.choices(self.models, self.weights)[0] if len(self.models) > 1 else self.models[0]


class V2HttpUser(_SloUser, FastHttpUser):
    """V2 REST inference with JSON bodies (a few pre-encoded random inputs per model)."""

    weight = 3
    wait_time = _paced

    def on_start(self) -> None:
        self.setup_models()
        self.bodies = {}
        for m in self.models:
            w = SHAPES[m]
            self.bodies[m] = [
                json.dumps(
                    {
                        "inputs": [
                            {
                                "name": "input",
                                "datatype": "FP32",
                                "shape": [1, w],
                                "data": [round(self.rng.uniform(0, 16), 3) for _ in range(w)],
                            }
                        ],
                        "parameters": {"slo_ms": self.slo_ms},
                    }
                ).encode()
                for _ in range(8)
            ]

    @task
    def infer(self) -> None:
        m = self.choose()
        t0 = time.perf_counter()
        with self.client.post(
            f"/v2/models/{m}/infer",
            # bytes: locust types ``data`` as str | dict, though its docstring and geventhttpclient take bytes
            data=self.rng.choice(self.bodies[m]),  # type: ignore[arg-type]
            headers={"Content-Type": "application/json"},
            name=f"REST {m}",
            catch_response=True,
        ) as r:
            ms = (time.perf_counter() - t0) * 1e3
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {(r.text or '')[:160]}")
                TALLY.add(ms, self.slo_ms, ok=False)
                return
            try:
                batch = r.json().get("parameters", {}).get("batch_size")
            except ValueError:
                r.failure("response is not JSON")
                TALLY.add(ms, self.slo_ms, ok=False)
                return
            TALLY.add(ms, self.slo_ms, ok=True, batch=batch)


class V2GrpcUser(_SloUser, User):
    """V2 gRPC inference through tritonclient.grpc (raw input contents)."""

    weight = 1
    wait_time = _paced

    def on_start(self) -> None:
        import grpc.experimental.gevent as grpc_gevent

        grpc_gevent.init_gevent()  # before the first channel: grpc's blocking calls yield to gevent
        import numpy as np
        import tritonclient.grpc as grpcclient

        self._err = grpcclient.InferenceServerException
        self.setup_models()
        addr = self.options.grpc_host
        if not addr:
            u = urlparse(self.host or "http://127.0.0.1:8000")
            addr = f"{u.hostname}:{(u.port or 8000) + 1}"
        self.grpc = grpcclient.InferenceServerClient(addr)
        self.inputs = {}
        for m in self.models:
            x = grpcclient.InferInput("input", [1, SHAPES[m]], "FP32")
            x.set_data_from_numpy((np.random.rand(1, SHAPES[m]) * 16).astype(np.float32))
            self.inputs[m] = [x]

    def on_stop(self) -> None:
        self.grpc.close()

    @task
    def infer(self) -> None:
        m = self.choose()
        t0 = time.perf_counter()
        exc, batch = None, None
        try:
            res = self.grpc.infer(m, self.inputs[m], parameters={"slo_ms": float(self.slo_ms)}, client_timeout=10)
            p = res.get_response().parameters.get("batch_size")
            batch = p.int64_param if p is not None else None
        except self._err as e:
            exc = e
        ms = (time.perf_counter() - t0) * 1e3
        self.environment.events.request.fire(
            request_type="gRPC", name=f"gRPC {m}", response_time=ms, response_length=0, exception=exc, context={}
        )
        TALLY.add(ms, self.slo_ms, ok=exc is None, batch=batch)


__all__ = ["Tally", "V2GrpcUser", "V2HttpUser"]
