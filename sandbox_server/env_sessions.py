"""The env sessions of one server: which env classes it serves and with which kwargs, the sessions it holds
(create, look up, fork, close, reap idle ones), and how env code runs (inline or in a worker thread).

The operations over these that every transport shares (create, reset, step, ...): :mod:`sandbox_server.session_host`.

* Env classes and kwargs (``TextEnv`` subclasses of the registry; kwargs checked strictly, ``gymnasium.make``
  keywords and server-decided ones refused): :mod:`sandbox_server.env_classes`, whose names this module
  re-exports.
* ``TextEnv.uses_sandbox`` (FileQA): the env gets the server's own sandbox service as ``sandbox_provider``;
  a server without one refuses it (422, or 503 when its sandbox backend is down).
* ``TextEnv.blocking`` (sandbox-backed envs): reset / step / fork run in a worker thread, so the event loop
  never waits on a sandbox; pure-Python envs (ClueProbe) run inline, which is faster than a thread hop.
* Steps of one session are serialised by a per-session lock; different sessions run concurrently.
* Work of blocking envs that may wait for the sandbox pool (make + reset, reset, fork, restore) runs in
  threads of a limiter of its own (:meth:`EnvSessions.pool_threads`), so resets waiting on a full pool never
  hold the threads other sessions' steps need (field case S38).
* Sessions idle for longer than ``ttl_s`` seconds are closed (:func:`reaper`, and any lookup after expiry). What
  holds a session is activity, never idleness (field case S48): a call running on it (its lock; the idle clock
  restarts when the call ends), an open connection holding it (:meth:`EnvSessions.pin`: an OpenEnv WebSocket's
  session and forks) and, for its sandboxes, the session itself (:mod:`sandbox_server.held_sandboxes`).
* Counts by env id and transport, expiries and refusals at the cap: :meth:`EnvSessions.census` (field case S63).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import anyio

from envs.core import EnvInfraError, TextEnv
from envs.errors import InvalidValue, SessionNotFound
from sandbox_server.env_classes import (GYM_MAKE_KEYWORDS, SERVER_DECIDED_KWARGS, check_kwargs, env_class,
                                        import_env_modules)
from sandbox_server.errors import CapacityReached, ServiceUnavailable
from sandbox_server.session_lease import LEASE
from sandbox_server.held_sandboxes import HeldSandboxes, hold_sandboxes, provider_ttl_s
from sandbox_server.session_census import TRANSPORT, Census, env_label

#: ``Retry-After`` seconds of a 503 for a full session cap or a server shutting down.
SESSIONS_RETRY_S = 5.0
#: ``Retry-After`` seconds of a 503 for a sandbox-backed env on a server whose sandbox backend is down.
NO_BACKEND_RETRY_S = 10.0
#: Worker threads of blocking env work that may wait for the sandbox pool (:meth:`EnvSessions.pool_threads`).
POOL_THREADS = 32


class _CallLock(asyncio.Lock):
    """A session's lock: its release (a call's end) restarts the session's idle clock, before it unlocks."""

    def __init__(self, session: "EnvSession"):
        super().__init__()
        self._session = session

    def release(self) -> None:
        self._session.last_used = time.monotonic()
        super().release()


@dataclass
class EnvSession:
    """One session: its env instance, whether env code blocks, the transport that made it (``rest``,
    ``openenv``), its lock, idle clock (``time.monotonic()`` seconds) and whether a connection holds it."""

    env_id: str
    env: TextEnv
    blocking: bool
    transport: str = "rest"
    last_used: float = field(default_factory=time.monotonic)
    pinned: bool = False
    #: Seconds without a request before it expires, when its maker asked for a lease (field case S51).
    lease_s: float | None = None
    lock: asyncio.Lock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.lock = _CallLock(self)

    def expired(self, now: float, ttl_s: float) -> bool:
        """Whether nothing holds the session (no connection, no call: the lock is read before the clock, which
        a call's end sets first) and it has been idle for more than ``ttl_s`` seconds at ``now`` (or its lease,
        when shorter: :mod:`sandbox_server.session_lease`)."""
        limit = ttl_s if self.lease_s is None else min(ttl_s, self.lease_s)
        return not self.pinned and not self.lock.locked() and now - self.last_used > limit


