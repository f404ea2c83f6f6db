"""The sandbox service: sessions over a warm pool, validated tool calls, snapshots, clone and fork.

:class:`SandboxService` is what the HTTP app serves and what an env uses in-process (the embedded
default): its methods have the same names and models as :class:`sandbox_server.client.SandboxClient`.
Every method blocks; the HTTP app runs them in worker threads. Its parts live in their own modules: the
warm pool (:mod:`sandbox_server.pool`), stored snapshots (:mod:`sandbox_server.snapshots`), abandoned
work (:mod:`sandbox_server.cancel`), checks of client input (:mod:`sandbox_server.session_input`), limits
(:mod:`sandbox_server.settings`).

Why one file: what is left is :class:`SandboxService` itself, whose methods all work on one session table
under one lock discipline (the service's ``_mu`` for the table, each session's ``lock`` for its sandbox) and
share one recovery path (``_with_replace``: a hung or dead sandbox is replaced from its restore point).
Splitting sessions from tool calls or from clone / fork would spread that protocol over several modules.
"""

from __future__ import annotations

import builtins  # SandboxService.list() shadows list in the class body
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable

from sandbox_server.backends import Backend
from sandbox_server.cancel import CancelToken, claim
from sandbox_server.errors import (
    AgentFailed, AgentTimeout, SandboxError, SandboxNotFound, ServiceUnavailable, SnapshotUnsupported, ToolRefused,
)
from sandbox_server.metrics import Metrics
from sandbox_server.models import MAX_CLONES, PoolStatus, SandboxInfo, SessionState, SnapshotInfo
from sandbox_server.pool import SandboxPool
from sandbox_server.session_input import (MAX_NAME_BYTES, MAX_PATH_BYTES, check_cwd, check_env, check_families,
                                          check_files)
from sandbox_server.settings import MAX_WRITE_BYTES, ServiceConfig
from sandbox_server.snapshots import SnapshotStore, without_interpreter_state
from sandbox_server.tools import TOOLS, Tool, ToolResult, ToolSpec, clamp_timeout, tool_specs, validate_call


@dataclass
class _Session:
    id: str
    sid: str  # backend sandbox id
    state: SessionState
    created_at: float  # wall time (seconds since the epoch): shown to people only
    last_used_at: float  # wall time: shown to people only
    #: What the sandbox is rebuilt from if its agent hangs: a tar of its areas, or (a copy-on-write fork's copy) the
    #: fork's layer (:class:`~sandbox_server.backends.layers.LayerRef`, which gives its tar).
    restore_point: Any = None
    lock: threading.RLock = field(default_factory=threading.RLock)
    deleted: bool = False
    #: ``time.monotonic()`` of the last use: the idle TTL is measured on it, never on the wall clock (an NTP
    #: step or a VM resume moves the wall clock, field case S32).
    used_mono: float = field(default_factory=time.monotonic)

    def touch(self) -> None:
        """Restart the idle clock (monotonic) and the shown ``last_used_at`` (wall)."""
        self.used_mono = time.monotonic()
        self.last_used_at = time.time()


#: Areas from this size (bytes of tar; of files, for a layer) up are forked by the backend's own means where it has
#: them (:meth:`LayeredAreas.freeze`: a copy-on-write layer; :meth:`LocalBackend.copy_areas`: a host copy per child);
#: smaller ones by the agents' tar, which costs less than a copy process there (measured, local: fork(8) of an empty
#: workspace 11.7 ms by tar, 21 ms by layer; fork(4) of a near-empty one 6.8 ms by tar, 10.7 ms by host copy; fork(8)
#: of 1 MiB 270 ms by tar, 122 ms by host copy, 42 ms by layer).
HOST_COPY_MIN_BYTES = 256 << 10


