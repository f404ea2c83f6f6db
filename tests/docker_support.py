"""Helpers of the sandbox tests: the fixture data tree, Docker / bubblewrap requirements, session-wide
services, servers on loopback, and the label check. Tests import what they need from here; the pytest
fixtures built on these helpers (``fixture_data``, ``service``, ``local_service``, ``docker_service``) are
in tests/conftest.py, where pytest finds them without an import.

Session-wide objects are cached here at module level, so every test module shares one service per
backend (:func:`shared_service`) until :func:`close_all` closes them at the end of the session.

Docker: in CI (``CI=true``) a missing engine or image is a failure, never a skip; elsewhere the Docker
tests skip with the reason. The same holds for bubblewrap, which the isolated local backend needs
(``local``); ``local-nobwrap`` is the explicit opt-in ``LocalBackend(unsafe_no_isolation=True)``. Every
container the tests create carries the label ``forkyard.sandbox=<SERVER_NAME>`` or
``<SERVER_NAME>-<suffix>``; at the end of the session none may remain (tests/conftest.py checks it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI") == "true"
TEST_LABEL_PREFIX = "pytest-"
SERVER_NAME = f"{TEST_LABEL_PREFIX}{os.getpid()}"
CAP = 65536

_cache: dict[str, object] = {}
_lock = threading.RLock()  # re-entrant: a fixture that holds it may build the images (require_docker)


def docker_reason() -> str | None:
    """Why Docker tests cannot run here (None when they can)."""
    if "docker_reason" not in _cache:
        reason = None
        try:
            import docker

            c = docker.from_env(timeout=10)
            c.ping()
            c.close()
        except Exception as exc:  # noqa: BLE001
            reason = f"no Docker engine answers ({exc}); run ./scripts/ensure-docker.sh"
        _cache["docker_reason"] = reason
    return _cache["docker_reason"]  # type: ignore[return-value]


def require_docker() -> None:
    """Skip (outside CI) or fail (in CI) when no engine answers; build the images once per session."""
    reason = docker_reason()
    if reason:
        if IN_CI:
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    with _lock:
        if "images" not in _cache:
            r = subprocess.run([str(ROOT / "scripts" / "build-images.sh")], cwd=ROOT, capture_output=True, text=True,
                               env={**os.environ, "PYTHON": sys.executable})
            _cache["images"] = "" if r.returncode == 0 else (r.stderr + r.stdout)[-2000:]
    if _cache["images"]:
        pytest.fail(f"building the sandbox image failed: {_cache['images']}")


def bwrap_reason() -> str | None:
    """Why the isolated local backend cannot run here (None when it can)."""
    if "bwrap_reason" not in _cache:
        from sandbox_server.backends import LocalBackend
        from sandbox_server.errors import IsolationUnavailable

        reason = None
        try:
            LocalBackend(ROOT / "docs", server_name=f"{SERVER_NAME}-probe").close()
        except IsolationUnavailable as exc:
            reason = f"{exc} (run ./scripts/ensure-bwrap.sh)"
        _cache["bwrap_reason"] = reason
    return _cache["bwrap_reason"]  # type: ignore[return-value]


def require_bwrap() -> None:
    """Skip (outside CI) or fail (in CI) when bubblewrap cannot isolate the local backend."""
    reason = bwrap_reason()
    if reason:
        if IN_CI:
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)


def leftover_containers(prefix: str = TEST_LABEL_PREFIX) -> list[str]:
    """Names of containers whose forkyard.sandbox label starts with ``prefix``."""
    import docker

    c = docker.from_env(timeout=30)
    try:
        out = []
        # sparse: no per-container inspect, so containers removed meanwhile cannot make this fail
        for ct in c.containers.list(all=True, sparse=True, filters={"label": "forkyard.sandbox"}):
            label = str((ct.attrs.get("Labels") or {}).get("forkyard.sandbox", ""))
            if label.startswith(prefix):
                out.append(f"{ct.id[:12]} ({label})")
        return out
    finally:
        c.close()


def session_containers() -> list[str]:
    """Containers of this test session (label ``SERVER_NAME`` or ``SERVER_NAME-...``), as
    :func:`leftover_containers` names them. Other sessions' containers (a concurrent pytest run) do not count."""
    return [c for c in leftover_containers(SERVER_NAME)
            if c.endswith(f"({SERVER_NAME})") or f"({SERVER_NAME}-" in c]


