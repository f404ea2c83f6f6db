"""What every sandbox backend shares: the :class:`Backend` interface, the agent protocol over a byte stream
(:class:`AgentBackend`), owner records, and the write limits checked before a sandbox is touched.

Agents answer in sandbox paths only (``/data``, ``/scratch``, ``/tmp``). Every method blocks (callers on an
event loop run them in worker threads). Sandbox ids are opaque strings; times in seconds, sizes in bytes.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import logging
import os
import socket
import struct
import tarfile
import threading
import time
from typing import Any, Callable, Protocol, runtime_checkable

from sandbox_server.agent_bundle import AGENT_PACKAGE, agent_sha as agent_sha  # re-exported (backends.agent_sha)
from sandbox_server.errors import (
    AgentFailed, AgentTimeout, IsolationUnavailable, LimitExceeded, SandboxNotFound, SnapshotUnsupported,
)
from sandbox_server.tools import ToolRefused, ToolResult

#: The agent package (sandbox_server/agent/); sandboxes run it as one zipapp (sandbox_server/agent_bundle.py).
AGENT_PATH = AGENT_PACKAGE
#: Label set on every forkyard sandbox container; its value is the server name (see ``server_name``).
LABEL = "forkyard.sandbox"
#: Labels naming the process that owns a container: machine (boot id + PID namespace), pid, process
#: start time (clock ticks since boot) and a random id of the backend instance.
OWNER_LABELS = ("forkyard.owner.machine", "forkyard.owner.pid", "forkyard.owner.start", "forkyard.owner.instance")
#: Seconds the server waits for an agent beyond the call's own timeout before declaring it hung.
AGENT_GRACE_S = 3.0
#: Seconds a reset may spend killing leftover processes, and seconds the server waits for its answer.
RECYCLE_KILL_S, RECYCLE_TIMEOUT_S = 2.0, 10.0

_log = logging.getLogger("forkyard.sandbox")


@runtime_checkable
class Backend(Protocol):
    """What the pool and the service need from a sandbox (checked: ``checks.check_backend_contract``)."""

    name: str
    #: True when every sandbox runs isolated from the host (container, or bubblewrap namespaces).
    isolated: bool

    def describe(self) -> str:
        """One line naming the backend and its isolation mode (for logs, ``/healthz`` and errors)."""

    def host_data_dir(self) -> str:
        """A host folder with the same files as the sandboxes' read-only ``/data``. Raises EngineUnavailable."""

    def create(self) -> str:
        """Start a sandbox and wait until its agent answers. Returns its id. Raises EngineUnavailable."""

    def exec(self, sid: str, argv: list[str], *, cwd: str = "/data", env: dict[str, str] | None = None,
             timeout_s: float = 10.0, cap_bytes: int = 65536, path_args: list[int] | None = None,
             bounded_only: bool = False, code: str | None = None) -> ToolResult:
        """Run an already-validated argv in the sandbox; ``bounded_only``: refused (``status="refused"``) unless the
        sandbox bounds its process count (code the caller chose); ``code``: run it as a cell of the sandbox's live
        interpreter instead (``argv`` starts one when none runs). Raises AgentTimeout / AgentFailed /
        SandboxNotFound."""

    def snapshot(self, sid: str, mark: str | None = None) -> bytes:
        """A tar (bytes) of the sandbox's writable areas (/scratch, /tmp); ``mark``: also keep a waiting copy of its
        live interpreter under that name."""

    def restore(self, sid: str, data: bytes, resume: str | None = None) -> bool:
        """Replace the writable areas' contents with a tar made by :meth:`snapshot`; the live interpreter ends, or the
        copy named ``resume`` takes its place (returns whether one did)."""

    def write_files(self, sid: str, files: dict[str, bytes]) -> None:
        """Write ``{relative path: bytes}`` under the sandbox's /scratch (the server's per-episode files).
        Raises LimitExceeded past a limit (nothing of the write is kept)."""

    def recycle(self, sid: str) -> bool:
        """Reset and verify the sandbox for another session: True if it may be reused, False: destroy it."""

    def destroy(self, sid: str) -> None:
        """Stop and remove the sandbox (idempotent)."""

    def alive(self, sid: str) -> bool:
        """Whether ``sid`` exists and its agent answers (soon, within seconds); never raises."""

    def cleanup_orphans(self) -> int:
        """Remove what an earlier run of this server left behind. Returns how many sandboxes were removed."""

    def close(self) -> None:
        """Destroy every sandbox of this backend and release its resources."""


class Channel:
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


