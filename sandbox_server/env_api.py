"""Env sessions over HTTP: any registered forkyard env, driven with reset / step / fork as plain JSON.

Routes (all under ``/v1/envs``)::

    GET    /v1/envs                   registered env ids with their default kwargs
    POST   /v1/envs                   {env_id, kwargs, seed, options} -> new session + first observation
    GET    /v1/envs/{session_id}      the session's env id, turn and whether its episode ended
    POST   /v1/envs/{session_id}/reset  {seed, options} -> observation, info
    POST   /v1/envs/{session_id}/step   {action} -> observation, reward, terminated, truncated, info
    POST   /v1/envs/{session_id}/fork   {n} -> n new session ids at the same state
    DELETE /v1/envs/{session_id}

Each session owns its own env instance (and, for sandbox-backed envs, its own sandbox). Errors:
404 unknown env id or unknown / expired session; 409 step on an ended episode; 413 an action longer
than the env's action space allows; 422 malformed JSON or invalid kwargs. A failed request leaves the
session unchanged. Sessions idle for longer than ``ttl_s`` seconds are closed by a reaper.

Envs whose class sets ``blocking = True`` (sandbox-backed ones) step in a worker thread, so the event
loop never waits on a sandbox; pure-Python envs (ClueProbe) step inline, which is faster than a thread
hop. Steps of one session are serialised by a per-session lock; different sessions run concurrently.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio
import gymnasium as gym
import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

import envs
from envs.core import EnvInfraError, EpisodeFinishedError

#: Largest fork fan-out one request may ask for.
MAX_FORK = 64


class EnvSpecInfo(BaseModel):
    env_id: str = Field(description="id to pass to POST /v1/envs or gymnasium.make")
    kwargs: dict[str, Any] = Field(description="default constructor kwargs")


class CreateEnvRequest(BaseModel):
    env_id: str = Field(description="a registered forkyard env id, e.g. forkyard/ClueProbe-v0", max_length=200)
    kwargs: dict[str, Any] = Field(default_factory=dict, description="constructor kwargs (JSON values)")
    seed: int | None = Field(default=None, description="reset seed")
    options: dict[str, Any] | None = Field(default=None, description="reset options")


class ResetRequest(BaseModel):
    seed: int | None = None
    options: dict[str, Any] | None = None


class StepRequest(BaseModel):
    action: str = Field(description="one action in forkyard's format, e.g. probe(2)")


class ForkRequest(BaseModel):
    n: int = Field(default=1, ge=1, le=MAX_FORK, description="number of copies")


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
        ttl_s: seconds a session may stay idle before the reaper closes it.
        max_sessions: most sessions at once; more answer 503.
    """

    def __init__(self, ttl_s: float = 600.0, max_sessions: int = 4096):
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._sessions: dict[str, _EnvSession] = {}
        self._guard = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def add(self, env_id: str, env: Any) -> str:
        sid = uuid.uuid4().hex
        with self._guard:
            if len(self._sessions) >= self.max_sessions:
                raise HTTPException(503, f"{self.max_sessions} env sessions are open; close some", headers={"Retry-After": "5"})
            self._sessions[sid] = _EnvSession(env_id, env, bool(getattr(env, "blocking", False)))
        return sid

    def get(self, sid: str) -> _EnvSession:
        s = self._sessions.get(sid)
        if s is None:
            raise HTTPException(404, f"no env session {sid!r} (unknown, closed or expired after {self.ttl_s:g} s idle)")
        s.last_used = time.monotonic()
        return s

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
        with self._guard:
            gone = list(self._sessions.values())
            self._sessions.clear()
        for s in gone:
            _close_quietly(s.env)


def _close_quietly(env: Any) -> None:
    try:
        env.close()
    except Exception:  # noqa: BLE001 - closing must never take the server down
        pass


async def _call(session: _EnvSession, fn, *args):
    if session.blocking:
        return await anyio.to_thread.run_sync(lambda: fn(*args))
    return fn(*args)


def _make_env(env_id: str, kwargs: dict[str, Any]):
    if env_id not in envs.ENV_SPECS:
        raise HTTPException(404, f"unknown env id {env_id!r}; registered: {sorted(envs.ENV_SPECS)}")
    if "server_url" in kwargs:
        raise HTTPException(422, "server_url is not accepted here: this server hosts the env itself")
    try:
        return gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped
    except (TypeError, ValueError) as exc:
        raise HTTPException(422, f"cannot make {env_id} with kwargs {kwargs}: {exc}") from None
    except EnvInfraError as exc:
        raise HTTPException(503, f"{env_id}: {exc}", headers={"Retry-After": "5"}) from None


def _reset_response(sid: str, env: Any, obs: str, info: dict) -> ResetResponse:
    return ResetResponse(
        session_id=sid, observation=obs, info=info,
        observation_max_length=env.observation_space.max_length, action_max_length=env.action_space.max_length,
    )