@dataclass(frozen=True)
class EnvRecipe:
    """How to make a session's env: the class, the kwargs (spec defaults + the client's) and what the server
    adds (``sandbox_provider``)."""

    env_id: str
    cls: type[TextEnv]
    kwargs: dict[str, Any]
    extra: dict[str, Any]

    @property
    def blocking(self) -> bool:
        """Whether the env's code blocks (runs in worker threads): the class's declared ``blocking``."""
        return self.cls.blocking


class EnvSessions:
    """The env sessions of one server.

    Args:
        ttl_s: seconds a session may stay idle before it is closed.
        max_sessions: most sessions at once; creates and forks past it answer 503.
        sandbox_provider: the sandbox service that sandbox-backed envs (``uses_sandbox = True``) take
            their sandboxes from; None: such envs are refused (see ``sandbox_unavailable``).
        operator_kwargs: kwargs of the operator, not of a client (a Ray node host's): passed on unchecked.
        new_id: makes a new session id (default: 32 hex digits, never guessable).

    Attributes:
        sandbox_unavailable: why the server's sandbox service is down (then sandbox-backed envs answer
            503), or None when there is none by design (they answer 422).

    Raises:
        ValueError: ``ttl_s`` not positive or ``max_sessions`` below 1.
    """

    def __init__(self, ttl_s: float = 600.0, max_sessions: int = 256, sandbox_provider: Any = None,
                 operator_kwargs: bool = False, new_id: Callable[[], str] | None = None):
        if not ttl_s > 0 or max_sessions < 1:
            raise ValueError(f"need ttl_s > 0 and max_sessions >= 1, got {ttl_s!r}, {max_sessions!r}")
        self.ttl_s = float(ttl_s)
        self.max_sessions = int(max_sessions)
        self.sandbox_provider = sandbox_provider
        self.operator_kwargs = operator_kwargs
        self.sandbox_unavailable: str | None = None
        self._new_id = new_id or (lambda: uuid.uuid4().hex)
        self._sessions: dict[str, EnvSession] = {}
        self._reserved = 0
        self._outside = 0  # envs counted against the cap that are not sessions (hold)
        self._closed = False
        self._expired: dict[tuple[str, str], int] = {}
        self._refused = 0
        self._held: HeldSandboxes | None = None
        self._guard = threading.Lock()
        #: The limiter of :meth:`pool_threads` once made (read its ``borrowed_tokens`` from any thread).
        self.pool_limiter: anyio.CapacityLimiter | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def in_use(self) -> int:
        """Envs counted against ``max_sessions``: sessions, room reserved for new ones, and :meth:`hold`'s."""
        return len(self._sessions) + self._reserved + self._outside

    def held(self) -> dict[str, EnvSession]:
        """A copy of ``{session id: session}`` (idle clocks untouched)."""
        with self._guard:
            return dict(self._sessions)

    def pool_threads(self) -> anyio.CapacityLimiter:
        """The worker-thread limiter (:data:`POOL_THREADS` threads; made on first use, on the event loop) of
        blocking env work that may wait for the sandbox pool: making + resetting, resetting, forking,
        restoring. Steps keep anyio's default limiter (field case S38)."""
        if self.pool_limiter is None:
            self.pool_limiter = anyio.CapacityLimiter(POOL_THREADS)
        return self.pool_limiter

    # -- envs ---------------------------------------------------------------------------------------
    def recipe(self, env_id: str, kwargs: dict[str, Any]) -> EnvRecipe:
        """How to make ``env_id`` with the client's ``kwargs`` on this server.

        Raises:
            UnknownEnv: an env id not served.
            InvalidValue: a kwarg the env does not take or of the wrong type, a class that is not a TextEnv, or
                a sandbox-backed env on a server without a sandbox service.
            ServiceUnavailable: a sandbox-backed env while the server's sandbox backend is down.
        """
        cls, defaults = env_class(env_id)
        if self.operator_kwargs:
            return EnvRecipe(env_id, cls, {**defaults, **kwargs}, {})
        check_kwargs(env_id, cls, kwargs)
        extra: dict[str, Any] = {}
        if cls.uses_sandbox:
            if self.sandbox_provider is None:
                if self.sandbox_unavailable:
                    raise ServiceUnavailable(f"{env_id} needs a sandbox and this server's sandbox service is down: "
                                             f"{self.sandbox_unavailable}", retry_after_s=NO_BACKEND_RETRY_S)
                raise InvalidValue(f"{env_id} needs a sandbox and this server has no sandbox service: run the "
                                   "full server (python -m sandbox_server, without --no-sandboxes) to serve it")
            if self._held is None or self._held.provider is not self.sandbox_provider:
                self._held = hold_sandboxes(self.sandbox_provider)
            extra["sandbox_provider"] = self._held  # its sandboxes live as long as their sessions (S48)
        return EnvRecipe(env_id, cls, {**defaults, **kwargs}, extra)

    # -- sessions -----------------------------------------------------------------------------------
    @contextmanager
    def reserve(self, n: int, force: bool = False) -> Iterator["Slots"]:
        """Hold room for ``n`` new sessions while they are made (CapacityReached if the cap has no room, unless
        ``force``; ServiceUnavailable if the server is shutting down). :meth:`Slots.commit` registers them; leaving
        the block without a commit gives the room back."""
        with self._guard:
            if self._closed:
                raise ServiceUnavailable("the server is shutting down", retry_after_s=SESSIONS_RETRY_S)
            if not force and self.in_use + n > self.max_sessions:
                self._refused += 1
                raise CapacityReached(
                    f"{self.in_use} of {self.max_sessions} env sessions are in use and "
                    f"{n} more were asked for; close some (DELETE /v1/envs/{{id}})", retry_after_s=SESSIONS_RETRY_S)
            self._reserved += n
        slots = Slots(self, n)
        try:
            yield slots
        finally:
            slots.release()

    def _commit(self, slots: "Slots", env_id: str, env_list: list[Any], blocking: bool) -> list[str]:
        with self._guard:
            if self._closed:
                raise ServiceUnavailable("the server is shutting down", retry_after_s=SESSIONS_RETRY_S)
            sids, transport, lease = [self._new_id() for _ in env_list], TRANSPORT.get(), LEASE.get()
            for sid, env in zip(sids, env_list, strict=True):
                self._sessions[sid] = EnvSession(env_id, env, blocking, transport, lease_s=lease)
            self._reserved -= len(env_list)  # the room held for them is now theirs
            slots.committed = True
            return sids

    def get(self, sid: str) -> EnvSession:
        """The live session ``sid`` (its idle clock restarts); SessionNotFound if it is unknown, closed or
        expired."""
        now = time.monotonic()
        s = self._sessions.get(sid)
        if s is not None and s.expired(now, self.ttl_s):
            with self._guard:
                gone = self._sessions.pop(sid, None)
                if gone is not None:
                    self._count_expired(gone)
            if gone is not None:  # expired: closed now (in a thread if closing blocks), not at the next reap
                if gone.blocking:
                    threading.Thread(target=close_quietly, args=(gone.env,), daemon=True).start()
                else:
                    close_quietly(gone.env)
            s = None
        if s is None:
            raise SessionNotFound(f"no env session {sid!r} (unknown, closed, or expired after {self.ttl_s:g} s idle)")
        s.last_used = now
        return s

    def hold(self, n: int, force: bool = False) -> bool:
        """Count ``n`` envs that are not sessions (a Ray rollout worker's; ``n < 0``: fewer, never below zero)
        against the cap if they fit (always when ``force``); returns whether counted."""
        with self._guard:
            if not force and self.in_use + n > self.max_sessions:
                return False
            self._outside = max(self._outside + n, 0)
            return True

    def pin(self, sid: str, held: bool = True) -> bool:
        """Mark the session ``sid`` as held by an open connection (``held``), which the TTL never expires, or
        let it go (its idle clock restarts now). Returns whether ``sid`` is held by the store."""
        s = self._sessions.get(sid)
        if s is not None:
            s.pinned, s.last_used = held, time.monotonic()
        return s is not None

    def census(self) -> Census:
        """The store's counts now (:class:`~sandbox_server.session_census.Census`: no ids)."""
        with self._guard:
            live = list(self._sessions.values())
            expired, refused, in_use = dict(self._expired), self._refused, self.in_use
        open_: dict[tuple[str, str], int] = {}
        for s in live:
            key = (env_label(s.env_id), s.transport)
            open_[key] = open_.get(key, 0) + 1
        return Census(open_, expired, refused, sum(s.pinned for s in live), in_use, self.max_sessions)

    def _count_expired(self, s: EnvSession) -> None:  # under self._guard
        key = (env_label(s.env_id), s.transport)
        self._expired[key] = self._expired.get(key, 0) + 1

    def renew(self, sids: list[str]) -> list[bool]:
        """Restart the idle clock of every live session of ``sids`` (a client renewing its leases, field case
        S51); ``[i]``: whether ``sids[i]`` is live. Runs no env code and never raises for an unknown id."""
        now = time.monotonic()
        out = []
        with self._guard:
            for sid in sids:
                s = self._sessions.get(sid)
                live = s is not None and not s.expired(now, self.ttl_s)
                if s is not None and live:
                    s.last_used = now
                out.append(live)
        return out

    def peek(self, sid: str) -> EnvSession | None:
        """The session ``sid`` if it is held, without touching its idle clock."""
        return self._sessions.get(sid)

    def pop(self, sid: str) -> EnvSession | None:
        """Remove the session ``sid`` (None if it is not held); the caller closes its env."""
        with self._guard:
            return self._sessions.pop(sid, None)

    def reap(self, now: float | None = None) -> int:
        """Close sessions that nothing holds and that were idle for more than ``ttl_s`` (``now``: a
        ``time.monotonic()`` value), then restart the sandbox idle clock of the sandboxes the others hold
        (:meth:`HeldSandboxes.keep_alive`); returns how many were closed."""
        now = time.monotonic() if now is None else now
        with self._guard:
            gone = [self._sessions.pop(k) for k in [k for k, s in self._sessions.items() if s.expired(now, self.ttl_s)]]
            for s in gone:
                self._count_expired(s)
        for s in gone:
            close_quietly(s.env)
        if self._held is not None:
            try:
                self._held.keep_alive()
            except Exception:  # noqa: BLE001 - the sandboxes' own clock applies; the reaper must go on
                pass
        return len(gone)

    def close_all(self) -> None:
        """Close every session; sessions being made now are closed instead of registered."""
        with self._guard:
            self._closed = True
            gone = list(self._sessions.values())
            self._sessions.clear()
        for s in gone:
            close_quietly(s.env)