class SandboxService:
    """Sessions, tool calls, snapshots, clone and fork over a :class:`SandboxPool`.

    Args:
        backend: a :class:`sandbox_server.backends.Backend` (the service closes it in :meth:`close`).
        config: limits (:class:`ServiceConfig`).
        registry: the tool whitelist (default :data:`sandbox_server.tools.TOOLS`).
    """

    def __init__(self, backend: Backend, config: ServiceConfig | None = None, *,
                 registry: dict[str, Tool] | None = None, metrics: Metrics | None = None):
        self.backend = backend
        self.config = config or ServiceConfig()
        self.registry = TOOLS if registry is None else registry
        self.metrics = metrics or Metrics()
        c = self.config
        self.pool = SandboxPool(backend, min_idle=c.min_idle, max_total=c.max_total,
                                max_concurrent_starts=c.max_concurrent_starts, acquire_timeout_s=c.acquire_timeout_s,
                                recycle=c.recycle, max_sandbox_uses=c.max_sandbox_uses,
                                surplus_idle_ttl_s=c.surplus_idle_ttl_s, metrics=self.metrics)
        self._sessions: dict[str, _Session] = {}
        self.snapshots = SnapshotStore(c.max_snapshot_bytes)
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._fanout = ThreadPoolExecutor(max_workers=8, thread_name_prefix="forkyard-fanout")
        self.orphans_removed = 0

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self, wait: bool = True) -> "SandboxService":
        """Remove orphans of an earlier run, warm the pool (``wait``: until ``min_idle`` are idle), start the reaper."""
        self.orphans_removed = self.pool.start(wait=wait)
        self._reaper = threading.Thread(target=self._reap_loop, name="forkyard-reaper", daemon=True)
        self._reaper.start()
        return self

    def close(self) -> None:
        """Destroy every session and pooled sandbox and close the backend."""
        self._stop.set()
        with self._mu:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        self.snapshots.clear()
        for s in sessions:
            self.pool.release(s.sid, reusable=False)  # shutting down: nothing to recycle for
        self.pool.close()
        self._fanout.shutdown(wait=True)
        try:
            self.backend.close()
        except Exception:
            pass

    def __enter__(self) -> "SandboxService":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _reap_loop(self) -> None:
        while not self._stop.wait(self.config.reap_interval_s):
            try:
                self.reap()
            except Exception:
                pass

    def reap(self, now: float | None = None) -> tuple[int, int]:
        """Delete sessions idle longer than ``idle_ttl_s`` and expired snapshots. Returns (sessions, snapshots).

        ``now``: a ``time.monotonic()`` value (default: now). Every TTL is measured on the monotonic clock, so
        a step of the wall clock neither expires nor prolongs anything (field case S32)."""
        now = time.monotonic() if now is None else now
        with self._mu:
            dead = [s for s in self._sessions.values() if now - s.used_mono > self.config.idle_ttl_s]
        old = self.snapshots.expire(now)
        for s in dead:
            try:
                self.delete(s.id)
            except SandboxNotFound:
                pass
        self._gauges()
        return len(dead), old

    def _gauges(self) -> None:
        self.metrics.sessions.set(len(self._sessions))
        self.metrics.snapshots.set(len(self.snapshots))

    # -- sessions -------------------------------------------------------------------------------------
    def _session(self, sandbox_id: str) -> _Session:
        s = self._sessions.get(sandbox_id)
        if s is None or s.deleted:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r} (deleted, expired after {self.config.idle_ttl_s:g} s "
                                  "idle, or never created)")
        return s

    def _live(self, s: _Session) -> None:
        """Raise SandboxNotFound if ``s`` was deleted (checked under ``s.lock``, right before its sandbox is
        used: once deleted, its sandbox may already serve another session)."""
        if s.deleted:
            raise SandboxNotFound(f"no sandbox {s.id!r} (deleted)")

    def _info(self, s: _Session) -> SandboxInfo:
        return SandboxInfo(id=s.id, backend=self.backend.name, state=s.state.model_copy(deep=True),
                           created_at=s.created_at, last_used_at=s.last_used_at, idle_ttl_s=self.config.idle_ttl_s)

    def _register(self, sids: list[str], states: list[SessionState], restore_point: bytes | None,
                  cancel: CancelToken | None = None) -> list[_Session]:
        """Make backend sandboxes ``sids`` sessions, all at once, unless the request was abandoned
        (then every one is released and :class:`ServiceUnavailable` raised)."""
        if not claim(cancel):
            for sid in sids:
                self.pool.release(sid)
            raise ServiceUnavailable("the request was abandoned before its sandbox was handed out", retry_after_s=1.0)
        now = time.time()
        out = [_Session(id="sb-" + uuid.uuid4().hex[:16], sid=sid, state=st, created_at=now, last_used_at=now,
                        restore_point=restore_point) for sid, st in zip(sids, states, strict=True)]
        with self._mu:
            for sess in out:
                self._sessions[sess.id] = sess
        self._gauges()
        return out

    def create(self, cwd: str | None = None, env: dict[str, str] | None = None, metadata: dict[str, Any] | None = None,
               files: dict[str, bytes] | None = None, *, archive: bytes | None = None,
               cancel: CancelToken | None = None, families: builtins.list[str] | None = None) -> SandboxInfo:
        """Take a warm sandbox for a new session; optionally write per-episode ``files`` into /scratch.

        Args:
            cwd, env, metadata: the session state (``env`` names must pass the allow-list).
            files: ``{path relative to /scratch: bytes}`` written before the session is handed out.
            archive: a tar of the writable areas made by :meth:`export` (or a stored snapshot) to
                restore into the new sandbox first (modes, mtimes and links included).
            cancel: a :class:`CancelToken`; if it is set before the session is handed out, everything
                taken is released and :class:`ServiceUnavailable` is raised.
            families: opt-in tool families (:data:`sandbox_server.tools.OPT_IN_FAMILIES`) the sandbox offers.

        Raises:
            ToolRefused: a bad ``cwd``, environment variable or file path (nothing was taken).
            LimitExceeded: the files do not fit the sandbox's /scratch (nothing is left behind).
            ServiceUnavailable: engine down or pool exhausted (retry later).
        """
        state = SessionState(cwd=check_cwd(cwd or "/data"), env=check_env(env), metadata=dict(metadata or {}),
                             families=check_families(families))
        if files:
            check_files(files)
        sid = self.pool.acquire()
        try:
            if archive:
                self.backend.restore(sid, archive)
            if files:
                self.backend.write_files(sid, files)
            restore_point = self.backend.snapshot(sid) if (files or archive) else None
        except Exception as exc:
            failed = isinstance(exc, (AgentTimeout, AgentFailed))
            self.pool.release(sid, reusable=not failed)  # a sandbox that hung or failed is never recycled
            if failed:
                raise SandboxError(f"the new sandbox failed while its files were written: {exc}") from None
            raise
        return self._info(self._register([sid], [state], restore_point, cancel)[0])

    def export(self, sandbox_id: str) -> bytes:
        """The tar (bytes) of a session's writable areas (/scratch, /tmp): what :meth:`create` takes as
        ``archive``. Raises SandboxNotFound, SandboxError (an entry that cannot be carried)."""
        s = self._session(sandbox_id)
        with s.lock:
            self._live(s)
            data = self._with_replace(s, lambda: self.backend.snapshot(s.sid), SnapshotUnsupported)
            s.touch()
        return data

    def get(self, sandbox_id: str) -> SandboxInfo:
        """The session's info. Raises SandboxNotFound."""
        return self._info(self._session(sandbox_id))

    def touch(self, sandbox_ids: Iterable[str]) -> int:
        """Restart the idle clock of the live sandboxes ``sandbox_ids`` (unknown or deleted ones are skipped)
        without waiting for a call running on them: their holder (an env session, field case S48) is alive.
        Returns how many were touched."""
        live = [s for s in (self._sessions.get(i) for i in sandbox_ids) if s is not None and not s.deleted]
        for s in live:
            s.touch()
        return len(live)

    def list(self) -> list[SandboxInfo]:
        """Every live session."""
        return [self._info(s) for s in list(self._sessions.values())]

    def delete(self, sandbox_id: str) -> None:
        """End a session: its sandbox goes back to the pool, which resets, verifies and reuses it (or destroys
        it and refills; ``ServiceConfig.recycle``). The session's cwd, environment, metadata and restore point
        go with the session: a later session on the same sandbox starts from its own. Raises SandboxNotFound."""
        with self._mu:
            s = self._sessions.pop(sandbox_id, None)
        if s is None:
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        s.deleted = True  # first: a call that takes the session's lock from now on finds it deleted
        in_flight = not s.lock.acquire(blocking=False)
        if not in_flight:
            s.lock.release()
        # A call still running on the sandbox could act on it after a reset, in the next session's sandbox:
        # such a sandbox is destroyed, never recycled.
        self.pool.release(s.sid, reusable=not in_flight)
        self._gauges()

    def update_state(self, sandbox_id: str, cwd: str | None = None, env: dict[str, str] | None = None,
                     metadata: dict[str, Any] | None = None) -> SandboxInfo:
        """Replace the given parts of the session state (all checked before any is set).

        Raises SandboxNotFound, ToolRefused (a bad cwd, or environment variables outside the allow-list),
        pydantic.ValidationError (metadata nested too deep or over ``MAX_METADATA_BYTES``; HTTP 422).
        """
        s = self._session(sandbox_id)
        new_cwd = check_cwd(cwd) if cwd is not None else None
        new_env = check_env(env) if env is not None else None
        new_meta = SessionState(metadata=dict(metadata)).metadata if metadata is not None else None
        with s.lock:
            self._live(s)
            if new_cwd is not None:
                s.state.cwd = new_cwd
            if new_env is not None:
                s.state.env = new_env
            if new_meta is not None:
                s.state.metadata = new_meta
            s.touch()
        return self._info(s)

    def write_files(self, sandbox_id: str, files: dict[str, bytes]) -> None:
        """Write ``{path relative to /scratch: bytes}`` into the sandbox (done by the server, not by a tool).

        Raises:
            ToolRefused: absolute paths, ``..`` or NUL.
            LimitExceeded: more than :data:`MAX_WRITE_BYTES` in all, more files than the per-write limit, or
                more than /scratch holds (no file of the write is left behind).
            SandboxNotFound; SandboxError if the sandbox failed.
        """
        check_files(files)
        s = self._session(sandbox_id)
        with s.lock:
            self._live(s)
            self._with_replace(s, lambda: self.backend.write_files(s.sid, files))
            s.restore_point = self.backend.snapshot(s.sid)
            s.touch()

    # -- tool calls -----------------------------------------------------------------------------------
    def tools(self) -> builtins.list[ToolSpec]:
        """The whitelist with ordered parameter names and JSON schemas."""
        return tool_specs(self.registry)

    @property
    def name(self) -> str:
        """The backend's name (``"local"``, ``"docker"``): what the sandboxes run on."""
        return self.backend.name

    def data_dir(self) -> str:
        """A host folder with the same files as the sandboxes' read-only ``/data`` (the backend's
        :meth:`~sandbox_server.backends.base.Backend.host_data_dir`). Raises EngineUnavailable."""
        return self.backend.host_data_dir()

    def exec(self, sandbox_id: str, tool: str, args: dict[str, Any] | None = None,
             timeout_s: float | None = None) -> ToolResult:
        """Validate and run one tool call. ``timeout_s``: per-call deadline (None: default; clamped to max).

        A call that runs past its deadline returns ``status="timeout"`` with its partial output, and the
        sandbox stays usable. If the sandbox's agent itself stops answering, the sandbox is replaced from
        its last restore point and the result has ``status="timeout"`` (or ``"error"`` if it died).

        Raises:
            ToolRefused: the call is not allowed (nothing ran); HTTP 422.
            SandboxNotFound: unknown sandbox; HTTP 404.
        """
        s = self._session(sandbox_id)
        try:
            t = clamp_timeout(timeout_s, self.config.default_timeout_s, self.config.max_timeout_s)
            call = validate_call(tool, args, cwd=s.state.cwd, registry=self.registry, families=s.state.families)
        except ToolRefused:
            self.metrics.rejected.inc()
            raise
        res = self._run(s, call.argv, call.path_args, t, call.runs_code, call.code)
        if res.status == "refused":  # the agent's on-filesystem check (symlink escape): nothing ran
            self.metrics.rejected.inc()
            raise ToolRefused(res.message)
        self.metrics.exec_s.labels(tool).observe(res.duration_s)
        self.metrics.calls.labels(tool, res.status).inc()
        return res

    def exec_argv(self, sandbox_id: str, argv: builtins.list[str], timeout_s: float | None = None,
                  path_args: builtins.list[int] | None = None) -> ToolResult:
        """Run a raw argv in a sandbox, bypassing the whitelist. Not exposed over HTTP: for tests and
        trusted server-side code only. Raises SandboxNotFound, ToolRefused (bad timeout)."""
        s = self._session(sandbox_id)
        t = clamp_timeout(timeout_s, self.config.default_timeout_s, self.config.max_timeout_s)
        return self._run(s, list(argv), list(path_args or []), t)

    def _run(self, s: _Session, argv: builtins.list[str], path_args: builtins.list[int],
             timeout_s: float, bounded_only: bool = False, code: str | None = None) -> ToolResult:
        t0 = time.perf_counter()
        with s.lock:
            self._live(s)
            s.touch()
            try:
                res = self.backend.exec(s.sid, argv, cwd=s.state.cwd, env=s.state.env, timeout_s=timeout_s,
                                        cap_bytes=self.config.output_cap_bytes, path_args=path_args,
                                        bounded_only=bounded_only, code=code)
            except (AgentTimeout, AgentFailed) as exc:
                # the agent answered: an error, not a failure
                if isinstance(exc, AgentFailed) and self.backend.alive(s.sid):
                    res = ToolResult(status="error", duration_s=time.perf_counter() - t0, message=str(exc))
                elif s.deleted:  # deleted while the call ran (its sandbox destroyed): nothing to replace
                    res = ToolResult(status="error", duration_s=time.perf_counter() - t0,
                                     message="the session was deleted while the call ran")
                else:
                    self._replace(s)
                    hung = isinstance(exc, AgentTimeout)
                    res = ToolResult(status="timeout" if hung else "error", duration_s=time.perf_counter() - t0,
                                     sandbox_replaced=True,
                                     message=f"the sandbox {'stopped answering' if hung else 'failed'}; "
                                             "it was replaced from its last snapshot")
            s.touch()
        if res.status == "timeout":
            self.metrics.timeouts.inc()
        return res

    def _replace(self, s: _Session) -> None:
        """Swap a hung or dead sandbox for a fresh one restored to the session's restore point. Raises SandboxError
        when the restore point could not be read (a fork's layer gone with its mount helper): the new one is empty."""
        old = s.sid
        self.metrics.replaced.inc()
        new = self.pool.acquire()
        self.pool.release(old, reusable=False)  # it hung or died: destroyed, never recycled
        if s.deleted:  # deleted meanwhile: its delete gave back the old sandbox only
            self.pool.release(new)
            self._live(s)
        s.sid = new
        if s.restore_point:  # the tar, or a fork's layer (LayerRef) as its tar
            rp = s.restore_point
            try:
                data = rp if isinstance(rp, bytes) else rp.tar()
            except OSError as exc:  # the layer went with a mount helper that ended
                s.restore_point = None
                raise SandboxError(f"the sandbox failed and was replaced, but its restore point could not be read "
                                   f"({exc}): its areas are empty") from None
            self.backend.restore(s.sid, data)

    def _with_replace(self, s: _Session, fn: Any, refused: type[SandboxError] = SandboxError) -> Any:
        """``fn()``; if the sandbox hung or died, replace it from its restore point and try once more.

        An error the agent answered (it is alive: the operation itself failed, e.g. an unreadable entry
        in a snapshot) is raised as ``refused`` and the sandbox is kept as it is: replacing it would roll
        its files back to the restore point without a word.
        """
        try:
            return fn()
        except (AgentTimeout, AgentFailed) as exc:
            if isinstance(exc, AgentFailed) and self.backend.alive(s.sid):
                raise refused(str(exc)) from None
            self._live(s)
            self._replace(s)
            return fn()

    # -- snapshots, clone, fork -----------------------------------------------------------------------
    def snapshot(
        self, sandbox_id: str, ttl_s: float | None = None, *, cancel: CancelToken | None = None
    ) -> SnapshotInfo:
        """Capture /scratch, /tmp and the session state as plain data kept ``ttl_s`` seconds.

        Raises:
            SandboxNotFound: unknown session.
            LimitExceeded: storing it would take the stored snapshots past ``max_snapshot_bytes``
                (delete snapshots or wait for their TTL).
            SnapshotUnsupported: the writable areas hold an entry that cannot be carried (a FIFO, a device).
            ServiceUnavailable: ``cancel`` was set first (nothing is stored).
        """
        s = self._session(sandbox_id)
        # a sandbox with the interpreter family keeps a waiting copy of its live interpreter with the snapshot: a
        # rollback of that sandbox to it resumes the copy (the process as it was); the snapshot's tar carries the
        # interpreter's state by value for every other sandbox it is restored into (forks, clones)
        mark = "m-" + uuid.uuid4().hex[:16] if "interpreter" in s.state.families else None
        with s.lock:
            self._live(s)
            data = self._with_replace(s, lambda: self.backend.snapshot(s.sid, mark=mark), SnapshotUnsupported)
            s.restore_point = data
            state = s.state.model_copy(deep=True)
            layer = self._freeze(s)  # the same areas as a layer too, for a rollback or a clone in place of the tar
        if not claim(cancel):
            raise ServiceUnavailable("the request was abandoned before its snapshot was stored", retry_after_s=1.0)
        snap = self.snapshots.put(s.id, data, state, ttl_s or self.config.snapshot_ttl_s, mark=mark, layer=layer)
        self._gauges()
        return snap.info()

    def get_snapshot(self, snapshot_id: str) -> SnapshotInfo:
        """A stored snapshot's info. Raises SandboxNotFound."""
        return self.snapshots.get(snapshot_id).info()

    def snapshot_bytes(self, snapshot_id: str) -> bytes:
        """The tar of a stored snapshot's writable areas. Raises SandboxNotFound."""
        return self.snapshots.get(snapshot_id).data

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Forget a snapshot. Raises SandboxNotFound."""
        self.snapshots.delete(snapshot_id)
        self._gauges()

    def _freeze(self, s: _Session) -> Any:
        """Session ``s``'s areas frozen in place into a copy-on-write layer (:meth:`LayeredAreas.freeze`), or None: the
        backend makes none, the areas are small (:data:`HOST_COPY_MIN_BYTES`), or the sandbox has the
        ``interpreter`` family (its live interpreter's state rides in the tar by value). The caller holds ``s.lock``.

        Raises:
            SandboxError: the freeze failed midway; the sandbox was replaced from its restore point.
        """
        freeze = getattr(self.backend, "freeze", None)
        if freeze is None or "interpreter" in s.state.families:
            return None
        try:
            return freeze(s.sid, HOST_COPY_MIN_BYTES)
        except AgentFailed as exc:
            self._replace(s)
            raise SandboxError(f"the sandbox failed while its areas were frozen ({exc}); it was replaced from its "
                               "last snapshot") from None

    def _stand_on(self, layer: Any) -> Any:
        """A fill for :meth:`_clone`: the new sandboxes stand on ``layer`` (:meth:`LayeredAreas.share_areas`; the
        backend that made the layer has it)."""
        share: Any = getattr(self.backend, "share_areas", None)
        return lambda sids: share(layer, sids)

    def _clone_data(self, data: bytes, state: SessionState, n: int, cancel: CancelToken | None,
                    source: str | None = None) -> builtins.list[SandboxInfo]:
        """``n`` sandboxes restored to the tar ``data`` (the areas of a large ``source`` copied by the backend where
        it can, :meth:`LocalBackend.copy_areas`), registered with ``state``."""
        def fill(sid: str) -> None:  # a large source's areas copied by the backend where it can, else the snapshot
            # (always the snapshot where an interpreter's state may ride in it: a host copy of the areas leaves it out)
            copy = (getattr(self.backend, "copy_areas", None)
                    if len(data) >= HOST_COPY_MIN_BYTES and "interpreter" not in state.families else None)
            if source is None or copy is None or not copy(source, sid):
                self.backend.restore(sid, data)

        def fill_all(sids: builtins.list[str]) -> None:
            list(self._fanout.map(fill, sids)) if len(sids) > 1 else fill(sids[0])

        return self._clone(state, n, cancel, fill_all if data else None, data)

    def _clone(self, state: SessionState, n: int, cancel: CancelToken | None, fill: Any,
               restore_point: Any) -> builtins.list[SandboxInfo]:
        """``n`` sandboxes from the pool, ``fill(sids)``-ed (all or none), registered with ``state`` and
        ``restore_point``. Raises ToolRefused (``n``), ServiceUnavailable, SandboxError (the fill failed)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CLONES:
            raise ToolRefused(f"n must be an integer between 1 and {MAX_CLONES}, got {n!r}")
        if n > self.pool.max_total:  # can never succeed: a client error, not a 503 to retry
            raise ToolRefused(f"n={n} copies cannot fit a pool of at most {self.pool.max_total} sandboxes "
                              "(FORKYARD_MAX_TOTAL)")
        sids = self.pool.acquire_many(n)
        try:
            if fill is not None:
                fill(sids)
        except Exception as exc:
            failed = isinstance(exc, (AgentTimeout, AgentFailed))
            for sid in sids:
                self.pool.release(sid, reusable=not failed)
            raise SandboxError(f"could not restore the clones: {exc}") from None
        states = [state.model_copy(deep=True) for _ in sids]
        return [self._info(s) for s in self._register(sids, states, restore_point, cancel)]

    def clone(self, snapshot_id: str, n: int = 1, *, cancel: CancelToken | None = None) -> builtins.list[SandboxInfo]:
        """``n`` new sandboxes from the warm pool restored to a snapshot, independent of each other
        (all or none). ``cancel``: see :meth:`create`.

        Raises SandboxNotFound, ToolRefused (n out of 1..:data:`~sandbox_server.models.MAX_CLONES`, or more
        than the pool's ``max_total``), ServiceUnavailable.
        """
        t0 = time.perf_counter()
        snap = self.snapshots.get(snapshot_id)
        if snap.layer is not None:  # copy-on-write: each clone stands on the snapshot's layer
            out = self._clone(snap.state, n, cancel, self._stand_on(snap.layer), snap.data)
        else:
            out = self._clone_data(snap.data, snap.state, n, cancel)
        self.metrics.fork_s.labels("clone").observe(time.perf_counter() - t0)
        return out

    def fork(self, sandbox_id: str, n: int = 1, *, cancel: CancelToken | None = None) -> builtins.list[SandboxInfo]:
        """Snapshot + clone in one call (the snapshot is not stored; it is each copy's restore point). Where the
        backend makes copy-on-write layers (:meth:`LayeredAreas.freeze`, root with overlayfs) the areas are frozen in
        place into a layer that every copy mounts under its own overlay, nothing copied
        (:mod:`sandbox_server.backends.layers`; the layer is the copies' restore point); else, where the backend
        copies areas itself (:meth:`LocalBackend.copy_areas`: on the host, no agent's tar), the copies are made so;
        else the snapshot is restored into each. The sandbox's calls wait meanwhile. A sandbox with the
        ``interpreter`` family always goes by the snapshot: its live interpreter's state rides in it by value, and
        each copy's first cell starts from those variables.
        Raises like :meth:`clone`."""
        t0 = time.perf_counter()
        s = self._session(sandbox_id)
        with s.lock:  # held until the copies are made: they copy the snapshot's state, never a later one
            self._live(s)
            layer = self._freeze(s)
            state = s.state.model_copy(deep=True)
            if layer is not None:  # copy-on-write: one copy of the areas, mounted under an overlay in each copy
                s.touch()
                out = self._clone(state, n, cancel, self._stand_on(layer), layer)
            else:
                data = self._with_replace(s, lambda: self.backend.snapshot(s.sid), SnapshotUnsupported)
                s.touch()
                out = self._clone_data(data, state, n, cancel, source=s.sid)
        self.metrics.fork_s.labels("fork").observe(time.perf_counter() - t0)
        return out

    def rollback(self, sandbox_id: str, snapshot_id: str) -> SandboxInfo:
        """Put a sandbox back, in place, to a stored snapshot: its writable areas replaced by the snapshot's (the
        agent's ``unpack``; a snapshot that froze its areas into a copy-on-write layer is stood on instead,
        :meth:`LayeredAreas.restand`: nothing unpacked), its state (cwd, env, metadata, families)
        set to the snapshot's, the snapshot its new restore point. The sandbox keeps its id; any snapshot of this
        server will do (one of another sandbox too). Nothing a call started survives the call, so the areas are all
        there is to put back, but for the live interpreter of a sandbox with the ``interpreter`` family: rolled back to
        one of its own snapshots, the waiting copy of the interpreter kept with that snapshot takes the live one's
        place (the process as it was then); otherwise the live interpreter ends and the next cell starts a new one
        with the variables the snapshot carried by value (:mod:`sandbox_server.interpreter_runner`).

        Raises:
            SandboxNotFound: unknown sandbox or snapshot (HTTP 404).
            SandboxError: the sandbox failed meanwhile (it was replaced from its last restore point).
        """
        t0 = time.perf_counter()
        snap = self.snapshots.get(snapshot_id)
        s = self._session(sandbox_id)
        with s.lock:
            self._live(s)
            resume = snap.mark if snap.source == s.id else None  # its own snapshot: the interpreter copy it kept
            restand = getattr(self.backend, "restand", None) if snap.layer is not None else None
            stood = False  # copy-on-write: the sandbox stands on the snapshot's layer, over a new empty upper
            if resume is None and restand is not None and "interpreter" not in s.state.families:
                try:
                    stood = restand(s.sid, snap.layer)
                except AgentFailed:  # its areas may be unusable: a new sandbox, which the tar restores below
                    self._replace(s)
            if resume is None:
                if not stood:
                    self._with_replace(s, lambda: self.backend.restore(s.sid, snap.data))
            else:  # the copy holds the state: the areas alone go; only when the copy is gone, the state by value too
                lean = without_interpreter_state(snap.data)
                if not self._with_replace(s, lambda: self.backend.restore(s.sid, lean, resume=resume)) \
                        and lean is not snap.data:
                    self._with_replace(s, lambda: self.backend.restore(s.sid, snap.data))
            s.state = snap.state.model_copy(deep=True)
            s.restore_point = snap.data
            s.touch()
        self.metrics.fork_s.labels("rollback").observe(time.perf_counter() - t0)
        return self._info(s)

    # -- status ---------------------------------------------------------------------------------------
    def pool_status(self) -> PoolStatus:
        """Pool counts and limits plus session and snapshot counts."""
        st = self.pool.status()
        st.pop("recycling", None)  # not a PoolStatus field: the forkyard_pool_recycling gauge shows it
        return PoolStatus(backend=self.backend.name, sessions=len(self._sessions), snapshots=len(self.snapshots), **st)


__all__ = ["MAX_NAME_BYTES", "MAX_PATH_BYTES", "MAX_WRITE_BYTES", "CancelToken", "SandboxService", "ServiceConfig"]
