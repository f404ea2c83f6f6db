"""Env sessions over HTTP: any registered forkyard env, driven with reset / step / fork as plain JSON.

Routes (all under ``/v1/envs``)::

    GET    /v1/envs                   registered env ids with their default kwargs
    POST   /v1/envs                   {env_id, kwargs, seed, options} -> new session + first observation
    GET    /v1/envs/{session_id}      the session's env id, turn and whether its episode ended
    POST   /v1/envs/{session_id}/reset  {seed, options} -> observation, info
    POST   /v1/envs/{session_id}/step   {action} -> observation, reward, terminated, truncated, info
    POST   /v1/envs/{session_id}/fork   {n} -> n new session ids at the same state
    DELETE /v1/envs/{session_id}

Each session owns its own env instance (and, for sandbox-backed envs, its own sandbox). Every error
answer is an :class:`~sandbox_server.models.ErrorBody` (see :mod:`sandbox_server.http_contract`):
404 unknown env id or unknown / expired session; 409 step on an ended episode; 413 a body over the
route's limit (the step route's limit follows the env's action length) or an action longer than the
env's action space allows; 422 malformed JSON, wrong types (strict: ``true`` is not an integer),
a negative seed, or kwargs the env does not take; 503 (with ``Retry-After``) the session cap is
reached, or the env's infrastructure or code failed. A failed create, reset or fork leaves no session
behind that the client was not told of; a failed request leaves existing sessions as they were.
Sessions idle for longer than ``ttl_s`` seconds are closed (the reaper, and any lookup after expiry).

Kwargs: the server builds the env class itself (not through ``gymnasium.make``, whose wrappers the
session would lose), so a kwarg is either a parameter of the env's constructor, checked with strict
types, or refused with 422 naming it: ``gymnasium.make`` keywords (``max_episode_steps``,
``disable_env_checker``, ``autoreset``, ``apply_api_compatibility``; use the env's own turn budget)
and what the server decides (``backend``, ``server_url``, ``sandbox_provider``, ``corpus_dir``) included.
Envs whose class sets ``uses_sandbox = True`` (FileQA) get the server's own sandbox service as
``sandbox_provider``; a server without one refuses them.

Envs whose class sets ``blocking = True`` (sandbox-backed ones) run in a worker thread, so the event
loop never waits on a sandbox; pure-Python envs (ClueProbe) step inline, which is faster than a thread
hop. Steps of one session are serialised by a per-session lock; different sessions run concurrently.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import threading
import time
import typing
import uuid
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import anyio
import gymnasium as gym
import orjson
import pydantic
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

import envs
from envs.core import EnvInfraError, EpisodeFinishedError
from sandbox_server import http_contract
from sandbox_server.errors import SandboxError, ServiceUnavailable, ToolRefused
from sandbox_server.models import ForkRequest, RequestModel

#: Most bytes of a request body on the env routes other than step (kwargs, options, fork counts).
ENV_BODY_LIMIT = 64 << 10
#: JSON bytes one code point of an action may take at most (``"\ud83d\ude00"``: 12 bytes, 1 code point).
_JSON_BYTES_PER_CHAR = 12
#: ``gymnasium.make``'s own keywords (and those of older Gymnasium versions): never passed on silently.
GYM_MAKE_KEYWORDS = frozenset(
    {p for p in inspect.signature(gym.make).parameters if p not in ("id", "kwargs")}
    | {"max_episode_steps", "disable_env_checker", "autoreset", "apply_api_compatibility", "order_enforce"})
#: Kwargs the server decides, never the client: where the env's sandbox runs and what it reads.
SERVER_DECIDED_KWARGS = frozenset({"backend", "server_url", "sandbox_provider", "corpus_dir"})


class EnvSpecInfo(BaseModel):
    env_id: str = Field(description="id to pass to POST /v1/envs or gymnasium.make")
    kwargs: dict[str, Any] = Field(description="default constructor kwargs")


class CreateEnvRequest(RequestModel):
    """``POST /v1/envs``."""

    env_id: str = Field(description="a registered forkyard env id, e.g. forkyard/ClueProbe-v0", max_length=200)
    kwargs: dict[str, Any] = Field(default_factory=dict, description="constructor kwargs (JSON values)")
    seed: int | None = Field(default=None, ge=0, description="reset seed (a non-negative integer)")
    options: dict[str, Any] | None = Field(default=None, description="reset options")


class ResetRequest(RequestModel):
    """``POST /v1/envs/{session_id}/reset``."""

    seed: int | None = Field(default=None, ge=0, description="reset seed (a non-negative integer)")
    options: dict[str, Any] | None = Field(default=None, description="reset options")


class StepRequest(RequestModel):
    """``POST /v1/envs/{session_id}/step``."""

    action: str = Field(description="one action in forkyard's format, e.g. probe(2)")


class ResetResponse(BaseModel):
    session_id: str
    observation: str
    info: dict[str, Any] = Field(description="turn, anchor_key, legal_actions (finite action sets)")
    observation_max_length: int = Field(description="max code points of an observation")
    action_max_length: int = Field(description="max code points of an action")


class StepResponse(BaseModel):
    session_id: str
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = Field(description="turn, anchor_key, legal_actions, termination_reason at the end")


class ForkResponse(BaseModel):
    session_id: str = Field(description="the parent session")
    session_ids: list[str] = Field(description="the new sessions, each at the parent's state")


class SessionInfo(BaseModel):
    session_id: str
    env_id: str
    turn: int
    done: bool


class EnvHealth(BaseModel):
    status: typing.Literal["ok"]
    env_sessions: int = Field(description="env sessions held now")


@dataclass
class _EnvSession:
    env_id: str
    env: Any
    blocking: bool
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)


class EnvSessions:
    """The env sessions of one server: create, look up, fork, close, reap idle ones.

    Args:
        ttl_s: seconds a session may stay idle before it is closed.
        max_sessions: most sessions at once; creates and forks past it answer 503.
        sandbox_provider: the sandbox service that sandbox-backed envs (``uses_sandbox = True``) take
            their sandboxes from; None: such envs are refused (see ``sandbox_unavailable``).

    Attributes:
        sandbox_unavailable: why the server's sandbox service is down (then sandbox-backed envs answer
            503), or None when there is none by design (they answer 422).
    """

    def __init__(self, ttl_s: float = 600.0, max_sessions: int = 256, sandbox_provider: Any = None):
        if not ttl_s > 0 or max_sessions < 1:
            raise ValueError(f"need ttl_s > 0 and max_sessions >= 1, got {ttl_s!r}, {max_sessions!r}")
        self.ttl_s = float(ttl_s)
        self.max_sessions = int(max_sessions)
        self.sandbox_provider = sandbox_provider
        self.sandbox_unavailable: str | None = None
        self._sessions: dict[str, _EnvSession] = {}
        self._reserved = 0
        self._closed = False
        self._guard = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    @contextmanager
    def reserve(self, n: int) -> Iterator["_Slots"]:
        """Hold room for ``n`` new sessions while they are made (503 if the cap has no room or the
        server is shutting down). :meth:`_Slots.commit` registers them; leaving the block without a
        commit gives the room back."""
        with self._guard:
            if self._closed:
                raise ServiceUnavailable("the server is shutting down", retry_after_s=5.0)
            if len(self._sessions) + self._reserved + n > self.max_sessions:
                raise ServiceUnavailable(
                    f"{len(self._sessions) + self._reserved} of {self.max_sessions} env sessions are in use and "
                    f"{n} more were asked for; close some (DELETE /v1/envs/{{id}})", retry_after_s=5.0)
            self._reserved += n
        slots = _Slots(self, n)
        try:
            yield slots
        finally:
            if not slots.committed:
                with self._guard:
                    self._reserved -= n

    def _commit(self, slots: "_Slots", env_id: str, env_list: list[Any], blocking: bool) -> list[str]:
        with self._guard:
            if self._closed:
                raise ServiceUnavailable("the server is shutting down", retry_after_s=5.0)
            sids = [uuid.uuid4().hex for _ in env_list]
            for sid, env in zip(sids, env_list):
                self._sessions[sid] = _EnvSession(env_id, env, blocking)
            self._reserved -= len(env_list)  # the room held for them is now theirs
            slots.committed = True
            return sids

    def get(self, sid: str) -> _EnvSession:
        """The live session ``sid`` (its idle clock restarts); 404 if unknown, closed or expired."""
        now = time.monotonic()
        s = self._sessions.get(sid)
        if s is not None and now - s.last_used > self.ttl_s and not s.lock.locked():
            with self._guard:
                gone = self._sessions.pop(sid, None)
            if gone is not None:  # expired: closed now (in a thread if closing blocks), not at the next reap
                if gone.blocking:
                    threading.Thread(target=_close_quietly, args=(gone.env,), daemon=True).start()
                else:
                    _close_quietly(gone.env)
            s = None
        if s is None:
            raise HTTPException(404, f"no env session {sid!r} (unknown, closed, or expired after {self.ttl_s:g} s idle)")
        s.last_used = now
        return s

    def peek(self, sid: str) -> _EnvSession | None:
        """The session ``sid`` if it is held, without touching its idle clock."""
        return self._sessions.get(sid)

    def pop(self, sid: str) -> _EnvSession | None:
        with self._guard:
            return self._sessions.pop(sid, None)

    def reap(self, now: float | None = None) -> int:
        """Close sessions idle for more than ``ttl_s``; returns how many."""
        now = time.monotonic() if now is None else now
        with self._guard:
            expired = [sid for sid, s in self._sessions.items() if now - s.last_used > self.ttl_s and not s.lock.locked()]
            gone = [self._sessions.pop(sid) for sid in expired]
        for s in gone:
            _close_quietly(s.env)
        return len(gone)

    def close_all(self) -> None:
        """Close every session; sessions being made now are closed instead of registered."""
        with self._guard:
            self._closed = True
            gone = list(self._sessions.values())
            self._sessions.clear()
        for s in gone:
            _close_quietly(s.env)

    def body_limit(self, path: str) -> tuple[int, str] | None:
        """The request-body limit of an env route (see :class:`sandbox_server.http_contract.BodyLimit`):
        the step route's follows the session's action length; other env routes have :data:`ENV_BODY_LIMIT`."""
        if not path.startswith("/v1/envs"):
            return None
        parts = path.split("/")  # "", "v1", "envs", session id, "step"
        s = self.peek(parts[3]) if len(parts) == 5 and parts[4] == "step" else None
        if s is None:
            return ENV_BODY_LIMIT, ""
        n = s.env.action_space.max_length
        return n * _JSON_BYTES_PER_CHAR + 1024, f"this env accepts actions of at most {n} characters"


class _Slots:
    """Room reserved in an :class:`EnvSessions` for sessions being made (see :meth:`EnvSessions.reserve`)."""

    def __init__(self, store: EnvSessions, n: int):
        self._store, self._n = store, n
        self.committed = False

    def commit(self, env_id: str, env_list: list[Any], blocking: bool) -> list[str]:
        """Register the envs as sessions; raises (registering none) if the server is shutting down. The
        caller closes the envs when this raises."""
        if len(env_list) != self._n:
            raise EnvInfraError(f"the env made {len(env_list)} copies instead of {self._n}")
        return self._store._commit(self, env_id, env_list, blocking)


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing must never take the server down
        pass


async def _run(blocking: bool, fn):
    """Call ``fn()``: in a worker thread for blocking envs, inline otherwise."""
    if blocking:
        return await anyio.to_thread.run_sync(fn)
    return fn()


_PASS_ON = (HTTPException, EnvInfraError, EpisodeFinishedError, gym.error.ResetNeeded, SandboxError, ToolRefused)


def _env_failure(exc: Exception, what: str, client_values: bool) -> Exception:
    """What to raise for an exception of env code: domain errors as they are (the one mapping,
    :data:`sandbox_server.http_contract.DOMAIN_ERRORS`, answers them); with ``client_values`` (kwargs,
    seed, options came from the client) TypeError / ValueError / Gymnasium errors are 422; anything else
    is the env's failure: :class:`EnvInfraError` (503), never a 500."""
    if isinstance(exc, _PASS_ON):
        return exc
    if client_values and isinstance(exc, (TypeError, ValueError, gym.error.Error)):
        return HTTPException(422, f"{what}: {exc}")
    return EnvInfraError(f"{what} failed: {type(exc).__name__}: {exc}")