class Slots:
    """Room reserved in an :class:`EnvSessions` for sessions being made (see :meth:`EnvSessions.reserve`)."""

    def __init__(self, store: EnvSessions, n: int):
        self._store, self._n = store, n
        self.committed = False
        self.released = False

    def release(self) -> None:
        """Give the room back now if it was not committed (once; leaving the reserve block does it too):
        for work that failed while others in the same request go on."""
        if not self.committed and not self.released:
            with self._store._guard:
                if not self.committed and not self.released:
                    self.released = True
                    self._store._reserved -= self._n

    def commit(self, env_id: str, env_list: list[Any], blocking: bool) -> list[str]:
        """Register the envs as sessions and return their ids. Raises EnvInfraError (a wrong number of envs)
        or ServiceUnavailable (the server is shutting down), registering none; the caller then closes the envs."""
        if len(env_list) != self._n:
            raise EnvInfraError(f"the env made {len(env_list)} copies instead of {self._n}")
        if self.released:
            raise EnvInfraError("the room reserved for these sessions was given back before they were registered")
        return self._store._commit(self, env_id, env_list, blocking)


def close_quietly(env: Any) -> None:
    """``env.close()``, ignoring any error (closing must never take the server down)."""
    try:
        env.close()
    except Exception:  # noqa: BLE001
        pass


async def reaper(sessions: EnvSessions, period_s: float | None = None) -> None:
    """Background task: close idle sessions (:meth:`EnvSessions.reap`) every ``period_s`` seconds until cancelled
    (default: a quarter of the shorter of the TTL and the sandbox provider's idle TTL, between 0.05 and 5 s)."""
    ttl = min(sessions.ttl_s, provider_ttl_s(sessions.sandbox_provider) or sessions.ttl_s)
    period = period_s if period_s is not None else min(5.0, max(0.05, ttl / 4))
    while True:
        await asyncio.sleep(period)
        await anyio.to_thread.run_sync(sessions.reap)


__all__ = ["GYM_MAKE_KEYWORDS", "NO_BACKEND_RETRY_S", "SERVER_DECIDED_KWARGS", "SESSIONS_RETRY_S", "EnvRecipe",
           "EnvSession", "EnvSessions", "Slots", "check_kwargs", "close_quietly", "env_class", "import_env_modules",
           "reaper"]
