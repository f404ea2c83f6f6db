"""OpenEnv's env-server protocol, served by forkyard for every registered env, with a fork extension.

Addressing: each env id has its own base path, ``/openenv/{env_id}``; an OpenEnv client takes it as its
``base_url`` and appends what the protocol names::

    base_url = "http://127.0.0.1:8000/openenv/forkyard/ClueProbe-v0"
    WS   {base_url}/ws          one env session per connection (the stateful path)
    POST {base_url}/reset       stateless: a fresh env, reset, closed again (its first observation)
    POST {base_url}/step        409: a forkyard episode is stateful; step over /ws (or /v1/envs)
    GET  {base_url}/state       {"episode_id": null, "step_count": 0} (no session outside /ws)
    GET  {base_url}/schema      JSON schemas of the action, observation and state
    GET  {base_url}/health      {"status": "healthy"}
    GET  {base_url}/metadata    name, description, version

    GET  /openenv/list_environments   the env ids served, a JSON list of strings (OpenEnv's listing, at the root
                                      its env paths hang from; the same catalog as GET /v1/envs)

WebSocket messages (``{"type": ..., "data": {...}}``, answered in order, one answer per message):

* ``reset`` ``{seed?, episode_id?, options?, kwargs?, snapshot?}`` -> ``observation``. The connection's
  session is made at its first reset with the env's constructor ``kwargs`` (the same checks as
  ``POST /v1/envs``); a later reset with other ``kwargs`` replaces it. ``snapshot`` (a token) restores the
  sealed state into a new session instead of a seeded reset.
* ``step`` ``{action: str | object, metadata?}`` (or OpenEnv's ``CallToolAction``, ``{type: "call_tool",
  tool_name, arguments}``) -> ``observation``: the env reads the action with the one reader of tool calls
  (field case S62); one it cannot read is answered with its invalid-action observation.
* ``state`` -> ``state`` ``{episode_id, step_count, session_id, env_id, done, info}``.
* ``close``: ends the connection; its session is deleted (and so it is when the connection drops, which
  uvicorn's WebSocket pings detect: ``--ws-ping-interval`` + ``--ws-ping-timeout``, 20 + 20 s by default).
  While the connection is open, its session and the forks it owns never expire, however long the client
  thinks between messages (field case S48): the idle TTL reclaims only sessions no connection holds.

An observation answer's ``data`` is ``{"observation": {"text", "info", "terminated", "truncated",
"session_id"}, "reward": float | null, "done": bool}`` (resets and attaches add the env's
``observation_max_length`` and ``action_max_length``); ``info`` is forkyard's (``turn``, ``anchor_key``,
``legal_actions``, ``termination_reason`` at the end). An error answer's ``data`` is ``{"message", "code",
"status", "http_status", "retry_after_s"?}``: ``code`` is OpenEnv's (``VALIDATION_ERROR``,
``UNKNOWN_TYPE``, ``INVALID_JSON``, ``CAPACITY_REACHED``, ``SESSION_ERROR``, ``EXECUTION_ERROR``), the others
say what ``/v1/envs`` would have answered. A bad message never closes the connection.

The fork extension (message types a client that does not know them never sends):

* ``fork`` ``{n}`` -> ``fork`` ``{"session_ids": [...]}``: n new sessions at this session's state. They
  belong to this connection until another connection attaches them; when this connection ends, those
  not attached are deleted.
* ``attach`` ``{session_id}`` -> ``observation`` (the session's latest observation): this connection now
  drives that session (a fork's child, or a ``/v1/envs`` session of the same env id) and deletes it when
  it ends; from then on only this connection may act on it. A session another connection drives is refused
  (409 ``held``).
* ``tools`` -> ``tools`` ``{"tools": [...]}``: the session's tools as JSON-schema definitions (what
  ``GET /v1/envs/{id}/tools`` answers for a session no connection holds).
* ``snapshot`` -> ``snapshot`` ``{"snapshot": token}``: the session's state sealed
  (:mod:`sandbox_server.snapshot_tokens`: opaque and authenticated); ``reset`` with it restores it.
* ``delete`` ``{session_ids}`` -> ``deleted`` ``{"deleted": [...], "missing": [...]}``: many sessions
  (a fork's children) closed in one message: this connection's own, or sessions no connection holds (made
  over ``/v1/envs``), of this env id; a session another connection holds is refused (409 ``held``), and
  then none is deleted.

Ownership (field case S58): the sessions a connection holds (its own, its forks, the ones it attached) are
acted on only through it until it closes; every ``/v1/envs`` route and batch item and every other connection
is refused 409 ``held`` (the one rule, :mod:`sandbox_server.session_owners`, checked by the session host).
Size and fairness (field cases S55, S56): a message over ``WS_MESSAGE_BYTES`` is answered 413 before it is
parsed and the connection goes on; messages are answered one at a time and each answer yields the event loop
to other connections (:mod:`sandbox_server.openenv_flow`).

Why one file: the wire models, the WebSocket messages and the HTTP routes are one protocol, read against
OpenEnv's own (``openenv/core/env_server/http_server.py`` and ``types.py`` of openenv-core).

Every operation is :class:`sandbox_server.session_host.SessionHost`'s, the same as ``/v1/envs``'s: sessions
made here count against the same cap; over ``/v1/envs`` they answer 409 ``held`` while a connection holds them.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import anyio
import gymnasium as gym
import orjson
import pydantic
from fastapi import APIRouter, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

import envs
from envs.errors import InvalidValue, SessionNotFound
from sandbox_server.env_sessions import env_class
from sandbox_server.errors import CapacityReached, ServiceUnavailable
from sandbox_server.http_contract import STATUS_WORDS, classify
from sandbox_server.http_contract import error_responses as R
from sandbox_server.models import MAX_CLONES, RequestModel
from sandbox_server.openenv_flow import serve
from sandbox_server.session_census import TRANSPORT
from sandbox_server.session_host import SessionHost

PREFIX = "/openenv"
log = logging.getLogger("forkyard.openenv")
router = APIRouter(prefix=PREFIX, tags=["openenv"])


# ------------------------------------------------------------------------------------ wire models
class TextAction(BaseModel):
    """An action: one tool call, as text (forkyard's ``probe(2)`` / ``probe(k=2)``, or a model's reply holding
    one call: ``<tool_call>{...}</tool_call>``, bare JSON) or as a JSON call object; the env reads it with the
    one reader of tool calls (``envs.action_input``, field case S62)."""

    action: str | dict[str, Any] | list[Any] = Field(description="probe(2), a model's reply with one tool call, or "
                                                                 '{"name": "probe", "arguments": {"k": 2}}')
    metadata: dict[str, Any] = Field(default_factory=dict)


class TextObservation(BaseModel):
    """An observation (the ``observation`` field of an observation answer)."""

    text: str
    info: dict[str, Any] = Field(description="turn, anchor_key, legal_actions; termination_reason at the end")
    terminated: bool
    truncated: bool
    session_id: str
    observation_max_length: int | None = Field(default=None, description="resets and attaches: max code points")
    action_max_length: int | None = Field(default=None, description="resets and attaches: max code points")


class EnvState(BaseModel):
    """A ``state`` answer."""

    episode_id: str | None = None
    step_count: int = 0
    session_id: str | None = None
    env_id: str | None = None
    done: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class ResetData(RequestModel):
    """``reset`` data (and the stateless ``POST .../reset`` body)."""

    seed: int | None = Field(default=None, ge=0)
    episode_id: str | None = Field(default=None, max_length=255)
    options: dict[str, Any] | None = None
    kwargs: dict[str, Any] | None = None
    snapshot: str | None = None


class ForkData(RequestModel):
    n: int = Field(default=1, ge=1, le=MAX_CLONES)


class AttachData(RequestModel):
    session_id: str = Field(max_length=200)


class DeleteData(RequestModel):
    session_ids: list[str] = Field(max_length=MAX_CLONES * 4)


_CODES = {404: "SESSION_ERROR", 409: "EXECUTION_ERROR", 413: "VALIDATION_ERROR", 422: "VALIDATION_ERROR"}


def error_message(exc: BaseException) -> dict[str, Any]:
    """The OpenEnv ``error`` answer to ``exc``: the status ``/v1/envs`` would answer, with OpenEnv's code."""
    if isinstance(exc, pydantic.ValidationError):
        status, word = 422, "invalid"
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'data'}: {e['msg']}" for e in exc.errors())
    elif isinstance(exc, StarletteHTTPException):
        status, detail = exc.status_code, str(exc.detail)
        word = STATUS_WORDS.get(status, "error")
    elif (known := classify(exc)) is not None:
        (status, word), detail = known, str(exc) or type(exc).__name__
    else:
        log.error("unexpected error in an OpenEnv message", exc_info=exc)
        status, word, detail = 500, "internal", f"internal error ({type(exc).__name__}); the server logged it"
    code = "CAPACITY_REACHED" if isinstance(exc, CapacityReached) else _CODES.get(status, "EXECUTION_ERROR")
    data: dict[str, Any] = {"message": detail, "code": code, "status": word, "http_status": status}
    if isinstance(exc, ServiceUnavailable):
        data["retry_after_s"] = exc.retry_after_s
    return {"type": "error", "data": data}