def _env_class(env_id: str) -> tuple[type, dict[str, Any]]:
    if env_id not in envs.ENV_SPECS:
        raise HTTPException(404, f"unknown env id {env_id!r}; registered: {sorted(envs.ENV_SPECS)}")
    entry, defaults = envs.ENV_SPECS[env_id]
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name), dict(defaults)


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


def _check_kwargs(env_id: str, cls: type, kwargs: dict[str, Any]) -> None:
    """Refuse (422, naming them) kwargs the env would not honour: server-decided ones, ``gymnasium.make``
    keywords, unknown names, and values of the wrong type (strict: ``true`` is not an int)."""
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


def _reset_response(sid: str, env: Any, obs: str, info: dict) -> ResetResponse:
    return ResetResponse(
        session_id=sid, observation=obs, info=info,
        observation_max_length=env.observation_space.max_length, action_max_length=env.action_space.max_length,
    )


_R = http_contract.error_responses


def build_router(sessions: EnvSessions) -> APIRouter:
    """The ``/v1/envs`` routes over ``sessions``."""
    router = APIRouter(prefix="/v1/envs", tags=["envs"])

    def resolve(env_id: str, kwargs: dict[str, Any]) -> tuple[type, dict[str, Any], dict[str, Any]]:
        """(env class, kwargs with the spec's defaults, kwargs the server adds), or 404 / 422 / 503."""
        cls, defaults = _env_class(env_id)
        _check_kwargs(env_id, cls, kwargs)
        merged = {**defaults, **kwargs}
        extra: dict[str, Any] = {}
        if getattr(cls, "uses_sandbox", False):
            if sessions.sandbox_provider is None:
                if sessions.sandbox_unavailable:
                    raise ServiceUnavailable(f"{env_id} needs a sandbox and this server's sandbox service is down: "
                                             f"{sessions.sandbox_unavailable}", retry_after_s=10.0)
                raise HTTPException(422, f"{env_id} needs a sandbox and this server has no sandbox service: run "
                                         "the full server (python -m sandbox_server) to serve it")
            extra["sandbox_provider"] = sessions.sandbox_provider
        return cls, merged, extra

    @router.get("", response_model=list[EnvSpecInfo], summary="Registered env ids", responses=_R())
    async def list_envs() -> list[EnvSpecInfo]:
        return [EnvSpecInfo(env_id=k, kwargs=v[1]) for k, v in sorted(envs.ENV_SPECS.items())]

    @router.post("", response_model=ResetResponse, status_code=201, summary="Start an env session (and reset it)",
                 responses=_R(404, 413, 422, 503))
    async def create(request: Request, req: CreateEnvRequest) -> ResetResponse:
        cls, kwargs, extra = resolve(req.env_id, req.kwargs)
        blocking = bool(getattr(cls, "blocking", False))
        with sessions.reserve(1) as slots:
            def build() -> Any:
                env = cls(**kwargs, **extra)
                spec = gym.envs.registry.get(req.env_id)
                if spec is not None:  # as gymnasium.make sets it (the kwargs the env was made with)
                    env.spec = dataclasses.replace(spec, kwargs=dict(kwargs))
                return env

            try:
                env = await _run(blocking, build)
            except Exception as exc:
                raise _env_failure(exc, f"cannot make {req.env_id} with kwargs {req.kwargs}", True)
            try:
                try:
                    obs, info = await _run(blocking, lambda: env.reset(seed=req.seed, options=req.options))
                except Exception as exc:
                    raise _env_failure(exc, "reset", True)
                if await request.is_disconnected():  # nobody will learn of this session: keep nothing
                    raise ServiceUnavailable("the client closed the connection before its session was made")
                sid = slots.commit(req.env_id, [env], blocking)[0]
            except BaseException:
                await _run(blocking, lambda: _close_quietly(env))
                raise
        return _reset_response(sid, env, obs, info)

    @router.get("/{session_id}", response_model=SessionInfo, summary="A session's state", responses=_R(404))
    async def get(session_id: str) -> SessionInfo:
        s = sessions.get(session_id)
        return SessionInfo(session_id=session_id, env_id=s.env_id, turn=s.env.turn, done=s.env.done)

    @router.post("/{session_id}/reset", response_model=ResetResponse, summary="Reset a session's env",
                 responses=_R(404, 413, 422, 503))
    async def reset(session_id: str, req: ResetRequest) -> ResetResponse:
        s = sessions.get(session_id)
        async with s.lock:
            try:
                obs, info = await _run(s.blocking, lambda: s.env.reset(seed=req.seed, options=req.options))
            except Exception as exc:
                raise _env_failure(exc, "reset", True)
        return _reset_response(session_id, s.env, obs, info)

    @router.post("/{session_id}/step", response_model=StepResponse, summary="Take one action",
                 responses=_R(404, 409, 413, 422, 503))
    async def step(session_id: str, req: StepRequest) -> Response:
        s = sessions.get(session_id)
        limit = s.env.action_space.max_length
        if len(req.action) > limit:
            raise HTTPException(413, f"the action has {len(req.action)} characters; this env accepts at most {limit}")
        async with s.lock:
            if s.env.done:
                raise HTTPException(409, "the episode has ended; reset the session (or fork before the end)")
            try:
                obs, reward, term, trunc, info = await _run(s.blocking, lambda: s.env.step(req.action))
            except Exception as exc:
                raise _env_failure(exc, "step", False)
        # The hot path: serialise directly (the schema above documents the same fields) instead of
        # validating a StepResponse, which costs more than the ClueProbe step itself.
        return Response(orjson.dumps({"session_id": session_id, "observation": obs, "reward": float(reward),
                                      "terminated": bool(term), "truncated": bool(trunc), "info": info}),
                        media_type="application/json")

    @router.post("/{session_id}/fork", response_model=ForkResponse, summary="Fork a session into n copies",
                 responses=_R(404, 413, 422, 503))
    async def fork(request: Request, session_id: str, req: ForkRequest) -> ForkResponse:
        s = sessions.get(session_id)
        async with s.lock:
            with sessions.reserve(req.n) as slots:  # room for all n first: all or none
                try:
                    children = await _run(s.blocking, lambda: s.env.fork(req.n))
                except Exception as exc:
                    raise _env_failure(exc, "fork", False)
                try:
                    if await request.is_disconnected():  # nobody will learn of these sessions: keep nothing
                        raise ServiceUnavailable("the client closed the connection before its forks were made")
                    sids = slots.commit(s.env_id, list(children), s.blocking)
                except BaseException:
                    await _run(s.blocking, lambda: [_close_quietly(c) for c in children])
                    raise
        return ForkResponse(session_id=session_id, session_ids=sids)

    @router.delete("/{session_id}", status_code=204, summary="Close a session", responses=_R(404))
    async def delete(session_id: str) -> Response:
        s = sessions.pop(session_id)
        if s is None:
            raise HTTPException(404, f"no env session {session_id!r}")
        await anyio.to_thread.run_sync(lambda: _close_quietly(s.env))
        return Response(status_code=204)

    return router


