"""The local backend: sandboxes as agent subprocesses under bubblewrap (no Docker needed).

Read-only bind of the data, private 16 MiB tmpfs ``/scratch`` and ``/tmp`` mounted ``noexec``, no network,
own PID namespace, no capabilities. It refuses to start without a working ``bwrap``
(:class:`~sandbox_server.errors.IsolationUnavailable`) unless built with ``unsafe_no_isolation=True``: then
tools run as host processes with only the agent's path checks, the session-environment allow-list and
(where the kernel has Landlock) a ban on executing anything outside the system directories. Weaker than
a container either way: see ``docs/sandbox.md``. Local state lives in a folder per backend instance, and
orphan clean-up removes only what a dead process left (:meth:`LocalBackend.cleanup_orphans`).

Why one file: a local sandbox's life is one sequence over the same few handles (its folder, its bubblewrap
process, its control group, its agent's mount namespace): the argv that confines it, its start inside its group, the
host copy of its areas (or the copy-on-write layer it mounts, :mod:`.layers`), its end, and the clean-up of what a dead
server left; split, each part would reach into the others' handles.
"""

from __future__ import annotations

import itertools
import logging
import json
import os
import re
import select
import shutil
import subprocess
import sys
import threading
import time
import uuid
import queue
from concurrent.futures import Future
from pathlib import Path

from sandbox_server.agent import AREA_BYTES, MAX_AREA_ENTRIES, MAX_WRITE_FILES
from sandbox_server.agent_bundle import SANDBOX_AGENT_PATH, agent_zipapp
from sandbox_server.errors import AgentFailed, EngineUnavailable, IsolationUnavailable
from sandbox_server.settings import cache_dir, corpus_dir
from sandbox_server.backends.cgroups import SandboxGroup, available, remove_orphan_groups, remove_owner_groups
from sandbox_server.backends.base import AgentBackend, Channel, owner_alive, owner_record, process_start
from sandbox_server.backends.layers import LayeredAreas, Layers
from sandbox_server.backends.limits import SANDBOX_MEMORY, SANDBOX_PIDS, parse_size


log = logging.getLogger(__name__)


def default_state_root() -> Path:
    """Where local sandboxes live: ``cache_dir() / "local"`` (``~/.cache/forkyard/local`` by default)."""
    return cache_dir() / "local"


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