def _observation(sid: str, obs: str, info: dict, reward: float | None, term: bool, trunc: bool,
                 done: bool | None = None, env: Any = None) -> dict[str, Any]:
    """An observation answer; with ``env`` (resets and attaches) it carries the env's text-space sizes."""
    o = {"text": obs, "info": info, "terminated": term, "truncated": trunc, "session_id": sid}
    if env is not None:
        o["observation_max_length"] = env.observation_space.max_length
        o["action_max_length"] = env.action_space.max_length
    return {"type": "observation", "data": {"observation": o, "reward": reward,
                                            "done": (term or trunc) if done is None else done}}


# ------------------------------------------------------------------------------------ one connection
class Connection:
    """The state of one WebSocket connection: the session it drives and the forks it still owns. It is the
    holder (``by``) of those sessions in the host's one ownership rule (:mod:`sandbox_server.session_owners`).

    Args:
        host: the server's session host.
        env_id: the env id of the connection's base path.
    """

    def __init__(self, host: SessionHost, env_id: str, owners: Any = None):  # owners: unused, kept for callers
        self.host, self.env_id = host, env_id
        self.sid: str | None = None
        self.kwargs: dict[str, Any] | None = None
        self.episode_id: str | None = None
        self.forks: set[str] = set()

    async def handle(self, raw: str | bytes) -> dict[str, Any] | None:
        """The answer to one message (None: the client closed the session)."""
        try:
            msg = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return {"type": "error", "data": {"message": f"Invalid JSON: {exc}", "code": "INVALID_JSON",
                                              "status": "invalid", "http_status": 422}}
        kind = msg.get("type") if isinstance(msg, dict) else None
        data = msg.get("data", {}) if isinstance(msg, dict) else None
        if not isinstance(data, dict):
            return error_message(InvalidValue("a message is a JSON object {\"type\": str, \"data\": object}"))
        op = _OPS.get(kind) if isinstance(kind, str) else None
        if op is None:
            return {"type": "error", "data": {"message": f"Unknown message type: {kind!r}; forkyard answers "
                                              f"{sorted(_OPS)}", "code": "UNKNOWN_TYPE", "status": "invalid",
                                              "http_status": 422}}
        try:
            return await op(self, data)
        except Exception as exc:  # noqa: BLE001 - mapped to an error answer; the connection goes on
            return error_message(exc)

    def _session(self) -> str:
        if self.sid is None:
            raise gym.error.ResetNeeded("no session on this connection yet: send a reset first")
        return self.sid

    async def _replace(self, sid: str) -> None:
        old, self.sid = self.sid, sid
        self.host.holders.hold(sid, self, drives=True)
        self.host.sessions.pin(sid)  # held while this connection is open (field case S48)
        self.forks.discard(sid)
        if old is not None and old != sid:
            await self.host.delete([old], by=self)

    async def reset(self, data: dict) -> dict[str, Any]:
        req = ResetData.model_validate(data)
        answer = await self._reset(req)
        self.episode_id = req.episode_id or uuid.uuid4().hex  # only once the reset took place
        return answer

    async def _reset(self, req: ResetData) -> dict[str, Any]:
        if req.snapshot is not None:
            if req.kwargs is not None or req.seed is not None or req.options is not None:
                raise InvalidValue("a reset with a snapshot takes no kwargs, seed or options: the snapshot "
                                   "holds the env's kwargs and state")
            made = await self.host.restore(req.snapshot, env_id=self.env_id)
            self.kwargs = None  # the token's kwargs: a later reset with kwargs makes a new session
            await self._replace(made.session_id)
            return _observation(made.session_id, made.observation, made.info, None, False, False, made.env.done,
                                made.env)
        if self.sid is not None and (req.kwargs is None or req.kwargs == self.kwargs):
            try:
                s, obs, info = await self.host.reset(self.sid, req.seed, req.options, by=self)
                return _observation(self.sid, obs, info, None, False, False, env=s.env)
            except SessionNotFound:
                self.host.holders.drop(self.sid)  # gone (the server's stop): a new one below
                self.sid = None
        kwargs = req.kwargs if req.kwargs is not None else (self.kwargs or {})
        made = await self.host.create(self.env_id, kwargs, req.seed, req.options)
        self.kwargs = kwargs
        await self._replace(made.session_id)
        return _observation(made.session_id, made.observation, made.info, None, False, False, made.env.done,
                            made.env)

    async def step(self, data: dict) -> dict[str, Any]:
        if "action" not in data and set(data) - {"metadata"}:  # the data is the call itself: OpenEnv's
            # CallToolAction, or a model's JSON reply sent whole (verifiers' openenv taskset does)
            data = {"action": {k: v for k, v in data.items() if k != "metadata"}, "metadata": data.get("metadata", {})}
        action = data.get("action")  # text or a JSON call: the env reads it with the one reader (field case S62)
        if not isinstance(action, (str, dict, list)) or not set(data) <= {"action", "metadata"} \
                or not isinstance(data.get("metadata", {}), dict):
            TextAction.model_validate(data)  # raises the ValidationError that names the problem
            raise InvalidValue("step data is {\"action\": str | object, \"metadata\"?: object}")
        sid = self._session()
        obs, reward, term, trunc, info = await self.host.step(sid, action, by=self)
        return _observation(sid, obs, info, reward, term, trunc)

    async def state(self, data: dict) -> dict[str, Any]:
        if self.sid is None:
            return {"type": "state", "data": EnvState(env_id=self.env_id).model_dump()}
        env = self.host.access(self.sid, self).env
        return {"type": "state", "data": {"episode_id": self.episode_id, "step_count": env.turn,
                                          "session_id": self.sid, "env_id": self.env_id, "done": env.done,
                                          "info": env.current_info()}}

    async def fork(self, data: dict) -> dict[str, Any]:
        req = ForkData.model_validate(data)
        sids = await self.host.fork(self._session(), req.n, by=self)
        for sid in sids:
            self.host.holders.hold(sid, self, drives=False)  # until another connection attaches it
            self.host.sessions.pin(sid)
        self.forks.update(sids)
        return {"type": "fork", "data": {"session_ids": sids}}

    async def attach(self, data: dict) -> dict[str, Any]:
        req = AttachData.model_validate(data)
        s = self.host.sessions.get(req.session_id)
        if s.env_id != self.env_id:
            raise InvalidValue(f"session {req.session_id!r} is of {s.env_id}, not of {self.env_id}")
        owner = self.host.holders.take(req.session_id, self)  # SessionHeld: another connection drives it
        if isinstance(owner, Connection):
            owner.forks.discard(req.session_id)
        self.episode_id = uuid.uuid4().hex
        self.kwargs = None  # made elsewhere: a later reset with kwargs makes a new session
        await self._replace(req.session_id)
        env = s.env
        return _observation(req.session_id, env.last_observation, env.current_info(), None, False, False, env.done,
                            env)

    async def tools(self, data: dict) -> dict[str, Any]:
        schemas = getattr(self.host.access(self._session(), self).env, "tool_schemas", None)
        return {"type": "tools", "data": {"tools": schemas() if schemas is not None else []}}

    async def snapshot(self, data: dict) -> dict[str, Any]:
        return {"type": "snapshot", "data": {"snapshot": await self.host.snapshot(self._session(), by=self)}}

    async def delete(self, data: dict) -> dict[str, Any]:
        req = DeleteData.model_validate(data)
        req.session_ids = list(dict.fromkeys(req.session_ids))  # each id answered once
        for sid in req.session_ids:  # all refused or all done
            self.host.holders.check(sid, self)  # SessionHeld: another connection holds it
            held = self.host.sessions.peek(sid)
            if held is not None and held.env_id != self.env_id:
                raise InvalidValue(f"session {sid!r} is of {held.env_id}, not of {self.env_id}")
        held = await self.host.delete(req.session_ids, by=self)
        for sid in req.session_ids:
            self.forks.discard(sid)
            if self.sid == sid:
                self.sid = None  # the connection outlives it: a later reset makes one with the same kwargs
        return {"type": "deleted", "data": {
            "deleted": [s for s, h in zip(req.session_ids, held, strict=True) if h],
            "missing": [s for s, h in zip(req.session_ids, held, strict=True) if not h]}}

    async def release(self) -> None:
        """Delete the connection's session and the forks it still owns."""
        mine = [sid for sid in ([self.sid] if self.sid else []) + sorted(self.forks)
                if self.host.holders.holder(sid) is self]
        self.sid, self.forks = None, set()
        if mine:
            await self.host.delete(mine, by=self)