class AgentBackend:
    """Shared implementation of the agent protocol; subclasses start and stop the agent processes."""

    name = "agent"
    isolated = False

    def describe(self) -> str:
        """The backend's name and isolation mode in words."""
        return self.name

    def __init__(self) -> None:
        self._channels: dict[str, Channel] = {}
        self._mu = threading.Lock()
        #: Why the last refused :meth:`recycle` was refused (``"<sid>: <reason>"``), None until one is.
        self.last_recycle_problem: str | None = None

    def _channel(self, sid: str) -> Channel:
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

    def copy_areas(self, src: str, dst: str) -> bool:
        """Copy sandbox ``src``'s writable areas into the empty ones of ``dst`` without the agents' tar, where the
        backend can (a faster fork); False here: the caller restores a snapshot instead."""
        return False

    def _ping(self, sid: str, timeout_s: float) -> None:
        self._call(sid, {"op": "ping"}, timeout_s)

    def _warm(self, sid: str) -> None:
        """Run the restore path once with an empty archive before the sandbox joins the pool: a fresh
        agent's first restore took 4.5 ms against 2.1 ms warm (docker, measured), and fork(4) restores
        into four fresh agents at once (19.7 ms -> 9.9 ms)."""
        self.restore(sid, _EMPTY_TAR)

    def exec(self, sid: str, argv: list[str], *, cwd: str = "/data", env: dict[str, str] | None = None,
             timeout_s: float = 10.0, cap_bytes: int = 65536, path_args: list[int] | None = None,
             bounded_only: bool = False, code: str | None = None) -> ToolResult:
        """Run ``argv`` (already validated) in sandbox ``sid``, or ``code`` in its live interpreter; see
        :class:`Backend`.

        The agent enforces ``timeout_s``; this method waits ``timeout_s + AGENT_GRACE_S`` at most.
        Raises AgentTimeout if the agent does not answer by then, AgentFailed if it died.
        """
        if code is not None:
            req: dict[str, Any] = {"op": "cell", "argv": argv, "code": code, "env": env or {}, "timeout_s": timeout_s,
                                   "cap_bytes": cap_bytes}
        else:
            req = {"op": "exec", "argv": argv, "cwd": cwd, "env": env or {}, "timeout_s": timeout_s,
                   "cap_bytes": cap_bytes, "path_args": path_args or [], "bounded_only": bounded_only}
        ans = self._call(sid, req, timeout_s + AGENT_GRACE_S)
        ans.pop("id", None)
        return ToolResult(**ans)

    def snapshot(self, sid: str, mark: str | None = None) -> bytes:
        """PAX tar bytes of the writable areas: files, directories, symbolic links and hard links with their
        modes and modification times (ns).

        Raises:
            SnapshotUnsupported: a FIFO, socket or device is in /scratch or /tmp (the message names it).
            AgentTimeout / AgentFailed.

        ``mark``: also keep a waiting copy of the sandbox's live interpreter under that name (``os.fork`` in the
        sandbox), which :meth:`restore` with ``resume`` puts back.
        """
        return base64.b64decode(self._call(sid, {"op": "pack", "mark": mark})["data"])

    def restore(self, sid: str, data: bytes, resume: str | None = None) -> bool:
        """Replace the writable areas with the tar ``data`` (made by :meth:`snapshot`). The sandbox's live interpreter
        ends, unless ``resume`` names a copy it kept (``snapshot(mark=...)``): that copy then takes its place.
        Returns whether one did.

        Raises:
            LimitExceeded: it would pass an area's limits (nothing changed).
            ToolRefused: a member outside the writable areas, or written through a symbolic link.
            AgentTimeout / AgentFailed.
        """
        ans = self._call(sid, {"op": "unpack", "data": base64.b64encode(data).decode("ascii"), "resume": resume})
        return bool(ans.get("resumed"))

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

    def reset(self, sid: str, timeout_s: float = RECYCLE_TIMEOUT_S) -> dict[str, Any]:
        """The agent's ``recycle`` op (see ``sandbox_server/agent/recycle.py``): kill every other process, empty
        the writable areas, clean other writable places and IPC objects, check. Returns its report: ``clean``
        (bool), ``killed``, ``problems`` (one line per thing left), ``duration_s``. Raises AgentTimeout,
        AgentFailed, SandboxNotFound."""
        ans = self._call(sid, {"op": "recycle", "kill_timeout_s": RECYCLE_KILL_S}, timeout_s)
        ans.pop("id", None)
        return ans

    def recycle(self, sid: str) -> bool:
        """Verified reset for reuse: True when :meth:`reset` answered ``clean`` and then a ping within 2 s;
        False (destroy it) otherwise, and always once its channel timed out. Never raises; the reason of a
        refusal is logged and kept in :attr:`last_recycle_problem`."""
        try:
            rep = self.reset(sid)
            if rep.get("clean") is not True:
                raise AgentFailed("; ".join(map(str, rep.get("problems") or ["the reset was not clean"])))
            self._ping(sid, 2.0)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure means: do not reuse
            self.last_recycle_problem = f"{sid}: {exc}"
            level = logging.DEBUG if getattr(self, "_closed", False) else logging.WARNING  # closing kills agents
            _log.log(level, "sandbox %s failed its reset and will be destroyed: %s", sid, exc)
            return False

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