def build_router(sessions: EnvSessions) -> APIRouter:
    """The ``/v1/envs`` routes over ``sessions``."""
    router = APIRouter(prefix="/v1/envs", tags=["envs"])

    @router.get("", response_model=list[EnvSpecInfo], summary="Registered env ids")
    async def list_envs() -> list[EnvSpecInfo]:
        return [EnvSpecInfo(env_id=k, kwargs=v[1]) for k, v in sorted(envs.ENV_SPECS.items())]

    @router.post("", response_model=ResetResponse, status_code=201, summary="Start an env session (and reset it)")
    async def create(req: CreateEnvRequest) -> ResetResponse:
        env = await anyio.to_thread.run_sync(lambda: _make_env(req.env_id, req.kwargs))
        sid = sessions.add(req.env_id, env)
        s = sessions.get(sid)
        try:
            obs, info = await _call(s, lambda: env.reset(seed=req.seed, options=req.options))
        except (TypeError, ValueError) as exc:
            sessions.pop(sid)
            _close_quietly(env)
            raise HTTPException(422, f"reset failed: {exc}") from None
        return _reset_response(sid, env, obs, info)

    @router.get("/{session_id}", response_model=SessionInfo, summary="A session's state")
    async def get(session_id: str) -> SessionInfo:
        s = sessions.get(session_id)
        return SessionInfo(session_id=session_id, env_id=s.env_id, turn=s.env.turn, done=s.env.done)

    @router.post("/{session_id}/reset", response_model=ResetResponse, summary="Reset a session's env")
    async def reset(session_id: str, req: ResetRequest) -> ResetResponse:
        s = sessions.get(session_id)
        async with s.lock:
            try:
                obs, info = await _call(s, lambda: s.env.reset(seed=req.seed, options=req.options))
            except (TypeError, ValueError) as exc:
                raise HTTPException(422, f"reset failed: {exc}") from None
        return _reset_response(session_id, s.env, obs, info)

    @router.post("/{session_id}/step", response_model=StepResponse, summary="Take one action")
    async def step(session_id: str, req: StepRequest) -> StepResponse:
        s = sessions.get(session_id)
        limit = s.env.action_space.max_length
        if len(req.action) > limit:
            raise HTTPException(413, f"the action has {len(req.action)} characters; this env accepts at most {limit}")
        async with s.lock:
            if s.env.done:
                raise HTTPException(409, "the episode has ended; reset the session (or fork before the end)")
            try:
                obs, reward, term, trunc, info = await _call(s, s.env.step, req.action)
            except EpisodeFinishedError as exc:
                raise HTTPException(409, str(exc)) from None
            except gym.error.ResetNeeded as exc:
                raise HTTPException(409, str(exc)) from None
            except EnvInfraError as exc:
                raise HTTPException(503, f"the env's infrastructure failed: {exc}", headers={"Retry-After": "1"}) from None
        # The hot path: serialise directly (the schema above documents the same fields) instead of
        # validating a StepResponse, which costs more than the ClueProbe step itself.
        return Response(orjson.dumps({"session_id": session_id, "observation": obs, "reward": float(reward),
                                      "terminated": bool(term), "truncated": bool(trunc), "info": info}),
                        media_type="application/json")

    @router.post("/{session_id}/fork", response_model=ForkResponse, summary="Fork a session into n copies")
    async def fork(session_id: str, req: ForkRequest) -> ForkResponse:
        s = sessions.get(session_id)
        async with s.lock:
            try:
                children = await _call(s, s.env.fork, req.n)
            except EnvInfraError as exc:
                raise HTTPException(503, f"fork failed: {exc}", headers={"Retry-After": "1"}) from None
        return ForkResponse(session_id=session_id, session_ids=[sessions.add(s.env_id, c) for c in children])

    @router.delete("/{session_id}", status_code=204, summary="Close a session")
    async def delete(session_id: str) -> Response:
        s = sessions.pop(session_id)
        if s is None:
            raise HTTPException(404, f"no env session {session_id!r}")
        await anyio.to_thread.run_sync(lambda: _close_quietly(s.env))
        return Response(status_code=204)

    return router


async def reaper(sessions: EnvSessions, period_s: float = 5.0) -> None:
    """Background task: close idle sessions every ``period_s`` seconds until cancelled."""
    while True:
        await asyncio.sleep(period_s)
        await anyio.to_thread.run_sync(sessions.reap)


def install(app: Any, sessions: EnvSessions | None = None) -> EnvSessions:
    """Add the env routes to a FastAPI ``app``; returns the session store (also ``app.state.env_sessions``)."""
    sessions = sessions or EnvSessions()
    app.state.env_sessions = sessions
    app.include_router(build_router(sessions))
    return sessions


def create_env_app(ttl_s: float = 600.0):
    """A FastAPI app serving only env sessions (no sandbox pool): enough for ClueProbe."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    sessions = EnvSessions(ttl_s=ttl_s)

    @asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(reaper(sessions))
        try:
            yield
        finally:
            task.cancel()
            sessions.close_all()

    app = FastAPI(title="forkyard env sessions", version="1", lifespan=lifespan)
    install(app, sessions)

    @app.get("/healthz")
    async def healthz(request: Request) -> dict:
        return {"status": "ok", "env_sessions": len(sessions)}

    return app