async def reaper(sessions: EnvSessions, period_s: float | None = None) -> None:
    """Background task: close idle sessions every ``period_s`` seconds (default: a quarter of the TTL,
    at most 5 s) until cancelled."""
    period = period_s if period_s is not None else min(5.0, max(0.05, sessions.ttl_s / 4))
    while True:
        await asyncio.sleep(period)
        await anyio.to_thread.run_sync(sessions.reap)


def install(app: Any, sessions: EnvSessions | None = None) -> EnvSessions:
    """Add the env routes to a FastAPI ``app``; returns the session store (also ``app.state.env_sessions``).

    The caller's lifespan runs :func:`reaper` and calls :meth:`EnvSessions.close_all` at shutdown."""
    if sessions is None:
        sessions = EnvSessions()
    app.state.env_sessions = sessions
    app.include_router(build_router(sessions))
    return sessions


def create_env_app(ttl_s: float | None = None, max_sessions: int | None = None, *, sandbox_provider: Any = None,
                   max_body_bytes: int | None = None) -> FastAPI:
    """A FastAPI app serving only env sessions (enough for ClueProbe).

    Args:
        ttl_s: seconds an env session may stay idle (default: ``env_ttl_s`` of
            :meth:`ServiceConfig.from_env`, i.e. ``$FORKYARD_ENV_TTL_S`` or 600).
        max_sessions: most env sessions at once (default: ``max_env_sessions``, ``$FORKYARD_MAX_ENV_SESSIONS``).
        sandbox_provider: a started sandbox service for sandbox-backed envs (FileQA); without one they
            are refused with 422. The caller keeps ownership (it is not closed here).
        max_body_bytes: request-body limit (env routes have smaller ones, see :meth:`EnvSessions.body_limit`).
    """
    from sandbox_server.service import ServiceConfig

    cfg = ServiceConfig.from_env()
    sessions = EnvSessions(ttl_s=cfg.env_ttl_s if ttl_s is None else ttl_s,
                           max_sessions=cfg.max_env_sessions if max_sessions is None else max_sessions,
                           sandbox_provider=sandbox_provider)

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(reaper(sessions))
        try:
            yield
        finally:
            task.cancel()
            await anyio.to_thread.run_sync(sessions.close_all)

    app = FastAPI(title="forkyard env sessions", version="1", lifespan=lifespan,
                  description="Env sessions (/v1/envs) for every registered forkyard env. Every error answer is "
                              "an ErrorBody {detail, status}.")
    http_contract.install(app, max_body_bytes=max_body_bytes or ENV_BODY_LIMIT, route_limit=sessions.body_limit)
    install(app, sessions)

    @app.get("/healthz", response_model=EnvHealth, tags=["health"], responses=_R())
    async def healthz(request: Request) -> EnvHealth:
        return EnvHealth(status="ok", env_sessions=len(sessions))

    return app
