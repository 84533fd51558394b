import os

import pytest

from tests.conftest import ServerProcess

BACKENDS = ["inprocess", "ray"]
_SERVERS: dict[str, ServerProcess] = {}


@pytest.fixture(scope="session")
def servers(model_repo):
    """One server per backend for the whole session (Ray starts once)."""

    crashed: list[str] = []  # shared servers that did not stop cleanly: the session fails at its end

    def get(backend: str) -> ServerProcess:
        s = _SERVERS.get(backend)
        if s is None or s.proc.poll() is not None:  # first use, or stopped to make room for another Ray
            if s is not None:
                rc, left = s.proc.returncode, s.leftovers()
                if rc != 0 or left:  # recorded, and a fresh server keeps the later tests meaningful
                    crashed.append(
                        f"{backend}: exit {rc}, left {left}; log {s.log_path}, its end:\n{getattr(s, 'last_words', '')}"
                    )
                    for line in left:
                        os.kill(int(line.split()[0]), 9)
            s = ServerProcess(model_repo, backend)
            s.shared = True
            s.wait_ready()  # on failure it is killed, never kept: the next test starts a fresh one
            _SERVERS[backend] = s
        return s

    yield get
    problems = list(crashed)
    for backend, s in _SERVERS.items():
        rc = s.stop()
        left = s.leftovers()
        if rc != 0 or left:  # SIGTERM must stop everything cleanly: no crash, no orphan Ray process
            problems.append(
                f"{backend}: exit {rc}, left {left}; log {s.log_path}, its end:\n{getattr(s, 'last_words', '')}"
            )
            for line in left:
                os.kill(int(line.split()[0]), 9)
    _SERVERS.clear()
    assert not problems, problems


@pytest.fixture(params=BACKENDS)  # per test: the shared Ray server may have been replaced meanwhile
def server(request, servers):
    return servers(request.param)


@pytest.fixture
def ray_server(servers):
    return servers("ray")
