"""Shared test set-up: the path and hash seed, the sandbox fixtures, and the container leak check.

The fixtures here are found by pytest in every test module (no import). The helpers they are built on,
and the other helpers tests share, are plain functions and classes in tests/docker_support.py, which
tests import normally.

Leak check (:func:`pytest_sessionfinish`): at the end of every session, whatever the order the test
files ran in, the cached services are closed and, when a Docker engine answers, no container labelled by
this session (``forkyard.sandbox=<SERVER_NAME>...``) may remain; if one does, the run fails (exit status
1) with the containers named. Under pytest-xdist each worker is a session of its own (its own ``SERVER_NAME``)
and the controller fails the run for any worker's leaks. ``FORKYARD_SERVER_NAME`` is set to ``SERVER_NAME`` for
the session, so in-process providers label their sandboxes the same way.
"""

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("PYTHONHASHSEED", "0")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers on two cores: each worker's torch (and the commands it starts) computes on one thread, instead of
    # both spreading over both cores and waiting on each other's threads (set before anything imports torch).
    for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_threads, "1")

from tests.docker_support import (  # noqa: E402 - after the path set-up above
    IN_CI,
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


def _tests_run_by(cmd: str) -> list[str]:
    """The test paths (relative to the repository root) a documented command runs in a pytest of its own:
    ``make test-layer LAYER=X`` runs tests/X/, a ``python -m pytest`` command the paths it names."""
    layer = re.fullmatch(r"make test-layer LAYER=(\w+)", cmd)
    if layer:
        return [f"tests/{layer.group(1)}/"]
    if " -m pytest " in cmd:
        return [arg for arg in cmd.split() if arg.startswith("tests/")]
    return []


_run_twice: dict[str, list[str]] = {}  # documented command -> the tests of this session it runs instead


@pytest.hookimpl(trylast=True)  # after -k / -m / --deselect have chosen the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests documented commands run are deselected here (:func:`_deselect_run_twice`), and on pytest-xdist
    workers the documented commands go first (:func:`_documented_commands_first`)."""
    _deselect_run_twice(config, items)
    _documented_commands_first(items)


def _deselect_run_twice(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test runs once per session. Two documented commands that tests/repo/test_docs_commands.py runs as
    written are pytest runs of this suite's own tests: ``make test-layer LAYER=envs`` (README: the whole envs
    layer) and docs/reliability.md's ``python -m pytest ... test_reliability.py test_schema_fuzz.py``. When such a
    command is among the items, the tests it runs are deselected here: they run, the same tests on the same
    code, inside that command's pytest, whose failures fail the docs test with their summary lines. Without it
    (a layer run alone, ``-m "not slow"``, or Docker missing for a command that needs it) they run here as usual.
    ``FORKYARD_TESTS_RUN_TWICE=1`` keeps both runs."""
    if os.environ.get("FORKYARD_TESTS_RUN_TWICE") == "1":
        return
    paths: dict[str, list[str]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        cmd = callspec.params.get("cmd") if callspec is not None else None
        if getattr(item, "originalname", None) != "test_documented_command" or not isinstance(cmd, str):
            continue
        if item.get_closest_marker("docker") and not (IN_CI or docker_reason() is None):
            continue  # that command would skip: its tests run here
        if _tests_run_by(cmd):
            paths[cmd] = _tests_run_by(cmd)
    if not paths:
        return
    keep, dropped = [], []
    for item in items:
        owner = next((cmd for cmd, prefixes in paths.items() if item.nodeid.startswith(tuple(prefixes))), None)
        (dropped if owner else keep).append(item)
        if owner:
            _run_twice.setdefault(owner, []).append(item.nodeid)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _documented_commands_first(items: list[pytest.Item]) -> None:
    """On pytest-xdist workers (``make test``: ``-n 2 --dist loadfile``), the documented commands come first: their
    file is the longest (about half the suite), and files go to workers in collection order, so it starts at once
    on one worker while the other takes the rest. Each worker collects the same order."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: not item.nodeid.startswith("tests/repo/test_docs_commands.py"))


_leaks: list[str] = []  # what the leak check found, shown in the terminal summary
#: Seconds each layer's tests took (setup, call and teardown), by the folder under tests/; shown in the summary.
_layer_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add the phase's duration to its layer's total (``tests/<layer>/...``; a documented command's own pytest run
    counts in the layer of the test that runs it, ``repo``)."""
    parts = report.nodeid.split("/")
    layer = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    _layer_seconds[layer] = _layer_seconds.get(layer, 0.0) + report.duration


@pytest.hookimpl(trylast=True)  # after pytest's own session finish, which tears down any fixtures still set up
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The leak check (module docstring): close every cached service, then fail the run (exit status 1) if a
    container labelled by this session is left."""
    close_all()
    if docker_reason() is None:
        _leaks.extend(session_containers())
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller reports and fails (pytest_testnodedown)
        workeroutput["leaks"], workeroutput["run_twice"] = list(_leaks), dict(_run_twice)
    elif _leaks:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook, on the controller: a worker finished
def pytest_testnodedown(node, error) -> None:
    """Collect what a worker's leak check found, and which tests its documented commands ran."""
    out = getattr(node, "workeroutput", None) or {}
    _leaks.extend(out.get("leaks", []))
    for cmd, nodeids in out.get("run_twice", {}).items():
        _run_twice.setdefault(cmd, nodeids)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Says which tests a documented command ran instead of this session (:func:`pytest_collection_modifyitems`) and
    how long each layer's tests took (docs/performance.md keeps the figures); names the containers the leak check
    found (the run has already failed)."""
    if _layer_seconds:
        total = sum(_layer_seconds.values())
        terminalreporter.write_line("seconds per layer: " + ", ".join(
            f"{layer} {secs:.0f}" for layer, secs in sorted(_layer_seconds.items(), key=lambda kv: -kv[1]))
            + f" (tests, {total:.0f} in all)")
    for cmd, nodeids in _run_twice.items():
        terminalreporter.write_line(f"{len(nodeids)} test(s) deselected here: the documented command `{cmd[:100]}` "
                                    f"runs them (tests/repo/test_docs_commands.py)")
    if _leaks:
        terminalreporter.write_sep("=", "container leak check failed", red=True, bold=True)
        terminalreporter.write_line(
            f"{len(_leaks)} container(s) labelled by this session (forkyard.sandbox=pytest-PID...) are left after"
            f" every test and service finished (a backend or test did not remove them): {', '.join(_leaks)}", red=True)
