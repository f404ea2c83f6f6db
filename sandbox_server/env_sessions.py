"""The env sessions of one server: which env classes it serves and with which kwargs, the sessions it holds
(create, look up, fork, close, reap idle ones), and how env code runs (inline or in a worker thread).

The operations over these that every transport shares (create, reset, step, ...): :mod:`sandbox_server.session_host`.

* Env classes: every served env is an :class:`envs.core.TextEnv` subclass registered in Gymnasium's registry by
  :func:`envs.register_env`; the server builds the class itself (not through ``gymnasium.make``, whose wrappers
  the session would lose). A class that is not a ``TextEnv`` is refused (422).
* Kwargs: a kwarg is either a parameter of the env's constructor, checked with strict types, or refused
  with 422 naming it: ``gymnasium.make`` keywords (:data:`GYM_MAKE_KEYWORDS`; use the env's own turn
  budget) and what the server decides (:data:`SERVER_DECIDED_KWARGS`) included.
* ``TextEnv.uses_sandbox`` (FileQA): the env gets the server's own sandbox service as ``sandbox_provider``;
  a server without one refuses it (422, or 503 when its sandbox backend is down).
* ``TextEnv.blocking`` (sandbox-backed envs): reset / step / fork run in a worker thread, so the event loop
  never waits on a sandbox; pure-Python envs (ClueProbe) run inline, which is faster than a thread hop.
* Steps of one session are serialised by a per-session lock; different sessions run concurrently.
* Work of blocking envs that may wait for the sandbox pool (make + reset, reset, fork, restore) runs in
  threads of a limiter of its own (:meth:`EnvSessions.pool_threads`), so resets waiting on a full pool never
  hold the threads other sessions' steps need (field case S38).
* Sessions idle for longer than ``ttl_s`` seconds are closed (:func:`reaper`, and any lookup after expiry).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
import threading
import time
import typing
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import anyio
import gymnasium as gym
import pydantic
from fastapi import HTTPException
from pydantic import BaseModel

import envs
from envs.core import EnvInfraError, TextEnv
from sandbox_server.errors import CapacityReached, ServiceUnavailable

#: ``gymnasium.make``'s own keywords (and those of older Gymnasium versions): never passed on silently.
GYM_MAKE_KEYWORDS = frozenset(
    {p for p in inspect.signature(gym.make).parameters if p not in ("id", "kwargs")}
    | {"max_episode_steps", "disable_env_checker", "autoreset", "apply_api_compatibility", "order_enforce"})
#: Kwargs the server decides, never the client: where the env's sandbox runs and what it reads.
SERVER_DECIDED_KWARGS = frozenset({"backend", "server_url", "sandbox_provider", "corpus_dir"})
#: ``Retry-After`` seconds of a 503 for a full session cap or a server shutting down.
SESSIONS_RETRY_S = 5.0
#: ``Retry-After`` seconds of a 503 for a sandbox-backed env on a server whose sandbox backend is down.
NO_BACKEND_RETRY_S = 10.0
#: Worker threads of blocking env work that may wait for the sandbox pool (:meth:`EnvSessions.pool_threads`).
POOL_THREADS = 32


@dataclass
class EnvSession:
    """One session: its env instance, whether env code blocks, its lock and idle clock."""

    env_id: str
    env: TextEnv
    blocking: bool
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


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
            HTTPException: 404 unknown env id; 422 a kwarg the env does not take or of the wrong type, a
                class that is not a TextEnv, or a sandbox-backed env on a server without a sandbox service.
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
                raise HTTPException(422, f"{env_id} needs a sandbox and this server has no sandbox service: run the "
                                         "full server (python -m sandbox_server, without --no-sandboxes) to serve it")
            extra["sandbox_provider"] = self.sandbox_provider
        return EnvRecipe(env_id, cls, {**defaults, **kwargs}, extra)

    # -- sessions -----------------------------------------------------------------------------------
    @contextmanager
    def reserve(self, n: int, force: bool = False) -> Iterator["Slots"]:
        """Hold room for ``n`` new sessions while they are made (503 if the cap has no room, unless ``force``,
        or the server is shutting down). :meth:`Slots.commit` registers them; leaving the block without a
        commit gives the room back."""
        with self._guard:
            if self._closed:
                raise ServiceUnavailable("the server is shutting down", retry_after_s=SESSIONS_RETRY_S)
            if not force and self.in_use + n > self.max_sessions:
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
            sids = [self._new_id() for _ in env_list]
            for sid, env in zip(sids, env_list, strict=True):
                self._sessions[sid] = EnvSession(env_id, env, blocking)
            self._reserved -= len(env_list)  # the room held for them is now theirs
            slots.committed = True
            return sids

    def get(self, sid: str) -> EnvSession:
        """The live session ``sid`` (its idle clock restarts); HTTPException 404 if it is unknown, closed or expired."""
        now = time.monotonic()
        s = self._sessions.get(sid)
        if s is not None and now - s.last_used > self.ttl_s and not s.lock.locked():
            with self._guard:
                gone = self._sessions.pop(sid, None)
            if gone is not None:  # expired: closed now (in a thread if closing blocks), not at the next reap
                if gone.blocking:
                    threading.Thread(target=close_quietly, args=(gone.env,), daemon=True).start()
                else:
                    close_quietly(gone.env)
            s = None
        if s is None:
            raise HTTPException(
                404, f"no env session {sid!r} (unknown, closed, or expired after {self.ttl_s:g} s idle)")
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

    def peek(self, sid: str) -> EnvSession | None:
        """The session ``sid`` if it is held, without touching its idle clock."""
        return self._sessions.get(sid)

    def pop(self, sid: str) -> EnvSession | None:
        """Remove the session ``sid`` (None if it is not held); the caller closes its env."""
        with self._guard:
            return self._sessions.pop(sid, None)

    def reap(self, now: float | None = None) -> int:
        """Close sessions idle for more than ``ttl_s`` (``now``: a ``time.monotonic()`` value); returns how many."""
        now = time.monotonic() if now is None else now
        with self._guard:
            expired = [k for k, s in self._sessions.items() if now - s.last_used > self.ttl_s and not s.lock.locked()]
            gone = [self._sessions.pop(k) for k in expired]
        for s in gone:
            close_quietly(s.env)
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
    """Background task: close idle sessions every ``period_s`` seconds (default: a quarter of the TTL,
    between 0.05 and 5 s) until cancelled."""
    period = period_s if period_s is not None else min(5.0, max(0.05, sessions.ttl_s / 4))
    while True:
        await asyncio.sleep(period)
        await anyio.to_thread.run_sync(sessions.reap)


# ------------------------------------------------------------------------------------ classes, kwargs
def env_class(env_id: str) -> tuple[type[TextEnv], dict[str, Any]]:
    """(env class, default kwargs) of a registered forkyard id (:func:`envs.env_spec`, plugins included), or of
    Gymnasium's ``"module:Id"`` form when ``module`` is already imported (:func:`import_env_modules` at start-up,
    or a plugin): then ``Id`` is looked up. No module a client names is imported here.

    Raises:
        HTTPException: 404 for an id not registered (or a ``module:`` this server has not imported); 422 for
            a class that is not a TextEnv (the server relies on its declared ``blocking`` /
            ``uses_sandbox``, fork and spaces).
    """
    module, _, name = env_id.rpartition(":")  # no colon: module "", name env_id
    if module and module not in sys.modules:  # never imported on a client's word: the operator names modules
        raise HTTPException(404, f"env id {env_id!r}: this server has not imported {module!r}; a server serves "
                                 "the envs of the modules its operator names (--env-modules, FORKYARD_ENV_MODULES) "
                                 "and of installed plugins, and never imports a module a client names")
    try:
        _, entry, defaults = envs.env_spec(name)
    except KeyError as exc:
        raise HTTPException(404, exc.args[0]) from None
    module, _, name = entry.partition(":")
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise HTTPException(422, f"{env_id} ({entry}) is not an envs.core.TextEnv subclass: this server serves "
                                 "TextEnv subclasses only (it relies on their declared blocking / uses_sandbox, "
                                 "fork and text spaces)")
    return cls, dict(defaults)


def import_env_modules(names: str) -> list[str]:
    """Import the modules ``names`` (comma-separated: ``ServerSettings.env_modules``) so that the envs they
    register are served. Returns the modules imported, in order.

    Raises:
        ValueError: a module that cannot be imported (its name and the error): a server refuses to start
            rather than serve fewer envs than its operator named.
    """
    done = []
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure is the operator's to fix, reported by name
            raise ValueError(f"cannot import the env module {name!r}: {type(exc).__name__}: {exc}") from exc
        done.append(name)
    return done


_SIGNATURES: dict[type, tuple[dict[str, inspect.Parameter], bool, type[BaseModel] | None]] = {}


def _signature(cls: type) -> tuple[dict[str, inspect.Parameter], bool, type[BaseModel] | None]:
    """(named parameters, takes **kwargs, a strict pydantic model of the annotated ones) of ``cls.__init__``."""
    if cls not in _SIGNATURES:
        sig = inspect.signature(cls.__init__)
        params = {k: p for k, p in list(sig.parameters.items())[1:]
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        var_kw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
        try:
            hints = typing.get_type_hints(cls.__init__)
        except Exception:  # noqa: BLE001 - unresolvable annotations: the env checks its own values
            hints = {}
        fields = {k: (hints[k], None) for k in params if k in hints and hints[k] is not Any}
        model = pydantic.create_model(f"{cls.__name__}Kwargs", __config__=pydantic.ConfigDict(
            strict=True, arbitrary_types_allowed=True), **fields) if fields else None
        _SIGNATURES[cls] = (params, var_kw, model)
    return _SIGNATURES[cls]


def check_kwargs(env_id: str, cls: type, kwargs: dict[str, Any]) -> None:
    """Refuse (HTTPException 422, naming them) kwargs the env would not honour: server-decided ones,
    ``gymnasium.make`` keywords, unknown names, and values of the wrong type (strict: ``true`` is not an int)."""
    params, var_kw, model = _signature(cls)
    decided = sorted(k for k in kwargs if k in SERVER_DECIDED_KWARGS)
    if decided:
        raise HTTPException(422, f"kwargs {decided} are decided by this server, not by the client: the server "
                                 f"runs {env_id} (and its sandbox) itself")
    make_kw = sorted(k for k in kwargs if k in GYM_MAKE_KEYWORDS and k not in params)
    if make_kw:
        raise HTTPException(422, f"kwargs {make_kw} are gymnasium.make keywords, which a server session does not "
                                 f"apply (it runs the bare env); use the env's own limits instead, e.g. its turn "
                                 f"budget: accepted kwargs of {env_id}: {_accepted(params)}")
    unknown = sorted(k for k in kwargs if k not in params)
    if unknown and not var_kw:
        raise HTTPException(422, f"{env_id} takes no kwargs {unknown}; accepted: {_accepted(params)}")
    if model is not None:
        try:
            model.model_validate({k: v for k, v in kwargs.items() if k in model.model_fields})
        except pydantic.ValidationError as exc:
            raise HTTPException(422, f"cannot make {env_id}: " + "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None


def _accepted(params: dict[str, inspect.Parameter]) -> list[str]:
    return sorted(k for k in params if k not in SERVER_DECIDED_KWARGS)


__all__ = ["GYM_MAKE_KEYWORDS", "NO_BACKEND_RETRY_S", "SERVER_DECIDED_KWARGS", "SESSIONS_RETRY_S", "EnvRecipe",
           "EnvSession", "EnvSessions", "Slots", "check_kwargs", "close_quietly", "env_class", "import_env_modules",
           "reaper"]
