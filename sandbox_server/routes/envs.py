"""Env sessions over HTTP: any registered forkyard env, driven with reset / step / fork as plain JSON.

Routes (all under ``/v1/envs``)::

    GET    /v1/envs                     registered env ids with their default kwargs
    POST   /v1/envs                     {env_id, kwargs, seed, options} -> new session + first observation
    GET    /v1/envs/{session_id}        the session's env id, turn and whether its episode ended
    POST   /v1/envs/{session_id}/reset  {seed, options} -> observation, info
    POST   /v1/envs/{session_id}/step   {action} -> observation, reward, terminated, truncated, info
    POST   /v1/envs/{session_id}/fork   {n} -> n new session ids at the same state
    DELETE /v1/envs/{session_id}

Each session owns its own env instance (and, for sandbox-backed envs, its own sandbox); the bookkeeping,
the env classes and kwargs served, and how env code runs are :mod:`sandbox_server.env_sessions`. Every
error answer is an :class:`~sandbox_server.models.ErrorBody` (see :mod:`sandbox_server.http_contract`):
404 unknown env id or unknown / expired session; 409 step on an ended episode; 413 a body over the
route's limit (:func:`body_limit`: the step route's follows the env's action length) or an action longer
than the env's action space allows; 422 malformed JSON, wrong types (strict: ``true`` is not an integer),
a negative seed, or kwargs the env does not take; 503 (with ``Retry-After``) the session cap is reached,
or the env's infrastructure or code failed. A failed create, reset or fork leaves no session behind that
the client was not told of; a failed request leaves existing sessions as they were.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import gymnasium as gym
import orjson
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

import envs
from sandbox_server.deps import Sessions
from sandbox_server.env_sessions import EnvSessions, close_quietly, env_failure, run_env
from sandbox_server.errors import ServiceUnavailable
from sandbox_server.http_contract import ENV_BODY_BYTES
from sandbox_server.http_contract import error_responses as R
from sandbox_server.models import (
    CreateEnvRequest, EnvSpecInfo, ForkRequest, ForkResponse, ResetRequest, ResetResponse, SessionInfo, StepRequest,
    StepResponse,
)
from sandbox_server.routes import V1

PREFIX = f"{V1}/envs"
#: JSON bytes one code point of an action may take at most (``"\ud83d\ude00"``: 12 bytes, 1 code point).
JSON_BYTES_PER_CHAR = 12
#: Bytes of a step body besides its action's characters (the key, quotes, braces, whitespace).
STEP_BODY_OVERHEAD = 1024

router = APIRouter(prefix=PREFIX, tags=["envs"])


def body_limit(sessions: EnvSessions, path: str) -> tuple[int, str] | None:
    """The request-body limit of an env route in bytes, with words for the 413 (None: not an env route).

    A step's limit follows its session's action length (:data:`JSON_BYTES_PER_CHAR` per character plus
    :data:`STEP_BODY_OVERHEAD`); every other env route has :data:`~sandbox_server.http_contract.ENV_BODY_BYTES`."""
    if not path.startswith(PREFIX):
        return None
    parts = path[len(PREFIX):].split("/")  # "", session id, "step"
    s = sessions.peek(parts[1]) if len(parts) == 3 and parts[2] == "step" else None
    if s is None:
        return ENV_BODY_BYTES, ""
    n = s.env.action_space.max_length
    return n * JSON_BYTES_PER_CHAR + STEP_BODY_OVERHEAD, f"this env accepts actions of at most {n} characters"


def _reset_response(sid: str, env: Any, obs: str, info: dict) -> ResetResponse:
    return ResetResponse(
        session_id=sid, observation=obs, info=info,
        observation_max_length=env.observation_space.max_length, action_max_length=env.action_space.max_length,
    )


@router.get("", response_model=list[EnvSpecInfo], summary="Registered env ids", responses=R())
async def list_envs() -> list[EnvSpecInfo]:
    return [EnvSpecInfo(env_id=k, kwargs=v[1]) for k, v in sorted(envs.ENV_SPECS.items())]


@router.post("", response_model=ResetResponse, status_code=201, summary="Start an env session (and reset it)",
             responses=R(404, 413, 422, 503))
async def create(request: Request, req: CreateEnvRequest, sessions: Sessions) -> ResetResponse:
    recipe = sessions.recipe(req.env_id, req.kwargs)
    blocking = recipe.blocking
    with sessions.reserve(1) as slots:
        def build() -> Any:
            env = recipe.cls(**recipe.kwargs, **recipe.extra)
            spec = gym.envs.registry.get(req.env_id)
            if spec is not None:  # as gymnasium.make sets it (the kwargs the env was made with)
                env.spec = dataclasses.replace(spec, kwargs=dict(recipe.kwargs))
            return env

        try:
            env = await run_env(blocking, build)
        except Exception as exc:
            raise env_failure(exc, f"cannot make {req.env_id} with kwargs {req.kwargs}", True)
        try:
            try:
                obs, info = await run_env(blocking, lambda: env.reset(seed=req.seed, options=req.options))
            except Exception as exc:
                raise env_failure(exc, "reset", True)
            if await request.is_disconnected():  # nobody will learn of this session: keep nothing
                raise ServiceUnavailable("the client closed the connection before its session was made")
            sid = slots.commit(req.env_id, [env], blocking)[0]
        except BaseException:
            await run_env(blocking, lambda: close_quietly(env))
            raise
    return _reset_response(sid, env, obs, info)


@router.get("/{session_id}", response_model=SessionInfo, summary="A session's state", responses=R(404))
async def get(session_id: str, sessions: Sessions) -> SessionInfo:
    s = sessions.get(session_id)
    return SessionInfo(session_id=session_id, env_id=s.env_id, turn=s.env.turn, done=s.env.done)


@router.post("/{session_id}/reset", response_model=ResetResponse, summary="Reset a session's env",
             responses=R(404, 413, 422, 503))
async def reset(session_id: str, req: ResetRequest, sessions: Sessions) -> ResetResponse:
    s = sessions.get(session_id)
    async with s.lock:
        try:
            obs, info = await run_env(s.blocking, lambda: s.env.reset(seed=req.seed, options=req.options))
        except Exception as exc:
            raise env_failure(exc, "reset", True)
    return _reset_response(session_id, s.env, obs, info)


@router.post("/{session_id}/step", response_model=StepResponse, summary="Take one action",
             responses=R(404, 409, 413, 422, 503))
async def step(session_id: str, req: StepRequest, sessions: Sessions) -> Response:
    s = sessions.get(session_id)
    limit = s.env.action_space.max_length
    if len(req.action) > limit:
        raise HTTPException(413, f"the action has {len(req.action)} characters; this env accepts at most {limit}")
    async with s.lock:
        if s.env.done:
            raise HTTPException(409, "the episode has ended; reset the session (or fork before the end)")
        try:
            obs, reward, term, trunc, info = await run_env(s.blocking, lambda: s.env.step(req.action))
        except Exception as exc:
            raise env_failure(exc, "step", False)
    # The hot path: serialise directly (the schema above documents the same fields) instead of
    # validating a StepResponse, which costs more than the ClueProbe step itself.
    return Response(orjson.dumps({"session_id": session_id, "observation": obs, "reward": float(reward),
                                  "terminated": bool(term), "truncated": bool(trunc), "info": info}),
                    media_type="application/json")


@router.post("/{session_id}/fork", response_model=ForkResponse, summary="Fork a session into n copies",
             responses=R(404, 413, 422, 503))
async def fork(request: Request, session_id: str, req: ForkRequest, sessions: Sessions) -> ForkResponse:
    s = sessions.get(session_id)
    async with s.lock:
        with sessions.reserve(req.n) as slots:  # room for all n first: all or none
            try:
                children = await run_env(s.blocking, lambda: s.env.fork(req.n))
            except Exception as exc:
                raise env_failure(exc, "fork", False)
            try:
                if await request.is_disconnected():  # nobody will learn of these sessions: keep nothing
                    raise ServiceUnavailable("the client closed the connection before its forks were made")
                sids = slots.commit(s.env_id, list(children), s.blocking)
            except BaseException:
                await run_env(s.blocking, lambda: [close_quietly(c) for c in children])
                raise
    return ForkResponse(session_id=session_id, session_ids=sids)


@router.delete("/{session_id}", status_code=204, summary="Close a session", responses=R(404))
async def delete(session_id: str, sessions: Sessions) -> Response:
    s = sessions.pop(session_id)
    if s is None:
        raise HTTPException(404, f"no env session {session_id!r}")
    await anyio.to_thread.run_sync(lambda: close_quietly(s.env))
    return Response(status_code=204)
