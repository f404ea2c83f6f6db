"""Shared test set-up: the path and hash seed, the sandbox fixtures, and the container leak check.

The fixtures here are found by pytest in every test module (no import). The helpers they are built on,
and the other helpers tests share, are plain functions and classes in tests/docker_support.py, which
tests import normally.

Leak check (:func:`pytest_sessionfinish`): at the end of every session, whatever the order the test
files ran in, the cached services are closed and, when a Docker engine answers, no container labelled by
this session (``forkyard.sandbox=<SERVER_NAME>...``) may remain; if one does, the run fails (exit status
1) with the containers named. ``FORKYARD_SERVER_NAME`` is set to ``SERVER_NAME`` for the session, so
in-process providers label their sandboxes the same way.
"""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("PYTHONHASHSEED", "0")

from tests.docker_support import (  # noqa: E402 - after the path set-up above
    SERVER_NAME,
    close_all,
    docker_reason,
    make_fixture_tree,
    require_bwrap,
    require_docker,
    session_containers,
    shared_service,
)

# Every sandbox this session starts in-process (FileQA by backend name, embedded providers) carries this
# session's label, so the leak check sees it. Documented commands run without FORKYARD_* variables
# (tests/repo/test_docs_commands.py), as a user's shell would.
os.environ["FORKYARD_SERVER_NAME"] = SERVER_NAME
# The servers tests start are their own: no API key unless a test gives one (tests/sandbox_server/test_auth.py).
for _var in ("FORKYARD_API_KEY", "FORKYARD_API_KEY_FILE"):
    os.environ.pop(_var, None)


@pytest.fixture(scope="session")
def fixture_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test data tree (:func:`tests.docker_support.make_fixture_tree`), shared by every backend: Docker
    bind-mounts it read-only over /data."""
    return make_fixture_tree(tmp_path_factory.mktemp("sandbox-fixture"))


@pytest.fixture(scope="session", params=["local", "local-nobwrap", "docker"])
def service(request: pytest.FixtureRequest, fixture_data: Path):
    """A started SandboxService per backend over the fixture data (session-wide, shared across modules)."""
    if request.param == "docker":
        require_docker()
    elif request.param == "local":
        require_bwrap()
    return shared_service(request.param, fixture_data)


@pytest.fixture(scope="session")
def local_service(fixture_data: Path):
    """The session-wide SandboxService of the isolated local backend (bubblewrap)."""
    require_bwrap()
    return shared_service("local", fixture_data)


@pytest.fixture(scope="session")
def docker_service(fixture_data: Path):
    """The session-wide SandboxService of the Docker backend."""
    require_docker()
    return shared_service("docker", fixture_data)


_leaks: list[str] = []  # what the leak check found, shown in the terminal summary


@pytest.hookimpl(trylast=True)  # after pytest's own session finish, which tears down any fixtures still set up
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The leak check (module docstring): close every cached service, then fail the run (exit status 1) if a
    container labelled by this session is left."""
    close_all()
    if docker_reason() is None:
        _leaks[:] = session_containers()
        if _leaks:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Names the containers the leak check found (the run has already failed)."""
    if _leaks:
        terminalreporter.write_sep("=", "container leak check failed", red=True, bold=True)
        terminalreporter.write_line(
            f"{len(_leaks)} container(s) labelled forkyard.sandbox={SERVER_NAME}[-...] are left after every test "
            f"and service finished (a backend or a test did not remove them): {', '.join(_leaks)}", red=True)