_OPS = {"reset": Connection.reset, "step": Connection.step, "state": Connection.state, "fork": Connection.fork,
        "attach": Connection.attach, "snapshot": Connection.snapshot, "delete": Connection.delete,
        "tools": Connection.tools}


@router.websocket("/{env_id:path}/ws")
async def ws(websocket: WebSocket, env_id: str) -> None:
    """One env session per connection (see the module's docstring for the messages)."""
    await websocket.accept()
    app = websocket.app
    conn = Connection(app.state.env_host, env_id)
    TRANSPORT.set("openenv")  # labels the sessions this connection makes (field case S63); this task's own
    try:
        env_class(env_id)
        first = None
    except Exception as exc:  # noqa: BLE001 - an unknown env id: said in the answer to the first message
        first = error_message(exc)
    async def answer(raw: str | bytes) -> dict[str, Any] | None:
        return first if first is not None else await conn.handle(raw)

    try:  # size limits, one message at a time, fair with other connections: sandbox_server.openenv_flow
        await serve(websocket, answer)
    finally:
        await conn.release()
        try:
            await websocket.close()
        except (RuntimeError, WebSocketDisconnect):  # already closed, or the client is gone
            pass


async def _close(conn: Connection, data: dict) -> None:
    return None


_OPS["close"] = _close  # type: ignore[assignment]


