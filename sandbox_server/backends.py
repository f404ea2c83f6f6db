"""Sandbox backends: one interface (:class:`Backend`), two implementations.

* :class:`DockerBackend`: a hardened container per sandbox (read-only root, ``network_mode=none``, all
  capabilities dropped, ``no-new-privileges``, a non-root user, pids / memory / CPU limits, tmpfs
  ``/scratch`` and ``/tmp``, the ``forkyard.sandbox`` label). The server talks to the container's agent
  through its attached stdio.
* :class:`LocalBackend`: no Docker; the same agent as a subprocess under bubblewrap (read-only bind of
  the data, private 16 MiB tmpfs ``/scratch`` and ``/tmp`` mounted ``noexec``, no network, own PID
  namespace, no capabilities). It refuses to start without a working ``bwrap``
  (:class:`~sandbox_server.errors.IsolationUnavailable`) unless built with ``unsafe_no_isolation=True``:
  then tools run as host processes with only the agent's path checks, the session-environment allow-list
  and (where the kernel has Landlock) a ban on executing anything outside the system directories.
  Weaker than a container either way: see ``docs/sandbox.md``.

Every sandbox's agent answers in sandbox paths only (``/data``, ``/scratch``, ``/tmp``): host paths are
written back before any output or message leaves it. Two servers or processes on one machine never touch
each other's sandboxes: local state lives in a folder per backend instance, and orphan clean-up removes
only what a dead process left (see :meth:`LocalBackend.cleanup_orphans`, :meth:`DockerBackend.cleanup_orphans`).

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
import re
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

from sandbox_server.agent import AREA_BYTES, MAX_AREA_ENTRIES, MAX_WRITE_FILES, PAGE_BYTES
from sandbox_server.errors import (AgentFailed, AgentTimeout, EngineUnavailable, IsolationUnavailable, LimitExceeded,
                                   SandboxNotFound, SnapshotUnsupported)
from sandbox_server.tools import ToolRefused, ToolResult

AGENT_PATH = Path(__file__).with_name("agent.py")
#: Label set on every forkyard sandbox container; its value is the server name (see ``server_name``).
LABEL = "forkyard.sandbox"
#: Labels naming the process that owns a container: machine (boot id + PID namespace), pid, process
#: start time (clock ticks since boot) and a random id of the backend instance.
OWNER_LABELS = ("forkyard.owner.machine", "forkyard.owner.pid", "forkyard.owner.start", "forkyard.owner.instance")
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
    #: True when every sandbox runs isolated from the host (container, or bubblewrap namespaces).
    isolated: bool

    def describe(self) -> str:
        """One line naming the backend and its isolation mode (for logs, ``/healthz`` and errors)."""

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
        """Write ``{relative path: bytes}`` under the sandbox's /scratch (the server's per-episode files).
        Raises LimitExceeded past a limit (nothing of the write is kept)."""

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


def check_write_limits(files: dict[str, bytes], area_bytes: int = AREA_BYTES) -> None:
    """Refuse, before any sandbox is touched, a write that cannot fit whatever the area already holds.

    Checks :data:`~sandbox_server.agent.MAX_WRITE_FILES` files per write and the bytes the files take in
    whole :data:`~sandbox_server.agent.PAGE_BYTES` pages against ``area_bytes`` (default 16 MiB). The agent
    checks again against what /scratch holds at the time of the write.

    Raises:
        LimitExceeded: naming the limit (HTTP 413).
    """
    if len(files) > MAX_WRITE_FILES:
        raise LimitExceeded(f"{len(files)} files in one write; the limit is {MAX_WRITE_FILES} files per write; "
                            "nothing was written")
    need = sum(-(-len(v) // PAGE_BYTES) * PAGE_BYTES for v in files.values())
    if need > area_bytes:
        raise LimitExceeded(f"the files need {need} bytes in /scratch ({need / (1 << 20):g} MiB in {PAGE_BYTES}-byte "
                            f"pages); /scratch holds at most {area_bytes} bytes ({area_bytes / (1 << 20):g} MiB); "
                            "nothing was written")


def _empty_tar() -> bytes:
    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w").close()
    return buf.getvalue()


_EMPTY_TAR = _empty_tar()


class _AgentBackend:
    """Shared implementation of the agent protocol; subclasses start and stop the agent processes."""

    name = "agent"
    isolated = False

    def describe(self) -> str:
        """The backend's name and isolation mode in words."""
        return self.name

    def __init__(self) -> None:
        self._channels: dict[str, _Channel] = {}
        self._mu = threading.Lock()

    def _channel(self, sid: str) -> _Channel:
        ch = self._channels.get(sid)
        if ch is None:
            raise SandboxNotFound(f"no sandbox {sid!r} in the {self.name} backend")
        return ch

    def _call(self, sid: str, req: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        """Send one request; map the agent's error answers by ``error_kind``.

        Raises:
            LimitExceeded: ``limit`` (a documented limit; nothing was written).
            ToolRefused: ``refused`` (a bad request; nothing was done).
            SnapshotUnsupported: ``unsupported`` (a FIFO, socket or device in a writable area).
            IsolationUnavailable: ``isolation`` (the sandbox could not be confined; it serves nothing).
            AgentFailed: any other error, a closed stream; AgentTimeout: no answer in ``timeout_s`` seconds.
        """
        ans = self._channel(sid).request(req, timeout_s)
        if "error" in ans:
            kind, msg = ans.get("error_kind"), str(ans["error"])
            if kind == "limit":
                raise LimitExceeded(msg)
            if kind == "refused":
                raise ToolRefused(msg)
            if kind == "unsupported":
                raise SnapshotUnsupported(msg)
            if kind == "isolation":
                raise IsolationUnavailable(msg)
            raise AgentFailed(f"agent: {msg}")
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
        """PAX tar bytes of the writable areas: files, directories, symbolic links and hard links with their
        modes and modification times (ns).

        Raises:
            SnapshotUnsupported: a FIFO, socket or device is in /scratch or /tmp (the message names it).
            AgentTimeout / AgentFailed.
        """
        return base64.b64decode(self._call(sid, {"op": "pack"})["data"])

    def restore(self, sid: str, data: bytes) -> None:
        """Replace the writable areas with the tar ``data`` (made by :meth:`snapshot`).

        Raises:
            LimitExceeded: it would pass an area's limits (nothing changed).
            ToolRefused: a member outside the writable areas, or written through a symbolic link.
            AgentTimeout / AgentFailed.
        """
        self._call(sid, {"op": "unpack", "data": base64.b64encode(data).decode("ascii")})

    def write_files(self, sid: str, files: dict[str, bytes]) -> None:
        """Write ``{relpath: bytes}`` under /scratch (mode 0644), all or nothing.

        Limits: :data:`~sandbox_server.agent.MAX_WRITE_FILES` files per write; /scratch holds at most
        :data:`~sandbox_server.agent.AREA_BYTES` bytes (16 MiB; each file counted in whole 4 KiB pages) and
        :data:`~sandbox_server.agent.MAX_AREA_ENTRIES` entries. A write that fails keeps none of its files.

        Raises:
            LimitExceeded: a limit would be passed, or the area filled up (nothing of the write kept).
            ToolRefused: a path outside /scratch, through a symbolic link, or onto a directory.
            AgentTimeout / AgentFailed.
        """
        self._call(sid, {"op": "write", "files": {k: base64.b64encode(v).decode("ascii") for k, v in files.items()}})

    def confinement(self, sid: str) -> dict[str, Any]:
        """How the sandbox's agent is confined (its ping answer's ``confinement``: ``noexec`` areas,
        ``caps_dropped``, ``landlock_abi``)."""
        return self._call(sid, {"op": "ping"}).get("confinement") or {}

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


def default_state_root() -> Path:
    """Where local sandboxes live: ``$XDG_CACHE_HOME/forkyard/local`` (default ``~/.cache/forkyard/local``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "forkyard" / "local"


def machine_id() -> str:
    """Identifies this kernel boot and PID namespace: pids recorded under another id cannot be checked here."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = socket.gethostname()
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{boot}:{ns}"


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` (clock ticks after boot, ``/proc/<pid>/stat`` field 22), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_record() -> dict[str, Any]:
    """This process as an owner of sandboxes: ``{"machine", "pid", "start"}``."""
    return {"machine": machine_id(), "pid": os.getpid(), "start": process_start(os.getpid())}


def owner_alive(owner: dict[str, Any]) -> bool:
    """Whether the process an owner record names may still run. Owners on another machine or in another
    PID namespace cannot be checked from here and count as alive (never removed by mistake)."""
    if owner.get("machine") and owner["machine"] != machine_id():
        return True
    try:
        pid = int(owner["pid"])
    except (KeyError, TypeError, ValueError):
        return True
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = owner.get("start")
    if start is not None:
        now = process_start(pid)
        if now is not None and str(now) != str(start):
            return False  # the pid was reused by another process
    return True


def _safe_name(name: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:100]
    return out if out.strip(".") else "_" + out


_BWRAP: dict[tuple, str | None] = {}
_BWRAP_LOCK = threading.Lock()


def bwrap_problem(argv: list[str]) -> str | None:
    """Run ``argv`` (a bubblewrap command ending in the agent's ``--probe``) once per distinct command; None
    when it works, else why not (cached for the process)."""
    key = tuple(argv)
    with _BWRAP_LOCK:
        if key not in _BWRAP:
            try:
                r = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
                                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
                if r.returncode == 0 and b'"pong": true' in r.stdout:
                    _BWRAP[key] = None
                else:
                    detail = (r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")).strip()
                    _BWRAP[key] = f"bwrap exited with {r.returncode}: {detail[-500:]}"
            except (OSError, subprocess.SubprocessError) as exc:
                _BWRAP[key] = f"bwrap could not run: {exc}"
        return _BWRAP[key]


def _bwrap_has_size(exe: str) -> bool:
    try:
        return "--size" in subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False


INSTALL_HINT = ("install bubblewrap (`apt-get install bubblewrap`; `make run` and `make test` do it through "
                "scripts/ensure-bwrap.sh), or accept unisolated sandboxes explicitly: "
                "LocalBackend(unsafe_no_isolation=True) (server: --unsafe-no-isolation)")


class LocalBackend(_AgentBackend):
    """Sandboxes as local agent subprocesses (the embedded default; no Docker needed), isolated by bubblewrap.

    Args:
        data_dir: host directory shown read-only as ``/data`` (default: the corpus, see
            :func:`sandbox_server.corpus.ensure_corpus`).
        state_dir: base folder of local sandbox state (default :func:`default_state_root`). This instance
            keeps its sandboxes in ``<state_dir>/<server_name>/<pid>-<random>/`` (:attr:`state_dir` after
            construction), with an ``owner.json`` naming this process; :meth:`close` removes the folder
            (and the server-name folder when it is left empty).
        unsafe_no_isolation: run the agents as plain host processes, without bubblewrap: tools then run as
            the server's user, limited only by the agent's path checks, the session-environment allow-list
            and Landlock where the kernel has it. Off by default; only this explicit flag allows it.
        server_name: names the folder of this server's instances.
        area_bytes: size of each writable area (/scratch, /tmp), in bytes (default 16 MiB).

    Raises:
        IsolationUnavailable: bubblewrap is missing or does not work here and ``unsafe_no_isolation`` is
            false (the message says how to install it). Never falls back silently.
    """

    name = "local"

    def __init__(self, data_dir: str | os.PathLike | None = None, *, state_dir: str | os.PathLike | None = None,
                 unsafe_no_isolation: bool = False, server_name: str = "default", area_bytes: int = AREA_BYTES):
        super().__init__()
        if not isinstance(unsafe_no_isolation, bool):
            raise TypeError("unsafe_no_isolation must be True or False")
        if data_dir is None:
            from sandbox_server.corpus import ensure_corpus

            data_dir = ensure_corpus()
        self.data_dir = os.path.realpath(data_dir)
        self.unsafe_no_isolation = unsafe_no_isolation
        self.area_bytes = int(area_bytes)
        self.server_name = server_name
        self._bwrap = shutil.which("bwrap")
        self._bwrap_size = False
        if not unsafe_no_isolation:
            if not self._bwrap:
                raise IsolationUnavailable(f"the local backend needs bubblewrap and `bwrap` is not installed: {INSTALL_HINT}")
            self._bwrap_size = _bwrap_has_size(self._bwrap)
            problem = bwrap_problem(self._argv(None, probe=True))
            if problem:
                raise IsolationUnavailable(f"the local backend needs bubblewrap and it does not work here ({problem}): "
                                           f"{INSTALL_HINT}")
        self.server_dir = Path(state_dir or default_state_root()) / _safe_name(server_name)
        self.state_dir = self.server_dir / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.state_dir.mkdir(parents=True)  # parents: another process may just have removed an empty server folder
        tmp = self.state_dir / ".owner.json.tmp"
        tmp.write_text(json.dumps({**owner_record(), "server_name": server_name, "created_at": time.time()}))
        os.replace(tmp, self.state_dir / "owner.json")
        self._procs: dict[str, subprocess.Popen] = {}
        self._closed = False

    @property
    def isolated(self) -> bool:  # type: ignore[override]
        """True under bubblewrap; False only when built with ``unsafe_no_isolation=True``."""
        return not self.unsafe_no_isolation

    @property
    def isolation(self) -> str:
        """``"bubblewrap"`` or ``"none (unsafe)"``."""
        return "none (unsafe)" if self.unsafe_no_isolation else "bubblewrap"

    def describe(self) -> str:
        """The backend and its isolation mode in words."""
        if self.unsafe_no_isolation:
            return ("local, UNSAFE: no isolation (unsafe_no_isolation=True): tools run as host processes of the "
                    "server's user, confined only by path checks, the environment allow-list and Landlock")
        return ("local, isolated by bubblewrap: read-only /data, private noexec tmpfs /scratch and /tmp, "
                "no network, own PID and user namespaces, no capabilities")

    def _agent_args(self) -> list[str]:
        return ["--readable", "/data", "--readable", "/scratch", "--writable", "/scratch", "--writable", "/tmp",
                "--area-bytes", str(self.area_bytes), "--max-write-files", str(MAX_WRITE_FILES),
                "--max-area-entries", str(MAX_AREA_ENTRIES)]

    def _argv(self, sbdir: Path | None, probe: bool = False) -> list[str]:
        agent_args = self._agent_args() + (["--probe"] if probe else [])
        if self.unsafe_no_isolation:
            assert sbdir is not None
            roots = {"/data": self.data_dir, "/scratch": str(sbdir / "scratch"), "/tmp": str(sbdir / "tmp")}
            return [sys.executable, "-u", "-I", str(AGENT_PATH), *agent_args,
                    *itertools.chain.from_iterable(("--root", f"{k}={v}") for k, v in roots.items())]
        py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)
        argv = [self._bwrap or "bwrap", "--ro-bind", "/usr", "/usr"]
        for d in ("/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin"):
            if os.path.islink(d):
                argv += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                argv += ["--ro-bind", d, d]
        if not py.startswith("/usr/"):
            prefix = os.path.realpath(sys.base_prefix)
            argv += ["--ro-bind", prefix, prefix]
        size = ["--size", str(self.area_bytes)] if self._bwrap_size else []
        argv += ["--ro-bind", self.data_dir, "/data", *size, "--tmpfs", "/scratch", *size, "--tmpfs", "/tmp",
                 "--ro-bind", str(AGENT_PATH), "/opt/forkyard/agent.py", "--proc", "/proc", "--dev", "/dev",
                 "--unshare-all", "--die-with-parent", "--clearenv",
                 "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--chdir", "/data",
                 py, "-u", "-I", "/opt/forkyard/agent.py", "--confine", *agent_args]
        return argv

    def create(self) -> str:
        """Start an agent subprocess; returns its sandbox id once it answers (5 s at most).

        Raises:
            IsolationUnavailable: the sandbox could not be confined.
            EngineUnavailable: the agent could not start or did not answer (or the backend is closed).
        """
        if self._closed:
            raise EngineUnavailable("the local backend is closed")
        sid = "l-" + uuid.uuid4().hex[:12]
        sbdir = self.state_dir / sid
        for d in (sbdir, sbdir / "scratch", sbdir / "tmp"):
            d.mkdir(mode=0o755)
            os.chmod(d, 0o755)
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
        except IsolationUnavailable:
            self.destroy(sid)
            raise
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
        if sid.startswith("l-") and "/" not in sid:
            shutil.rmtree(self.state_dir / sid, ignore_errors=True)

    def cleanup_orphans(self) -> int:
        """Remove what dead processes left; never touch a live process's sandboxes. Returns the sandbox count.

        Looks at every instance folder ``<state root>/<any server name>/<pid>-<random>`` but this one and
        removes it when its ``owner.json`` names a process that is gone (pid not running, or reused by a
        process with another start time). Folders of owners on another machine or PID namespace are kept.
        Sandbox folders of the old flat layout (``<server_name>/l-*``) are removed when no process has its
        working directory in them. Server-name folders left empty are removed too.
        """
        n = 0
        root = self.server_dir.parent
        for sdir in sorted(root.iterdir()) if root.is_dir() else []:
            if sdir.is_symlink() or not sdir.is_dir():
                continue
            for inst in sorted(sdir.iterdir()):
                if inst == self.state_dir or inst.is_symlink() or not inst.is_dir():
                    continue
                if inst.name.startswith("l-"):
                    if sdir == self.server_dir and not _dir_in_use(inst):
                        shutil.rmtree(inst, ignore_errors=True)
                        n += 1
                    continue
                m = re.fullmatch(r"(\d+)-[0-9a-f]+", inst.name)
                if not m:
                    continue
                try:
                    owner = json.loads((inst / "owner.json").read_text())
                    if not isinstance(owner, dict):
                        raise ValueError
                except (OSError, ValueError):
                    owner = {"pid": int(m.group(1))}  # being created right now, or a crash before the record
                if owner_alive(owner):
                    continue
                n += sum(1 for d in inst.iterdir() if d.name.startswith("l-"))
                shutil.rmtree(inst, ignore_errors=True)
            if sdir != self.server_dir:
                try:
                    sdir.rmdir()  # only when empty
                except OSError:
                    pass
        return n

    def close(self) -> None:
        """Destroy every sandbox of this instance and remove its state folder (idempotent)."""
        self._closed = True
        super().close()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        try:
            self.server_dir.rmdir()  # only when no other instance of this server name is left
        except OSError:
            pass


def _dir_in_use(path: Path) -> bool:
    """Whether any process (that we may inspect) has its working directory at or under ``path``."""
    target = os.path.realpath(path)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == target or cwd.startswith(target + "/"):
            return True
    return False


# ---------------------------------------------------------------------------------------------------
# Docker backend


def _close_attach_socket(sock: Any) -> None:
    """Close the stream docker-py's ``attach_socket`` returned, and its descriptor now.

    That object is a ``SocketIO`` made by the HTTP response's ``makefile``, so closing it alone leaves the
    real socket open (the response still references it) until the garbage collector runs: one descriptor
    per destroyed sandbox, measured +4 per round of 4 containers. Closing the response, the socket and
    the ``SocketIO`` releases it at once.
    """
    for part in (getattr(sock, "_response", None), getattr(sock, "_sock", None), sock):
        if part is None:
            continue
        try:
            part.close()
        except Exception:  # noqa: BLE001 - already closed, or the engine went away: nothing left to free
            pass


class DockerBackend(_AgentBackend):
    """Sandboxes as hardened Docker containers whose main process is the agent.

    Args:
        image: the sandbox image (``docker/sandbox.Dockerfile``; default ``forkyard-sandbox:latest``).
        server_name: value of the ``forkyard.sandbox`` label; :meth:`cleanup_orphans` looks only at
            containers with the same value, and removes only those whose owning process is gone.
        data_dir: optional host directory bind-mounted read-only over ``/data`` (default: the image's corpus).
        mem_limit / pids_limit / nano_cpus / tmpfs_size: resource limits (``"256m"``, processes, 1e9 = one CPU,
            ``"16m"`` = 16 MiB per writable area, mounted ``noexec``).
        engine_timeout_s: deadline of every engine API call, in seconds.
        base_url: engine address (default ``DOCKER_HOST`` or the local socket).
    """

    name = "docker"
    isolated = True

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
        self.area_bytes = _parse_size(tmpfs_size)
        self.instance = uuid.uuid4().hex
        self._owner = owner_record()
        kw: dict[str, Any] = dict(timeout=int(engine_timeout_s), max_pool_size=64)
        try:
            self.client = docker.DockerClient(base_url=base_url, **kw) if base_url else docker.from_env(**kw)
            self.client.ping()
        except Exception as exc:
            raise EngineUnavailable(f"the Docker engine does not answer: {exc}") from None
        self._containers: dict[str, Any] = {}
        self._socks: dict[str, Any] = {}

    def describe(self) -> str:
        """The backend and its isolation mode in words."""
        return (f"docker ({self.image}): read-only root, no network, no capabilities, user {self.user}, "
                f"noexec tmpfs /scratch and /tmp of {self.tmpfs_size}")

    def labels(self) -> dict[str, str]:
        """Labels of this instance's containers: ``forkyard.sandbox=<server_name>`` and the owner labels."""
        o = self._owner
        return {LABEL: self.server_name, OWNER_LABELS[0]: str(o["machine"]), OWNER_LABELS[1]: str(o["pid"]),
                OWNER_LABELS[2]: str(o["start"]), OWNER_LABELS[3]: self.instance}

    def run_kwargs(self) -> dict[str, Any]:
        """The hardened ``containers.create`` arguments (also used by the benchmarks' naive baseline)."""
        uid, _, gid = self.user.partition(":")
        tmpfs_opts = f"rw,noexec,nosuid,nodev,size={self.tmpfs_size},uid={uid},gid={gid or uid},mode=0755"
        kw: dict[str, Any] = dict(
            read_only=True, network_mode="none", cap_drop=["ALL"], security_opt=["no-new-privileges"],
            user=self.user, tmpfs={"/scratch": tmpfs_opts, "/tmp": tmpfs_opts}, init=True,
            labels=self.labels(), working_dir="/data", **self.limits,
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
            # detach=False makes docker-py set StdinOnce: when this server's attach stream closes (it exited or
            # was killed), the agent reads EOF and the container exits, so orphans are told by their status.
            c = self.client.containers.create(
                self.image, command=["python3", "-u", "-I", "/opt/forkyard/agent.py", "--area-bytes",
                                     str(self.area_bytes), "--max-write-files", str(MAX_WRITE_FILES),
                                     "--max-area-entries", str(MAX_AREA_ENTRIES)],
                stdin_open=True, tty=False, detach=False, **self.run_kwargs())
        except docker.errors.ImageNotFound:
            raise EngineUnavailable(f"sandbox image {self.image!r} is missing (scripts/build-images.sh builds it)") from None
        except Exception as exc:
            raise EngineUnavailable(f"the Docker engine refused to create a sandbox: {exc}") from None
        sid = "d-" + c.id[:12]
        if getattr(self, "_closed", False):  # closed while the engine made it: nobody would remove it
            try:
                c.remove(force=True)
            except Exception:  # noqa: BLE001 - close() sweeps this instance's label too
                pass
            raise EngineUnavailable("the docker backend was closed while a sandbox was being made")
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
            _close_attach_socket(sock)
        if c is not None:
            try:
                c.remove(force=True)
            except Exception:
                pass

    def cleanup_orphans(self) -> int:
        """Remove containers labelled ``forkyard.sandbox=<server_name>`` whose owner is gone. Returns the count.

        Never removes this instance's containers nor a live process's. A container is an orphan when:
        it has no owner labels (made before they existed); or its owner ran on this machine and PID
        namespace and that process is gone (pid not running, or reused: another start time); or its owner
        is elsewhere (another PID namespace, e.g. a server in a container) and the container is no longer
        running (its agent exits when the owner's attach stream closes) or was created over a minute ago
        and never started.
        """
        n = 0
        me = machine_id()
        for c in self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.server_name}"}):
            if "d-" + c.id[:12] in self._containers:
                continue
            labels = c.labels or {}
            inst = labels.get(OWNER_LABELS[3])
            if inst == self.instance:
                continue
            if inst is None:
                orphan = True
            elif labels.get(OWNER_LABELS[0]) == me:
                orphan = not owner_alive({"machine": me, "pid": labels.get(OWNER_LABELS[1]),
                                          "start": labels.get(OWNER_LABELS[2]) or None})
            else:
                orphan = c.status in ("exited", "dead") or (c.status == "created" and _age_s(c) > 60)
            if not orphan:
                continue
            try:
                c.remove(force=True)
                n += 1
            except Exception:
                pass
        return n

    def close(self) -> None:
        """Remove every container of this instance (those a create still in flight made included: they
        carry this instance's label) and close the engine client."""
        self._closed = True
        super().close()
        try:
            for c in self.client.containers.list(all=True, sparse=True,
                                                 filters={"label": f"{OWNER_LABELS[3]}={self.instance}"}):
                try:
                    c.remove(force=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        except Exception:  # noqa: BLE001 - the engine went away: nothing more to remove here
            pass
        try:
            self.client.close()
        except Exception:
            pass


def _parse_size(text: str | int) -> int:
    """Bytes of a size such as ``"16m"`` (k, m, g: powers of 1024, as the kernel reads tmpfs sizes)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([kmgKMG]?)[bB]?\s*", str(text))
    if not m:
        raise ValueError(f"cannot read the size {text!r}; use bytes or a number with k, m or g")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def _age_s(c: Any) -> float:
    """Seconds since a container was created (0 when unknown)."""
    import datetime

    try:
        created = datetime.datetime.strptime(str(c.attrs["Created"])[:19], "%Y-%m-%dT%H:%M:%S")
        return time.time() - created.replace(tzinfo=datetime.timezone.utc).timestamp()
    except (KeyError, ValueError):
        return 0.0


def make_backend(kind: str = "local", **kwargs: Any) -> Backend:
    """Build a backend by name: ``"local"`` or ``"docker"`` (keyword arguments go to its constructor)."""
    if kind == "local":
        return LocalBackend(**kwargs)
    if kind == "docker":
        return DockerBackend(**kwargs)
    raise ValueError(f"unknown backend {kind!r}; choose local or docker")
