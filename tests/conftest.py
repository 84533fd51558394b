import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPO = Path(os.environ.get("SLOSERVE_TEST_REPO", ROOT / "model_repository"))


_PORTS = random.Random(os.getpid())


def free_port() -> int:
    """A free port below the kernel's ephemeral range (and above Ray's worker ports, 10002-19999):
    a port the kernel handed out with bind(0) could be handed again to a process that binds 0 (Ray's
    GCS and agents do) between this check and the server's own bind."""
    lo = _ephemeral_low()
    for _ in range(200):
        port = _PORTS.randrange(20000, lo)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return max(int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]), 20001)
    except (OSError, ValueError, IndexError):
        return 32768


@pytest.fixture(scope="session")
def model_repo() -> Path:
    if not (REPO / ".built").exists():
        subprocess.run(
            [sys.executable, "-m", "sloserve.cli", "models", "build", "--repo", str(REPO)], check=True, cwd=ROOT
        )
    return REPO


RAY_SERVERS: list["ServerProcess"] = []  # ray-backend servers the tests started

# What every test server runs with unless the test (its ``env`` or a command-line flag) or the
# environment says otherwise; a setting in a --config file is overridden by these (the environment
# comes before the file), so a test that wants another value passes it in ``env`` or as a flag.
# - ``loop_lag_shed_ms`` 0: the event-loop door (5 ms by default with the in-process backend) refuses
#   requests with 503 / UNAVAILABLE while the gateway's loop runs late, which a busy box causes: a test
#   of something else (a 400, a burst answered in full, zero 5xx under fuzzing) would get the door's
#   answer instead. The door's own tests (tests/integration/test_shed_answer.py) set it.
# - ``workers`` 1: by default `sloserve serve` starts half the host's cores in gateway processes (1 on
#   the 2-core boxes the suite grew up on, 2 or more elsewhere), and several workers refuse the
#   repository API and split the requests and metrics between them. The workers' own tests pass
#   --workers (tests/integration/test_workers.py).
SERVER_ENV = {"SLOSERVE_LOOP_LAG_SHED_MS": "0", "SLOSERVE_WORKERS": "1"}


def ray_logs(tail: int = 1500) -> str:
    """The newest Ray session's log directory: which files exist, and the ends of the GCS's and the
    raylet's (an empty directory means the GCS never started)."""
    session = Path(tempfile.gettempdir()) / "ray" / "session_latest"
    logs = session / "logs"
    if not logs.is_dir():
        return "\n(no Ray session directory)"
    out = [f"\nRay session {session.resolve().name}: {sorted(p.name for p in logs.iterdir())}"]
    for name in ("gcs_server.out", "gcs_server.err", "raylet.out", "raylet.err"):
        f = logs / name
        if f.is_file() and f.stat().st_size:
            out.append(f"--- {name}:\n{f.read_text(errors='replace')[-tail:]}")
    return "\n".join(out)


class ServerProcess:
    """`sloserve serve` in a subprocess on free ports; stopped with SIGTERM.

    One Ray cluster at a time: on a 2-core box a second embedded Ray misses Ray's fixed 30 s raylet
    start-up wait, so starting a ray-backend server first stops the shared session one (``shared``),
    which the session fixture starts again when a later test needs it.
    """

    def __init__(self, repo: Path, backend: str, extra: list[str] | None = None, env: dict | None = None):
        self.shared = False
        if backend == "ray":
            for other in RAY_SERVERS:
                if other.shared and other.proc.poll() is None:
                    other.stop()
            RAY_SERVERS.append(self)
        self.http_port, self.grpc_port = free_port(), free_port()
        self.backend = backend
        cmd = [
            sys.executable,
            "-m",
            "sloserve.cli",
            "serve",
            "--repo",
            str(repo),
            "--backend",
            backend,
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            "--log-level",
            "warning",
        ]
        fd, log_name = tempfile.mkstemp(prefix="sloserve-test-", suffix=".log")
        self.log_path = Path(log_name)
        with os.fdopen(fd, "w") as log:  # the server keeps its own descriptor
            self.proc = subprocess.Popen(
                cmd + (extra or []),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**SERVER_ENV, **os.environ, **(env or {})},
                start_new_session=True,
            )

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def wait_ready(self, timeout: float | None = None) -> "ServerProcess":
        """Waits for /v2/health/ready. A Ray server may take its own start-up retry (2 x 120 s for the
        GCS on a slow box) before its replicas load: it gets 300 s unless told otherwise. If it is not
        ready in time it is killed (process group and all), and the error carries what Ray wrote."""
        import urllib.request

        if timeout is None:
            timeout = 300.0 if self.backend == "ray" else 120.0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                said = self.output()
                self.kill()  # whatever it left in its process group (Ray's daemons) goes too
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{said}")
            try:
                with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except Exception:
                pass
            time.sleep(0.1)
        said = self.output()
        self.kill()
        raise TimeoutError(f"server not ready in {timeout}s:\n{said}{ray_logs() if self.backend == 'ray' else ''}")

    def kill(self) -> None:
        """SIGKILL the server's whole process group (Ray's daemons included) and forget it."""
        if self in RAY_SERVERS:
            RAY_SERVERS.remove(self)
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def output(self, tail: int | None = 5000) -> str:
        text = self.log_path.read_text(errors="replace")
        return text if tail is None else text[-tail:]

    def leftovers(self) -> list[str]:
        """Processes still in the server's process group (Ray's agents would be) after it stopped."""
        out = subprocess.run(["ps", "-eo", "pid,pgid,args"], capture_output=True, text=True).stdout
        return [line for line in out.splitlines()[1:] if line.split()[1] == str(self.proc.pid)]

    def stop(self, sig=15, timeout: float = 30.0) -> int:
        if self in RAY_SERVERS:
            RAY_SERVERS.remove(self)
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise
        if self.proc.returncode == 0:
            self.log_path.unlink(missing_ok=True)
        else:  # a crash on the way out: keep what it said for the assertion that reports it
            self.last_words = self.output(3000)
        return self.proc.returncode
