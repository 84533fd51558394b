import os

import pytest

from tests.conftest import ServerProcess

BACKENDS = ["inprocess", "ray"]
_SERVERS: dict[str, ServerProcess] = {}


# Tests that abuse the shared Ray server (floods, replicas killed): run last of the tests that share it.
_ROUGH_ON_THE_SHARED_SERVER = ("test_flood.py", "test_repeated_kills.py")


def uses_shared_ray(item: pytest.Item) -> bool:
    """Whether a test runs against the session's shared Ray server: it asks for ``ray_server``, for
    ``server`` with the ray backend, or (calling ``servers("ray")`` itself) is marked ``shared_ray``."""
    names = getattr(item, "fixturenames", ())
    callspec = getattr(item, "callspec", None)
    on_ray = callspec is not None and callspec.params.get("server") == "ray"
    return "ray_server" in names or ("server" in names and on_ray) or item.get_closest_marker("shared_ray") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests on the shared Ray server run one after another, where the first of them stands. A test
    that starts a Ray of its own stops the shared one (one Ray at a time: tests/conftest.py), and the
    next test that needs it waits for a fresh start (~35 s on 2 cores), so in file order the shared
    server started five times; grouped, it starts once. Nothing else moves."""
    shared = [i for i in items if uses_shared_ray(i)]
    if not shared:
        return
    first = items.index(shared[0])
    rest = [i for i in items if not uses_shared_ray(i)]
    shared.sort(key=lambda i: i.path.name in _ROUGH_ON_THE_SHARED_SERVER)  # stable: file order otherwise
    items[:] = rest[:first] + shared + rest[first:]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The live fuzzers' calls per REST operation and gRPC method, with their server errors
    (tests/fuzz/tally.py); also written as JSON to ``SLOSERVE_FUZZ_OUT`` when that is set."""
    from tests.fuzz import tally

    if tally.empty():
        return
    terminalreporter.write_sep("-", "fuzzed calls")
    for line in tally.lines():
        terminalreporter.write_line(line)
    out = os.environ.get("SLOSERVE_FUZZ_OUT")
    if out:
        tally.write(out)
        terminalreporter.write_line(f"written to {out}")


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
