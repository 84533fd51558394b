import pytest

from tests.conftest import ServerProcess

BACKENDS = ["inprocess"]


@pytest.fixture(scope="session", params=BACKENDS)
def server(request, model_repo):
    s = ServerProcess(model_repo, request.param).wait_ready()
    yield s
    s.stop()
