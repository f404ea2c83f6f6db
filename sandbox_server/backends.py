"""Sandbox backends: one interface (:class:`Backend`), two implementations.

* :class:`DockerBackend`: a hardened container per sandbox (read-only root, ``network_mode=none``, all
  capabilities dropped, ``no-new-privileges``, a non-root user, pids / memory / CPU limits, tmpfs
  ``/scratch`` and ``/tmp``, the ``forkyard.sandbox`` label). The server talks to the container's agent
  through its attached stdio.
* :class:`LocalBackend`: no Docker; the same agent as a subprocess, under bubblewrap when it is installed
  (read-only bind of the data, private tmpfs ``/scratch`` and ``/tmp``, no network, own PID namespace),
  with only the agent's path-confinement checks otherwise. Much weaker than a container: see
  ``docs/sandbox.md``.

Every method blocks; callers on an event loop run them in worker threads. All sandbox ids are opaque
strings. Times are in seconds, sizes in bytes.
"""

from __future__ import annotations

import base64
import io
import hashlib
import itertools
import json
import os
import select
import shutil
import socket
import struct
import tarfile
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from sandbox_server.errors import AgentFailed, AgentTimeout, EngineUnavailable, SandboxNotFound
from sandbox_server.tools import READABLE_ROOTS, WRITABLE_AREAS, ToolResult

AGENT_PATH = Path(__file__).with_name("agent.py")
#: Label set on every forkyard sandbox container; its value is the server name (see ``server_name``).
LABEL = "forkyard.sandbox"
#: Seconds the server waits for an agent beyond the call's own timeout before declaring it hung.
AGENT_GRACE_S = 3.0


def agent_sha() -> str:
    """SHA-256 (hex, first 16) of agent.py + corpus.py: the sandbox image is rebuilt when it changes."""
    h = hashlib.sha256()
    for p in (AGENT_PATH, AGENT_PATH.with_name("corpus.py")):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


@runtime_checkable
class Backend(Protocol):
    """What the pool needs from a sandbox implementation."""

    name: str

    def create(self) -> str:
        """Start a sandbox and wait until its agent answers. Returns its id. Raises EngineUnavailable."""

    def exec(self, sid: str, argv: list[str], *, cwd: str = "/data", env: dict[str, str] | None = None,
             timeout_s: float = 10.0, cap_bytes: int = 65536, path_args: list[int] | None = None) -> ToolResult:
        """Run an already-validated argv in the sandbox. Raises AgentTimeout / AgentFailed / SandboxNotFound."""

    def snapshot(self, sid: str) -> bytes:
        """A tar (bytes) of the sandbox's writable areas (/scratch, /tmp)."""

    def restore(self, sid: str, data: bytes) -> None:
        """Replace the writable areas' contents with a tar made by :meth:`snapshot`."""

    def write_files(self, sid: str, files: dict[str, bytes]) -> None:
        """Write ``{relative path: bytes}`` under the sandbox's /scratch (the server's per-episode files)."""

    def destroy(self, sid: str) -> None:
        """Stop and remove the sandbox (idempotent)."""

    def cleanup_orphans(self) -> int:
        """Remove what an earlier run of this server left behind. Returns how many sandboxes were removed."""

    def close(self) -> None:
        """Destroy every sandbox of this backend and release its resources."""


