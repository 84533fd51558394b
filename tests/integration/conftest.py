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
    for s in _SERVERS.values():
        s.stop()
    _SERVERS.clear()


@pytest.fixture(scope="session", params=BACKENDS)
def server(request, servers):
    return servers(request.param)


@pytest.fixture(scope="session")
def ray_server(servers):
    return servers("ray")
