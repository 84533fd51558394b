import os

import pytest

from tests.conftest import ServerProcess

BACKENDS = ["inprocess", "ray"]
_SERVERS: dict[str, ServerProcess] = {}


@pytest.fixture(scope="session")
def servers(model_repo):
    """One server per backend for the whole session (Ray starts once)."""

    def get(backend: str) -> ServerProcess:
        if backend not in _SERVERS:
            _SERVERS[backend] = ServerProcess(model_repo, backend).wait_ready()
        return _SERVERS[backend]

    yield get
    problems = []
    for backend, s in _SERVERS.items():
        rc = s.stop()
        left = s.leftovers()
        if rc != 0 or left:  # SIGTERM must stop everything cleanly: no crash, no orphan Ray process
            problems.append(f"{backend}: exit {rc}, left {left}")
            for line in left:
                os.kill(int(line.split()[0]), 9)
    _SERVERS.clear()
    assert not problems, problems


@pytest.fixture(scope="session", params=BACKENDS)
def server(request, servers):
    return servers(request.param)


@pytest.fixture(scope="session")
def ray_server(servers):
    return servers("ray")