class LocalBackend(LayeredAreas, AgentBackend):
    """Sandboxes as local agent subprocesses (the embedded default; no Docker needed), isolated by bubblewrap.

    Args:
        data_dir: host directory shown read-only as ``/data``. :func:`~sandbox_server.backends.make_backend`
            passes the corpus of the settings it was given (``LocalBackendConfig.corpus_data_dir``); None, for a
            caller constructing this class directly: the corpus of :func:`sandbox_server.settings.corpus_dir`,
            ``FORKYARD_CORPUS`` read now, built there on first use.
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
                 unsafe_no_isolation: bool = False, server_name: str = "default", area_bytes: int = AREA_BYTES,
                 mem_limit: str = SANDBOX_MEMORY, pids_limit: int = SANDBOX_PIDS):
        super().__init__()
        if not isinstance(unsafe_no_isolation, bool):
            raise TypeError("unsafe_no_isolation must be True or False")
        if data_dir is None:
            from sandbox_server.corpus import ensure_corpus

            data_dir = ensure_corpus(corpus_dir())
        self.data_dir = os.path.realpath(data_dir)
        self.unsafe_no_isolation = unsafe_no_isolation
        self.area_bytes = int(area_bytes)
        self.server_name = server_name
        self.pids_limit, self.memory_bytes = int(pids_limit), parse_size(mem_limit)
        #: Why the sandboxes' processes are not bounded (no control group can be made here), or None: each sandbox
        #: gets a pids and memory group (:mod:`sandbox_server.backends.cgroups`) and its agent runs ``--bounded``
        #: (never without isolation: code the caller chose would run as a host process, so tools that run code
        #: stay refused there).
        self.unbounded_reason = available()
        if self.unbounded_reason:
            log.warning("local sandboxes will not be bounded in processes and memory (%s); the agent refuses tools "
                        "that run code", self.unbounded_reason)
        self._groups: dict[str, SandboxGroup] = {}
        self._bwrap = shutil.which("bwrap")
        self._bwrap_size = False
        if not unsafe_no_isolation:
            if not self._bwrap:
                raise IsolationUnavailable(
                    f"the local backend needs bubblewrap and `bwrap` is not installed: {INSTALL_HINT}")
            self._bwrap_size = _bwrap_has_size(self._bwrap)
            problem = bwrap_problem(self._argv(None, probe=True))
            if problem:
                raise IsolationUnavailable(f"the local backend needs bubblewrap and it does not work here ({problem}): "
                                           f"{INSTALL_HINT}")
        self.server_dir = Path(state_dir or default_state_root()) / _safe_name(server_name)
        self.state_dir = self.server_dir / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        #: This instance's parent control group: ``forkyard-<server>@<pid>-<hex>`` (the instance folder's name), so
        #: the groups of a server that ended without :meth:`close` are found and removed by the next clean-up.
        self._group_owner = f"{_safe_name(server_name)}@{self.state_dir.name}"
        self.state_dir.mkdir(parents=True)  # parents: another process may just have removed an empty server folder
        tmp = self.state_dir / ".owner.json.tmp"
        tmp.write_text(json.dumps({**owner_record(), "server_name": server_name, "created_at": time.time()}))
        os.replace(tmp, self.state_dir / "owner.json")
        self._procs: dict[str, subprocess.Popen] = {}
        self._agents: dict[str, tuple[int, int]] = {}  # sandbox id -> (its agent's host pid, that process's start)
        self._closed = False
        #: Copy-on-write forks (:mod:`.layers`): None without isolation or where they cannot be made (not root, no
        #: overlayfs); forks then copy the areas into each copy (:meth:`copy_areas`).
        self.layers_unavailable = "no isolation" if unsafe_no_isolation else Layers.available()
        self._layers = Layers(self.state_dir / "layers", self.area_bytes) if self.layers_unavailable is None else None
        # bubblewrap's --die-with-parent kills a sandbox when the *thread* that started it exits (the parent-
        # death signal follows the thread): every agent is started from this one long-lived thread, so a
        # sandbox outlives the request or pool thread that asked for it (recycled sandboxes serve many).
        self._spawner = _Spawner()

    @property
    def isolated(self) -> bool:  # type: ignore[override]
        """True under bubblewrap; False only when built with ``unsafe_no_isolation=True``."""
        return not self.unsafe_no_isolation

    @property
    def isolation(self) -> str:
        """``"bubblewrap"`` or ``"none (unsafe)"``."""
        return "none (unsafe)" if self.unsafe_no_isolation else "bubblewrap"

    def host_data_dir(self) -> str:
        """The folder shown read-only as ``/data`` (the sandboxes read it in place)."""
        return self.data_dir

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

    def _argv(self, sbdir: Path | None, probe: bool = False, bounded: bool = False) -> list[str]:
        agent_args = self._agent_args() + (["--probe"] if probe else []) + (["--bounded"] if bounded else [])
        pyz = str(agent_zipapp(cache_dir() / "agent"))  # the agent package as one zipapp (agent_bundle.py)
        if self.unsafe_no_isolation:
            assert sbdir is not None
            roots = {"/data": self.data_dir, "/scratch": str(sbdir / "scratch"), "/tmp": str(sbdir / "tmp")}
            return [sys.executable, "-u", "-I", pyz, *agent_args,
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
                 "--ro-bind", pyz, SANDBOX_AGENT_PATH, "--proc", "/proc", "--dev", "/dev",
                 # the sandbox's root is the host's root user: kernel settings stay read-only, and nothing is
                 # writable but the areas and a bounded /dev/shm (a planted /etc/ld.so.preload, a file in /opt)
                 "--ro-bind", "/proc/sys", "/proc/sys", "--remount-ro", "/dev", *size, "--tmpfs", "/dev/shm",
                 "--remount-ro", "/",
                 "--unshare-all", "--die-with-parent", "--clearenv",
                 "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--chdir", "/data",
                 py, "-u", "-I", SANDBOX_AGENT_PATH, "--confine", "--isolated", *agent_args]
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
        group = None
        if self.unbounded_reason is None:
            try:
                group = SandboxGroup(self._group_owner, sid, self.pids_limit, self.memory_bytes)
            except OSError as exc:
                shutil.rmtree(sbdir, ignore_errors=True)
                raise EngineUnavailable(f"could not make the control group of a local sandbox: {exc}") from None
        try:
            proc = self._spawner.submit(
                subprocess.Popen, self._argv(sbdir, bounded=group is not None and not self.unsafe_no_isolation),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=sbdir, start_new_session=True, bufsize=0,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                preexec_fn=group.enter if group is not None else None).result()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # RuntimeError: closed meanwhile
            shutil.rmtree(sbdir, ignore_errors=True)
            if group is not None:
                group.remove()
            if isinstance(exc, RuntimeError):
                raise EngineUnavailable("the local backend is closed") from None
            raise EngineUnavailable(f"could not start a local sandbox agent: {exc}") from None
        if group is not None:
            with self._mu:
                self._groups[sid] = group
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
            self._channels[sid] = Channel(send, recv)
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

    def _areas_root(self, sid: str) -> str | None:
        """A host path under which the sandbox's writable areas show as in the sandbox (``ROOT/scratch``,
        ``ROOT/tmp``), or None when this process cannot reach them: the sandbox's folder without isolation, else
        ``/proc/<agent pid>/root`` (the agent's mount namespace; root only)."""
        if self.unsafe_no_isolation:
            return str(self.state_dir / sid)
        if os.geteuid() != 0:
            return None
        with self._mu:
            proc = self._procs.get(sid)
            known = self._agents.get(sid)
        if proc is None:
            return None
        if known is not None and process_start(known[0]) == known[1]:  # the same process: its pid was not reused
            return f"/proc/{known[0]}/root"
        stack = [proc.pid]
        while stack:  # bubblewrap, its init, then the agent
            pid = stack.pop()
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().split(b"\x00")
                if not cmd[0].endswith(b"bwrap") and SANDBOX_AGENT_PATH.encode() in cmd:
                    start = process_start(pid)
                    if start is not None:
                        with self._mu:
                            if sid in self._procs:
                                self._agents[sid] = (pid, start)
                    return f"/proc/{pid}/root"
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/children") as f:
                        stack += [int(c) for c in f.read().split()]
            except OSError:
                continue
        return None

    def copy_areas(self, src: str, dst: str) -> bool:
        """Copy sandbox ``src``'s writable areas into sandbox ``dst`` (fresh or recycled: empty areas) on the host,
        with ``cp -a`` (bytes, modes, modification times, empty folders, symbolic and hard links within the areas),
        instead of a tar through both agents: what a fork of a local sandbox does (the caller holds ``src``'s
        session and has snapshotted it, so what it copies is the snapshot's content). Returns False, having changed
        nothing, when it cannot (not root under bubblewrap, an area of ``dst`` not empty): the caller then restores
        the snapshot. Raises AgentFailed when a copy fails midway (``dst`` must then be discarded)."""
        roots = [self._areas_root(src), self._areas_root(dst)]
        if None in roots:
            return False
        for area in ("scratch", "tmp"):
            target = f"{roots[1]}/{area}"
            try:
                if os.listdir(target):
                    return False
            except OSError:
                return False
        for area in ("scratch", "tmp"):
            source, target = f"{roots[0]}/{area}", f"{roots[1]}/{area}"
            try:
                if not os.listdir(source):  # nothing in it: its own mode and times are all there is to copy
                    shutil.copystat(source, target, follow_symlinks=False)
                    continue
            except OSError as exc:
                raise AgentFailed(f"copying the sandbox's /{area} failed: {exc}") from None
            r = subprocess.run(["cp", "-a", "--", f"{source}/.", f"{target}/"], capture_output=True, text=True,
                               timeout=60)
            if r.returncode != 0:
                raise AgentFailed(f"copying the sandbox's /{area} failed: {r.stderr.strip()[-300:]}")
        return True

    def _agent_pid(self, sid: str) -> int | None:
        """Host pid of the sandbox's agent process (inside bubblewrap), or None (gone, or not root)."""
        root = self._areas_root(sid)
        return int(root.split("/")[2]) if root and root.startswith("/proc/") else None

    _ns_pid = _agent_pid  # LayeredAreas: a process in the sandbox's mount namespace

    def destroy(self, sid: str) -> None:
        """Kill the agent and its process group and remove the sandbox directory (idempotent)."""
        self._forget_layers(sid)
        with self._mu:
            proc = self._procs.pop(sid, None)
            self._agents.pop(sid, None)
            self._channels.pop(sid, None)
            group = self._groups.pop(sid, None)
        if group is not None:
            group.remove()  # every process of the sandbox, the ones that left bubblewrap's process group too
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
        Control groups whose owning process is gone go too
        (:func:`~sandbox_server.backends.cgroups.remove_orphan_groups`).
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
        if self.unbounded_reason is None:
            remove_orphan_groups()  # control groups of dead owners (their sandboxes' folders may be elsewhere)
        return n

    def close(self) -> None:
        """Destroy every sandbox of this instance and remove its state folder (idempotent)."""
        self._closed = True
        super().close()
        self._spawner.shutdown(wait=True)
        self._close_layers()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        if self.unbounded_reason is None:
            remove_owner_groups(self._group_owner)
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


class _Spawner:
    """One daemon thread that runs the calls submitted to it (each returns a Future). Not a
    ThreadPoolExecutor: those threads end at interpreter shutdown *before* atexit handlers run, which would
    kill every sandbox (--die-with-parent) while the shared providers' exit handler still recycles some."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = False
        threading.Thread(target=self._run, name="forkyard-local-spawn", daemon=True).start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, fn, args, kwargs = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)

    def submit(self, fn, *args, **kwargs) -> Future:
        """Run ``fn(*args, **kwargs)`` on the spawner thread. Raises RuntimeError once shut down."""
        if self._stopped:
            raise RuntimeError("the spawner is shut down")
        fut: Future = Future()
        self._q.put((fut, fn, args, kwargs))
        return fut

    def shutdown(self, wait: bool = True) -> None:
        """Stop taking calls; the thread ends after the calls already queued (``wait`` is accepted for
        ThreadPoolExecutor's signature; the thread is a daemon)."""
        self._stopped = True
        self._q.put(None)