def make_fixture_tree(root: Path) -> Path:
    """Build the test data tree at ``root/data`` (plus a sibling ``root/data2``) and return ``root/data``.

    Holds corpus files, the field cases' fixtures (a FIFO, links out of the root, Latin-1, NUL/CR, files of
    exactly CAP and CAP+1 bytes, a file whose cap falls inside a 2-byte character) and a 1 MiB file.
    """
    from sandbox_server.corpus import build_corpus

    data = root / "data"
    build_corpus(str(data))
    (data / "notes.txt").write_text("alpha\nbeta\ngamma root\n-dash line\n")
    (data / "a.txt").write_text("apple\n")
    (data / "sub" / "deep").mkdir(parents=True)
    (data / "sub" / "deep" / "file.txt").write_text("deep needle\n")
    (data / "-rf").write_text("a file named -rf\n")
    os.mkfifo(data / "fifo")
    os.symlink("/etc/passwd", data / "link")
    os.symlink("/", data / "dirlink")
    os.symlink("notes.txt", data / "oklink")
    (data / "latin1.txt").write_bytes(b"caf\xe9\n")
    (data / "nulcr.bin").write_bytes(b"a\x00b\r\nc\x00\r")
    (data / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (data / "exact.txt").write_bytes(b"a" * CAP)
    (data / "over.txt").write_bytes(b"a" * (CAP + 1))
    (data / "split.txt").write_bytes(b"a" * (CAP - 1) + "é".encode() + b"tail")
    (data / "big.txt").write_bytes((b"0123456789abcdef" * 4 + b"\n") * 16384)
    (data / "weird name;rm -rf x").write_text("literal name\n")
    sib = root / "data2"
    sib.mkdir()
    (sib / "secret").write_text("secret\n")
    for d, _dirs, files in os.walk(root):
        os.chmod(d, 0o755)
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                os.chmod(p, 0o644)
    return data


def backend_for(kind: str, name: str, data: Path):
    """A backend over the fixture ``data``: ``"docker"`` (labelled ``name``; needs an engine: fails in CI,
    skips elsewhere), ``"local"`` (bubblewrap, required) or ``"local-nobwrap"`` (the explicit unsafe opt-in)."""
    from sandbox_server.backends import DockerBackend, LocalBackend

    if kind == "docker":
        require_docker()
        return DockerBackend(server_name=name, data_dir=data)
    return LocalBackend(data, server_name=name, unsafe_no_isolation=kind == "local-nobwrap")


def shared_service(kind: str, data: Path):
    """The session-wide started SandboxService of backend ``kind`` (``"local"``, ``"local-nobwrap"``,
    ``"docker"``; :func:`backend_for`) over ``data``: built on first use, shared by every test module until
    :func:`close_all`. The caller checks the backend's requirement first (:func:`require_docker`,
    :func:`require_bwrap`)."""
    from sandbox_server.service import SandboxService, ServiceConfig

    key = f"service-{kind}"
    with _lock:
        if key not in _cache:
            cfg = ServiceConfig(min_idle=4, max_total=40, max_concurrent_starts=2, default_timeout_s=5.0,
                                max_timeout_s=10.0, output_cap_bytes=CAP, acquire_timeout_s=30.0)
            backend = backend_for(kind, SERVER_NAME if kind == "docker" else f"{SERVER_NAME}-{kind}", data)
            _cache[key] = SandboxService(backend, cfg).start()
    return _cache[key]


def once(key: str, make, still_good=None):
    """``make()``'s result, made on the first call with ``key`` in this session and returned by every later one
    (an expensive step two test modules both need, e.g. a documented command whose output another module reads:
    ``tests.repo.test_docs_commands.run_before``); made again when ``still_good(result)`` says it is not."""
    with _lock:
        key = f"once:{key}"
        if key not in _cache or (still_good is not None and not still_good(_cache[key])):
            _cache[key] = make()
        return _cache[key]


def close_all() -> None:
    """Close every cached service and every in-process provider envs made by backend name (their
    containers are removed); a later :func:`shared_service` or ``shared_provider`` rebuilds them."""
    from sandbox_server.embedded import close_shared_providers

    with _lock:
        for key in [k for k in _cache if k.startswith("service-")]:
            _cache.pop(key).close()  # type: ignore[attr-defined]
    close_shared_providers()


def unisolated(service) -> bool:
    """Whether the service's backend runs its agents unisolated on the host (``local-nobwrap``)."""
    return not service.backend.isolated


def host_sh(service, sid: str, script: str, timeout_s: float = 10):
    """Run a trusted shell script in a sandbox (``exec_argv``: no whitelist). Sandbox paths ``/scratch`` and
    ``/tmp`` in ``script`` are written as the host folders when the backend is unisolated (its agent then
    runs in the host's mount namespace)."""
    if unisolated(service):
        sbdir = service.backend.state_dir / service._session(sid).sid
        script = script.replace("/scratch", str(sbdir / "scratch")).replace("/tmp", str(sbdir / "tmp"))
    return service.exec_argv(sid, ["sh", "-c", script], timeout_s=timeout_s)


def delete_quietly(service, *ids: str) -> None:
    """Delete sessions ``ids`` of ``service``, ignoring those already gone."""
    from sandbox_server.errors import SandboxNotFound

    for i in ids:
        try:
            service.delete(i)
        except SandboxNotFound:
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http_ok(url: str, timeout_s: float = 120.0, proc: subprocess.Popen | None = None,
                 log: Path | None = None) -> bool:
    """Poll ``GET url`` until it answers 200 (True) or ``timeout_s`` seconds pass (False). With ``proc``, a
    server process that exits meanwhile fails the test with the tail of ``log``."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            time.sleep(0.5)
        if proc is not None:
            assert proc.poll() is None, log.read_text()[-2000:] if log else f"the server exited ({proc.returncode})"
    return False


class UvicornThread:
    """A real uvicorn server on loopback in a background thread."""

    def __init__(self, app, port: int | None = None):
        import uvicorn

        self.port = port or free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> "UvicornThread":
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


class ServerProcess:
    """``python -m sandbox_server --backend B`` as a subprocess (as the README starts it), on a free port,
    with no ``FORKYARD_BACKEND`` in its environment: the flag alone decides."""

    def __init__(self, name: str, backend: str = "docker", **env: str):
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {k: v for k, v in os.environ.items() if k != "FORKYARD_BACKEND"}
        full_env.update({"FORKYARD_SERVER_NAME": name, "PYTHONPATH": str(ROOT), **env})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox_server", "--backend", backend, "--port", str(self.port),
             "--log-level", "warning"], env=full_env, cwd=ROOT)

    def pool(self) -> dict:
        return httpx.get(f"{self.url}/v1/pool", timeout=10).json()

    def wait_idle(self, idle: int, timeout_s: float = 90.0) -> dict:
        """Wait until the pool holds exactly ``idle`` idle sandboxes and nothing busy or starting."""
        deadline = time.monotonic() + timeout_s
        st: dict = {}
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the server exited"
            try:
                st = self.pool()
                if st["idle"] == idle and st["busy"] == 0 and st["starting"] == 0 and st["sessions"] == 0 \
                        and len(leftover_containers(self.name)) == idle:
                    return st
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"the server did not settle: {st}, containers {leftover_containers(self.name)}")

    def resources(self) -> dict:
        """Open file descriptors and threads of the server process."""
        fds = len(os.listdir(f"/proc/{self.proc.pid}/fd"))
        with open(f"/proc/{self.proc.pid}/status") as f:
            threads = next(int(line.split()[1]) for line in f if line.startswith("Threads:"))
        return {"fds": fds, "threads": threads}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def fake_bin(tmp_path: Path, bwrap_script: str | None) -> str:
    """A PATH holding the usual tools but with ``bwrap`` missing or replaced by ``bwrap_script``."""
    d = tmp_path / "bin"
    d.mkdir()
    for tool in ("sh", "cat", "python3"):
        exe = shutil.which(tool)
        if exe:
            os.symlink(exe, d / tool)
    if bwrap_script is not None:
        (d / "bwrap").write_text(bwrap_script)
        (d / "bwrap").chmod(0o755)
    return str(d)


#: Tool calls whose observations show a FileQA ``log_errors`` sandbox's state (:func:`answers`).
TOOL_CALLS = ["grep('ERROR', '/scratch/app.log')", "wc('/scratch/app.log')", "stat('/scratch/app.log')",
              "ls('/scratch', long=True)", "cat('/scratch/missing.txt')"]


def answers(env):
    """The observation text of each call of :data:`TOOL_CALLS` on ``env`` (a FileQA env), each taken on a
    fork, so the env itself stays at its turn."""
    out = []
    for action in TOOL_CALLS:
        child = env.fork(1)[0]
        try:
            out.append(child.step(action)[0])
        finally:
            child.close()
    return out