# ------------------------------------------------------------------------------------ HTTP routes
def _served(env_id: str) -> type:
    return env_class(env_id)[0]


@router.get("/list_environments", response_model=list[str], summary="OpenEnv's listing: the env ids served",
            responses=R())
async def list_environments() -> list[str]:
    """The env ids this server serves, each the name after ``/openenv/`` of its base path: OpenEnv's
    ``GET /list_environments`` (a JSON list of names) at the root of OpenEnv's paths here. Read from the catalog
    (``envs.catalog``), as ``GET /v1/envs`` is."""
    cards = await anyio.to_thread.run_sync(lambda: envs.catalog(tools=False))  # imports env modules: off the loop
    return sorted(c.env_id for c in cards)


@router.get("/{env_id:path}/health", summary="OpenEnv health of one env id", responses=R(404))
async def health(env_id: str) -> dict[str, str]:
    _served(env_id)
    return {"status": "healthy"}


@router.get("/{env_id:path}/metadata", summary="OpenEnv metadata of one env id", responses=R(404))
async def metadata(env_id: str) -> dict[str, Any]:
    cls = _served(env_id)
    doc = (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
    return {"name": env_id, "description": doc or env_id, "readme_content": None, "version": _version(),
            "author": "forkyard", "documentation_url": None}


@router.get("/{env_id:path}/schema", summary="OpenEnv JSON schemas of one env id", responses=R(404))
async def schema(env_id: str) -> dict[str, Any]:
    _served(env_id)
    return {"action": TextAction.model_json_schema(), "observation": TextObservation.model_json_schema(),
            "state": EnvState.model_json_schema()}


@router.get("/{env_id:path}/state", summary="OpenEnv state (no session outside /ws)", responses=R(404))
async def state(env_id: str) -> dict[str, Any]:
    _served(env_id)
    return {"episode_id": None, "step_count": 0}


@router.post("/{env_id:path}/reset", summary="OpenEnv stateless reset: a fresh env's first observation",
             responses=R(404, 413, 422, 503))
async def reset(env_id: str, request: Request) -> Response:
    body = await request.body()
    try:
        req = ResetData.model_validate_json(body or b"{}")
    except pydantic.ValidationError as exc:
        raise HTTPException(422, error_message(exc)["data"]["message"]) from None
    if req.snapshot is not None:
        raise HTTPException(422, "a stateless reset takes no snapshot: restore over /ws or POST /v1/envs/restore")
    host: SessionHost = request.app.state.env_host
    made = await host.create(env_id, req.kwargs or {}, req.seed, req.options)
    await host.delete([made.session_id])
    data = _observation("", made.observation, made.info, None, False, False)["data"]
    return Response(orjson.dumps(data), media_type="application/json")


@router.post("/{env_id:path}/step", status_code=409, summary="OpenEnv stateless step: refused (episodes are stateful)",
             responses=R(404, 409))
async def step(env_id: str) -> Response:
    _served(env_id)
    raise HTTPException(409, "a forkyard episode is stateful: a step needs the episode it continues. Step over "
                             f"the WebSocket {PREFIX}/{env_id}/ws (one session per connection) or /v1/envs")


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("forkyard")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "0"


__all__ = ["PREFIX", "Connection", "EnvState", "TextAction", "TextObservation", "error_message", "router"]