class _Channel:
    """JSON lines over a byte stream to one agent; one request at a time (a lock serialises callers).

    ``recv(timeout_s) -> bytes`` returns available bytes (``b""`` at EOF, raises ``TimeoutError``);
    ``send(data)`` writes them. When ``demux`` is true the stream carries Docker's 8-byte frame headers.
    """

    def __init__(self, send: Callable[[bytes], None], recv: Callable[[float], bytes], demux: bool = False):
        self._send, self._recv, self._demux = send, recv, demux
        self._raw = bytearray()
        self._lines = bytearray()
        self._ids = itertools.count(1)
        self.lock = threading.Lock()
        self.broken = False

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        chunk = self._recv(left)
        if not chunk:
            raise EOFError
        if not self._demux:
            self._lines += chunk
            return
        self._raw += chunk
        while len(self._raw) >= 8:
            stream, length = self._raw[0], struct.unpack(">I", self._raw[4:8])[0]
            if len(self._raw) < 8 + length:
                break
            if stream == 1:
                self._lines += self._raw[8 : 8 + length]
            del self._raw[: 8 + length]

    def request(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request and wait (at most ``timeout_s`` seconds) for the answer with its id.

        Raises:
            AgentTimeout: no answer in time (the channel is then marked broken).
            AgentFailed: the stream closed or the channel is broken.
        """
        with self.lock:
            if self.broken:
                raise AgentFailed("the sandbox agent stopped answering earlier; the sandbox must be replaced")
            rid = next(self._ids)
            deadline = time.monotonic() + timeout_s
            try:
                self._send(json.dumps({**req, "id": rid}).encode() + b"\n")
                while True:
                    nl = self._lines.find(b"\n")
                    if nl < 0:
                        self._fill(deadline)
                        continue
                    line = bytes(self._lines[:nl])
                    del self._lines[: nl + 1]
                    try:
                        ans = json.loads(line)
                    except ValueError:
                        continue  # not an answer (stray output): skip it
                    if isinstance(ans, dict) and ans.get("id") == rid:
                        return ans
            except TimeoutError:
                self.broken = True
                raise AgentTimeout(f"the sandbox agent did not answer within {timeout_s:.1f} s") from None
            except (EOFError, OSError) as exc:
                self.broken = True
                raise AgentFailed(f"the sandbox agent's stream closed ({type(exc).__name__})") from None


def _empty_tar() -> bytes:
    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w").close()
    return buf.getvalue()


_EMPTY_TAR = _empty_tar()


class _AgentBackend:
    """Shared implementation of the agent protocol; subclasses start and stop the agent processes."""

    name = "agent"

    def __init__(self) -> None:
        self._channels: dict[str, _Channel] = {}
        self._mu = threading.Lock()

    def _channel(self, sid: str) -> _Channel:
        ch = self._channels.get(sid)
        if ch is None:
            raise SandboxNotFound(f"no sandbox {sid!r} in the {self.name} backend")
        return ch

    def _call(self, sid: str, req: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        ans = self._channel(sid).request(req, timeout_s)
        if "error" in ans:
            raise AgentFailed(f"agent: {ans['error']}")
        return ans

    def _ping(self, sid: str, timeout_s: float) -> None:
        self._call(sid, {"op": "ping"}, timeout_s)

    def _warm(self, sid: str) -> None:
        """Run the restore path once with an empty archive before the sandbox joins the pool: a fresh
        agent's first restore took 4.5 ms against 2.1 ms warm (docker, measured), and fork(4) restores
        into four fresh agents at once (19.7 ms -> 9.9 ms)."""
        self.restore(sid, _EMPTY_TAR)

    def exec(self, sid: str, argv: list[str], *, cwd: str = "/data", env: dict[str, str] | None = None,
             timeout_s: float = 10.0, cap_bytes: int = 65536, path_args: list[int] | None = None) -> ToolResult:
        """Run ``argv`` (already validated) in sandbox ``sid``; see :class:`Backend`.

        The agent enforces ``timeout_s``; this method waits ``timeout_s + AGENT_GRACE_S`` at most.
        Raises AgentTimeout if the agent does not answer by then, AgentFailed if it died.
        """
        ans = self._call(sid, {"op": "exec", "argv": argv, "cwd": cwd, "env": env or {}, "timeout_s": timeout_s,
                               "cap_bytes": cap_bytes, "path_args": path_args or []}, timeout_s + AGENT_GRACE_S)
        ans.pop("id", None)
        return ToolResult(**ans)

    def snapshot(self, sid: str) -> bytes:
        """Tar bytes of the writable areas. Raises AgentTimeout / AgentFailed."""
        return base64.b64decode(self._call(sid, {"op": "pack"})["data"])

    def restore(self, sid: str, data: bytes) -> None:
        """Replace the writable areas with the tar ``data``. Raises AgentTimeout / AgentFailed."""
        self._call(sid, {"op": "unpack", "data": base64.b64encode(data).decode("ascii")})

    def write_files(self, sid: str, files: dict[str, bytes]) -> None:
        """Write ``{relpath: bytes}`` under /scratch. Raises AgentFailed on a path outside /scratch."""
        self._call(sid, {"op": "write", "files": {k: base64.b64encode(v).decode("ascii") for k, v in files.items()}})

    def ps(self, sid: str) -> list[str]:
        """Command lines of the processes the sandbox's agent can see."""
        return self._call(sid, {"op": "ps"})["procs"]

    def alive(self, sid: str) -> bool:
        """Whether ``sid`` exists and its agent answers a ping within 2 s."""
        try:
            self._ping(sid, 2.0)
            return True
        except Exception:
            return False

    def ids(self) -> list[str]:
        """Ids of the sandboxes this backend instance runs."""
        return list(self._channels)

    def close(self) -> None:
        """Destroy every sandbox of this backend instance."""
        for sid in list(self._channels):
            try:
                self.destroy(sid)
            except Exception:
                pass


# ---------------------------------------------------------------------------------------------------
# Local backend


class LocalBackend(_AgentBackend):
    """Sandboxes as local agent subprocesses (the embedded default; no Docker needed).

    Args:
        data_dir: host directory shown read-only as ``/data`` (default: the corpus, see
            :func:`sandbox_server.corpus.ensure_corpus`).
        state_dir: where per-sandbox directories live (default ``~/.cache/forkyard/local/<server_name>``);
            emptied at start-up (:meth:`cleanup_orphans`).
        use_bwrap: ``None`` = use bubblewrap when ``bwrap`` is installed and works.
        server_name: names this server's state directory.
    """

    name = "local"

    def __init__(self, data_dir: str | os.PathLike | None = None, *, state_dir: str | os.PathLike | None = None,
                 use_bwrap: bool | None = None, server_name: str = "default"):
        super().__init__()
        if data_dir is None:
            from sandbox_server.corpus import ensure_corpus

            data_dir = ensure_corpus()
        self.data_dir = os.path.realpath(data_dir)
        self.state_dir = Path(state_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
                              / "forkyard" / "local" / server_name)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.use_bwrap = _bwrap_works() if use_bwrap is None else use_bwrap
        self._procs: dict[str, subprocess.Popen] = {}

    def _argv(self, sbdir: Path) -> list[str]:
        agent_args = ["--readable", "/data", "--readable", "/scratch", "--writable", "/scratch", "--writable", "/tmp"]
        if not self.use_bwrap:
            roots = {"/data": self.data_dir, "/scratch": str(sbdir / "scratch"), "/tmp": str(sbdir / "tmp")}
            return [sys.executable, "-u", "-I", str(AGENT_PATH), *agent_args,
                    *itertools.chain.from_iterable(("--root", f"{k}={v}") for k, v in roots.items())]
        py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)
        argv = ["bwrap", "--ro-bind", "/usr", "/usr"]
        for d in ("/bin", "/lib", "/lib64", "/sbin"):
            if os.path.islink(d):
                argv += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                argv += ["--ro-bind", d, d]
        if not py.startswith("/usr/"):
            prefix = os.path.realpath(sys.base_prefix)
            argv += ["--ro-bind", prefix, prefix]
        argv += ["--ro-bind", self.data_dir, "/data", "--tmpfs", "/scratch", "--tmpfs", "/tmp",
                 "--ro-bind", str(AGENT_PATH), "/opt/forkyard/agent.py", "--proc", "/proc", "--dev", "/dev",
                 "--unshare-all", "--die-with-parent", "--clearenv",
                 "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--chdir", "/data",
                 py, "-u", "-I", "/opt/forkyard/agent.py", *agent_args]
        return argv

    def create(self) -> str:
        """Start an agent subprocess; returns its sandbox id once it answers (5 s at most).

        Raises:
            EngineUnavailable: the agent could not start or did not answer.
        """
        sid = "l-" + uuid.uuid4().hex[:12]
        sbdir = self.state_dir / sid
        (sbdir / "scratch").mkdir(parents=True)
        (sbdir / "tmp").mkdir()
        try:
            proc = subprocess.Popen(self._argv(sbdir), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, cwd=sbdir, start_new_session=True, bufsize=0,
                                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        except OSError as exc:
            shutil.rmtree(sbdir, ignore_errors=True)
            raise EngineUnavailable(f"could not start a local sandbox agent: {exc}") from None
        fd = proc.stdout.fileno()

        def recv(timeout_s: float) -> bytes:
            r, _, _ = select.select([fd], [], [], timeout_s)
            if not r:
                raise TimeoutError
            return os.read(fd, 1 << 20)

        def send(data: bytes) -> None:
            proc.stdin.write(data)

        with self._mu:
            self._procs[sid] = proc
            self._channels[sid] = _Channel(send, recv)
        try:
            self._ping(sid, 5.0)
            self._warm(sid)
        except Exception as exc:
            self.destroy(sid)
            raise EngineUnavailable(f"local sandbox agent did not answer: {exc}") from None
        return sid

    def pid(self, sid: str) -> int:
        """Host pid of the sandbox's agent (or of bubblewrap around it)."""
        return self._procs[sid].pid

    def destroy(self, sid: str) -> None:
        """Kill the agent and its process group and remove the sandbox directory (idempotent)."""
        with self._mu:
            proc = self._procs.pop(sid, None)
            self._channels.pop(sid, None)
        if proc is not None:
            try:
                os.killpg(proc.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        shutil.rmtree(self.state_dir / sid, ignore_errors=True)

    def cleanup_orphans(self) -> int:
        """Remove sandbox directories an earlier run left (their agents exit on stdin EOF). Returns the count."""
        n = 0
        for d in self.state_dir.iterdir():
            if d.name.startswith("l-") and d.name not in self._procs:
                shutil.rmtree(d, ignore_errors=True)
                n += 1
        return n


_BWRAP_OK: bool | None = None


def _bwrap_works() -> bool:
    global _BWRAP_OK
    if _BWRAP_OK is None:
        exe = shutil.which("bwrap")
        _BWRAP_OK = bool(exe) and subprocess.run(
            [exe, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
            capture_output=True, timeout=10).returncode == 0
    return _BWRAP_OK


# ---------------------------------------------------------------------------------------------------
# Docker backend


class DockerBackend(_AgentBackend):
    """Sandboxes as hardened Docker containers whose main process is the agent.

    Args:
        image: the sandbox image (``docker/sandbox.Dockerfile``; default ``forkyard-sandbox:latest``).
        server_name: value of the ``forkyard.sandbox`` label; :meth:`cleanup_orphans` removes containers
            with the same value, so two servers sharing an engine need different names.
        data_dir: optional host directory bind-mounted read-only over ``/data`` (default: the image's corpus).
        mem_limit / pids_limit / nano_cpus / tmpfs_size: resource limits (``"256m"``, processes, 1e9 = one CPU,
            ``"16m"``).
        engine_timeout_s: deadline of every engine API call, in seconds.
        base_url: engine address (default ``DOCKER_HOST`` or the local socket).
    """

    name = "docker"

    def __init__(self, image: str = "forkyard-sandbox:latest", *, server_name: str = "default",
                 data_dir: str | os.PathLike | None = None, user: str = "1000:1000", mem_limit: str = "256m",
                 pids_limit: int = 128, nano_cpus: int = 1_000_000_000, tmpfs_size: str = "16m",
                 engine_timeout_s: float = 30.0, base_url: str | None = None):
        super().__init__()
        import docker

        self.image = image
        self.server_name = server_name
        self.data_dir = os.path.realpath(data_dir) if data_dir else None
        self.user = user
        self.limits = dict(mem_limit=mem_limit, pids_limit=pids_limit, nano_cpus=nano_cpus)
        self.tmpfs_size = tmpfs_size
        kw: dict[str, Any] = dict(timeout=int(engine_timeout_s), max_pool_size=64)
        try:
            self.client = docker.DockerClient(base_url=base_url, **kw) if base_url else docker.from_env(**kw)
            self.client.ping()
        except Exception as exc:
            raise EngineUnavailable(f"the Docker engine does not answer: {exc}") from None
        self._containers: dict[str, Any] = {}
        self._socks: dict[str, Any] = {}

    def run_kwargs(self) -> dict[str, Any]:
        """The hardened ``containers.create`` arguments (also used by the benchmarks' naive baseline)."""
        uid, _, gid = self.user.partition(":")
        tmpfs_opts = f"rw,nosuid,nodev,size={self.tmpfs_size},uid={uid},gid={gid or uid},mode=0755"
        kw: dict[str, Any] = dict(
            read_only=True, network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"],
            user=self.user, tmpfs={"/scratch": tmpfs_opts, "/tmp": tmpfs_opts}, init=True,
            labels={LABEL: self.server_name}, working_dir="/data", **self.limits,
        )
        if self.data_dir:
            kw["volumes"] = {self.data_dir: {"bind": "/data", "mode": "ro"}}
        return kw

    def create(self) -> str:
        """Create, start and attach to a container; returns its sandbox id once the agent answers.

        Raises:
            EngineUnavailable: the engine refused or did not answer (missing image included).
        """
        import docker.errors

        try:
            c = self.client.containers.create(
                self.image, command=["python3", "-u", "-I", "/opt/forkyard/agent.py"], stdin_open=True, tty=False,
                detach=True, **self.run_kwargs())
        except docker.errors.ImageNotFound:
            raise EngineUnavailable(f"sandbox image {self.image!r} is missing (scripts/build-images.sh builds it)") from None
        except Exception as exc:
            raise EngineUnavailable(f"the Docker engine refused to create a sandbox: {exc}") from None
        sid = "d-" + c.id[:12]
        try:
            c.start()
            sock = self.client.api.attach_socket(c.id, params={"stdin": 1, "stdout": 1, "stream": 1})
            raw: socket.socket = getattr(sock, "_sock", sock)
            raw.setblocking(True)

            def recv(timeout_s: float) -> bytes:
                r, _, _ = select.select([raw], [], [], timeout_s)
                if not r:
                    raise TimeoutError
                return raw.recv(1 << 20)

            with self._mu:
                self._containers[sid] = c
                self._socks[sid] = sock
                self._channels[sid] = _Channel(raw.sendall, recv, demux=True)
            self._ping(sid, 15.0)
            self._warm(sid)
        except Exception as exc:
            self.destroy(sid)
            try:
                c.remove(force=True)
            except Exception:
                pass
            raise EngineUnavailable(f"sandbox container did not come up: {exc}") from None
        return sid

    def container(self, sid: str) -> Any:
        """The docker SDK container object of sandbox ``sid``. Raises SandboxNotFound."""
        try:
            return self._containers[sid]
        except KeyError:
            raise SandboxNotFound(f"no sandbox {sid!r} in the docker backend") from None

    def destroy(self, sid: str) -> None:
        """Remove the container (force) and close its stream (idempotent)."""
        with self._mu:
            c = self._containers.pop(sid, None)
            sock = self._socks.pop(sid, None)
            self._channels.pop(sid, None)
        if sock is not None:
            try:
                sock.close()
            except Exception:
                pass
        if c is not None:
            try:
                c.remove(force=True)
            except Exception:
                pass

    def cleanup_orphans(self) -> int:
        """Remove every container labelled ``forkyard.sandbox=<server_name>`` not run by this instance."""
        n = 0
        for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.server_name}"}):
            if "d-" + c.id[:12] in self._containers:
                continue
            try:
                c.remove(force=True)
                n += 1
            except Exception:
                pass
        return n

    def close(self) -> None:
        """Remove every container of this instance and close the engine client."""
        super().close()
        try:
            self.client.close()
        except Exception:
            pass


def make_backend(kind: str = "local", **kwargs: Any) -> Backend:
    """Build a backend by name: ``"local"`` or ``"docker"`` (keyword arguments go to its constructor)."""
    if kind == "local":
        return LocalBackend(**kwargs)
    if kind == "docker":
        return DockerBackend(**kwargs)
    raise ValueError(f"unknown backend {kind!r}; choose local or docker")
