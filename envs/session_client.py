"""One client of a forkyard server's env sessions, over a transport: ``/v1/envs`` over HTTP, or the OpenEnv
WebSocket transport with forkyard's fork extension (``sandbox_server/routes/openenv.py``).

A :class:`Transport` moves the operations of env sessions, named by session id (create, reset, step, fork,
snapshot, restore, delete, tools) and hands back the server's answers as the shared wire models of
:mod:`envs.wire`, or raises :class:`Refusal` with the server's error answer. :class:`SessionClient` drives
one session over a transport and decodes errors the one way every forkyard client does:

* ``503 unavailable`` (nothing ran: the session cap is full, the server starts or drains) is sent again after
  the server's wait, for up to ``busy_timeout_s`` seconds (:mod:`envs.client_retry`);
* 401: ``PermissionError`` (a missing or wrong API key, :mod:`envs.api_key`);
* otherwise the domain error the server raised (:mod:`envs.errors`, read back from the answer's status word):
  :class:`~envs.errors.SessionHeld` (a ``PermissionError``: another connection holds the session, field case
  S58); :class:`~envs.core.EpisodeFinishedError` on a step; :class:`~envs.errors.SessionNotFound` for a session
  lost or expired (an :class:`~envs.core.EnvInfraError`: trainers drop such episodes), as are 5xx answers and
  network failures; :class:`~envs.errors.UnknownEnv` for an env id the server does not serve,
  :class:`~envs.errors.ActionTooLong` and :class:`~envs.errors.InvalidValue` (``ValueError`` both) for any other
  4xx.

A reset of a lost session (404: the server restarted, the session expired, its WebSocket closed) opens a new
one (field case S61); a step of the lost episode raises EnvInfraError and is never sent again. A session is its
process's (field case S59, :mod:`envs.process_local`): in a fork child a reset opens the child's own, anything
else raises ``InheritedConnectionError``, and the transports open the child's own connections.

Transports:

* :class:`HttpTransport`: ``/v1/envs`` over :class:`envs.http_connections.HttpConnections` (one
  ``httpx.Client``: keep-alive connections shared by threads, a timeout per request, connect retries, and a
  request repeated after a connection closed with no answer only when that is safe,
  :func:`envs.client_retry.safe_to_repeat`: never a step, a create or a fork). ``envs.remote_vector.RemoteVectorEnv``
  drives the batched routes over the same class.
* :class:`WsTransport`: one WebSocket connection per session at ``/openenv/{env_id}/ws``; the session lives
  as long as its connection. A fork's children each get their own connection, which attaches the child.
  ``tools`` goes over HTTP (the OpenEnv wire has no such message).

Why one file: the transports and the client that decodes their answers are one protocol, read together (the
HTTP connections under :class:`HttpTransport` are their own module, :mod:`envs.http_connections`).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from envs.api_key import auth_headers, redact, split_credentials
from envs.client_retry import BusyWait, is_busy, retry_after_s
from envs.core import EnvInfraError, EpisodeFinishedError
from envs.errors import ActionTooLong, InvalidValue, SessionHeld, UnknownEnv, for_word
from envs.http_connections import HttpConnections, dumps, loads
from envs.process_local import inherited_error, keep_inherited
from envs.wire import EnvSnapshotResponse, ErrorBody, ForkResponse, ResetResponse, StepResponse, decode


class Refusal(Exception):
    """The server answered an operation with an error (raised by transports, decoded by :class:`SessionClient`).

    Attributes:
        http_status: the HTTP status (over the WebSocket: the status ``/v1/envs`` would have answered).
        error: the error body (``detail``, ``status``: the server's short word such as ``unavailable``).
        where: the request, for messages (``POST /v1/envs/ID/step``, ``ws /openenv/ID/ws``).
        code: OpenEnv's error code over the WebSocket (``CAPACITY_REACHED``, ...), else None.
        retry_after_s: with a 503, the server's wait in seconds (``Retry-After``), else None.
    """

    def __init__(self, http_status: int, error: ErrorBody, where: str, code: str | None = None,
                 retry_after_s: float | str | None = None):
        super().__init__(f"{where}: HTTP {http_status}: {error.detail}")
        self.http_status, self.error, self.where, self.code, self.retry_after_s = (
            http_status, error, where, code, retry_after_s)


def error_for(op: str, refusal: Refusal) -> Exception:
    """The exception a client raises for ``refusal`` of operation ``op`` (``create``, ``reset``, ``step``,
    ``fork``, ``snapshot``, ``restore``, ``delete``, ``tools``, ``attach``): the domain error the server raised,
    named by the answer's status word (:func:`envs.errors.for_word`), else by the status alone (module
    docstring)."""
    status, err = refusal.http_status, refusal.error
    kind = refusal.code or err.status or "error"
    text = f"{op} ({refusal.where}): HTTP {status} {kind}: {err.detail[:500]}"
    if status == 401:
        return PermissionError(f"{text} (set FORKYARD_API_KEY or api_key=)")
    cls = for_word(status, err.status)
    if status == 404 and op in ("create", "restore"):
        cls = UnknownEnv  # what a 404 of a create means (a server before the word unknown_env said not_found)
    elif cls is EpisodeFinishedError:
        return EpisodeFinishedError(err.detail or "the episode has ended") if op == "step" else InvalidValue(text)
    elif cls is ActionTooLong and op != "step":
        cls = InvalidValue  # a request body over a route's limit
    if cls is SessionHeld:  # another connection holds the session (field case S58)
        return SessionHeld(f"{text} (act on it through the connection that holds it)")
    if cls is not None:
        return cls(text)
    return EnvInfraError(text) if status >= 500 or status == 404 else InvalidValue(text)


# ------------------------------------------------------------------------------------------ transports
class Transport(Protocol):
    """What :class:`SessionClient` needs of a transport (``ray_cluster.transport.RayTransport``, which moves
    sessions over Ray actor calls, has no ``restore`` or ``tools``). Every call raises :class:`Refusal` for an error
    answer, :class:`~envs.core.EnvInfraError` when the server cannot be reached or the connection fails,
    ``PermissionError`` when a connection is refused for its API key.

    A transport is shared by a session and the sessions forked from it (``refs`` counts the
    :class:`SessionClient` objects using it); :meth:`close` frees its connections."""

    name: str
    refs: int

    def create(self, env_id: str, kwargs: dict[str, Any], seed: int | None,
               options: dict[str, Any] | None) -> ResetResponse: ...
    def reset(self, sid: str, seed: int | None, options: dict[str, Any] | None) -> ResetResponse: ...
    def step(self, sid: str, action: str) -> StepResponse: ...
    def fork(self, sid: str, n: int) -> list[str]: ...
    def snapshot(self, sid: str) -> str: ...
    def restore(self, token: str) -> ResetResponse: ...
    def delete(self, sid: str) -> None: ...
    def tools(self, sid: str) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...


def _refusal(status: int, data: bytes, where: str, retry_after: str | None) -> Refusal:
    try:
        body = loads(data)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        err = ErrorBody(detail=body["detail"], status=body.get("status"))
    else:
        err = ErrorBody(detail=data[:500].decode("utf-8", "replace"))
    return Refusal(status, err, where, retry_after_s=retry_after)


class HttpTransport:
    """Env sessions over ``/v1/envs`` (module docstring), on one :class:`~envs.http_connections.HttpConnections`.

    Args:
        url: the server's base URL.
        timeout_s: seconds for any one request (sandbox tool calls included).
        connect_retries: retries of a failed connect.
        api_key: the server's API key, or None.
    """

    name = "http"

    def __init__(self, url: str, timeout_s: float, connect_retries: int = 3, api_key: str | None = None):
        self.http = HttpConnections(url, timeout_s, connect_retries, api_key)
        self.refs = 1

    @property
    def is_closed(self) -> bool:
        return self.http.closed

    def _json(self, method: str, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        status, data, retry_after = self.http.request(method, path, None if payload is None else dumps(payload))
        if status >= 400:
            raise _refusal(status, data, f"{method} {path}", retry_after)
        return loads(data) if data else {}

    def create(self, env_id, kwargs, seed, options) -> ResetResponse:
        made = decode(ResetResponse, self._json("POST", "/v1/envs", {"env_id": env_id, "kwargs": kwargs, "seed": seed,
                                                                     "options": options}))
        self.http.leases.add([made.session_id])  # renewed while this process lives (field case S51)
        return made

    def reset(self, sid, seed, options) -> ResetResponse:
        return decode(ResetResponse, self._json("POST", f"/v1/envs/{sid}/reset", {"seed": seed, "options": options}))

    def step(self, sid, action) -> StepResponse:
        return decode(StepResponse, self._json("POST", f"/v1/envs/{sid}/step", {"action": action}))

    def fork(self, sid, n) -> list[str]:
        kids = decode(ForkResponse, self._json("POST", f"/v1/envs/{sid}/fork", {"n": n})).session_ids
        self.http.leases.add(kids)
        return kids

    def snapshot(self, sid) -> str:
        return decode(EnvSnapshotResponse, self._json("POST", f"/v1/envs/{sid}/snapshot")).snapshot

    def restore(self, token) -> ResetResponse:
        made = decode(ResetResponse, self._json("POST", "/v1/envs/restore", {"snapshot": token}))
        self.http.leases.add([made.session_id])
        return made

    def delete(self, sid) -> None:
        self.http.leases.discard([sid])
        self._json("DELETE", f"/v1/envs/{sid}")

    def tools(self, sid) -> list[dict[str, Any]]:
        return self._json("GET", f"/v1/envs/{sid}/tools")["tools"]

    def close(self) -> None:
        self.http.close()


def _reset_answer(data: dict[str, Any]) -> ResetResponse:
    o = data["observation"]
    return decode(ResetResponse, {"session_id": o["session_id"], "observation": o["text"], "info": o["info"],
                                  "observation_max_length": o.get("observation_max_length"),
                                  "action_max_length": o.get("action_max_length")})


class WsTransport:
    """Env sessions over the OpenEnv WebSocket transport of one env id (module docstring): one connection
    per session, opened by ``create`` and ``restore`` (and by ``fork`` for each child, which it attaches),
    closed by ``delete`` (the server then deletes the session). A connection that closed, or failed in the
    middle of a message (its answers could no longer be paired with its messages), is dropped: its session
    is lost (404). In a fork child the parent's connections are left untouched (field case S59).

    Args:
        url: the server's base URL (``http(s)://`` or ``ws(s)://``); a key in its user info is sent as the header
            when ``api_key`` is None (:func:`envs.api_key.split_credentials`: ValueError for one a URL cannot carry).
        env_id: the env id whose base path (``/openenv/{env_id}``) the connections open.
        kwargs: the env's constructor kwargs, sent with every reset (a connection whose session expired makes
            a new one with them).
        timeout_s: seconds to open a connection and to wait for any one answer.
        api_key: the server's API key, or None; connect_retries: for :meth:`tools` (over HTTP).
    """

    name = "ws"

    def __init__(self, url: str, env_id: str, kwargs: dict[str, Any], timeout_s: float, connect_retries: int = 3,
                 api_key: str | None = None):
        url, in_url = split_credentials(url)  # a key in the URL travels as a header, never in a URL (S60)
        self.url, self.env_id, self.kwargs, self.timeout_s = url, env_id, kwargs, timeout_s
        self.connect_retries, self.api_key = connect_retries, in_url if api_key is None else api_key
        base = "ws" + url[4:] if url.startswith("http") else url
        self.ws_url, self.where = f"{base}/openenv/{env_id}/ws", f"ws /openenv/{env_id}/ws"
        self.sockets: dict[str, ClientConnection] = {}
        self._http: HttpTransport | None = None  # for tools
        self.refs, self.closed, self.pid = 1, False, os.getpid()

    def _here(self) -> None:
        """In a fork child, forget (untouched) the parent's connections: their sessions are the parent's."""
        if self.pid != os.getpid():
            keep_inherited(*self.sockets.values())
            self.sockets, self.pid = {}, os.getpid()

    @property
    def is_closed(self) -> bool:
        return self.closed

    def _failed(self, kind: str, exc: BaseException) -> EnvInfraError:
        return EnvInfraError(redact(f"{kind} over {self.ws_url} failed: {exc!r}", (self.api_key,)))

    def _open(self, kind: str) -> ClientConnection:
        if self.closed:
            raise EnvInfraError("the transport was closed (close() was called)")
        self._here()
        try:
            return connect(self.ws_url, open_timeout=self.timeout_s, max_size=None,
                           additional_headers=auth_headers(self.api_key)).__enter__()  # closed by delete()
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status == 401:
                raise Refusal(401, ErrorBody(detail="the server requires an API key", status="unauthorized"),
                              self.where) from None
            raise self._failed(kind, exc) from exc
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise self._failed(kind, exc) from exc

    def _ask(self, sock: ClientConnection, kind: str, data: dict[str, Any], session: bool = True) -> dict[str, Any]:
        """One message and its answer's data; Refusal for an error answer, and a 404 when the connection of a
        ``session`` closed (the session ended with it)."""
        try:
            sock.send(dumps({"type": kind, "data": data}).decode())
            answer = loads(sock.recv(timeout=self.timeout_s))
        except (OSError, TimeoutError, WebSocketException) as exc:
            self._drop(sock)  # closed, or a late answer may still come: no later message may read it
            if session and isinstance(exc, ConnectionClosed):
                raise Refusal(404, ErrorBody(detail=f"the connection closed ({exc}): its session ended with it",
                                             status="not_found"), self.where) from None
            raise self._failed(kind, exc) from exc
        if answer.get("type") != "error":
            return answer["data"]
        err = answer["data"]
        raise Refusal(err.get("http_status", 500), ErrorBody(detail=str(err.get("message")), status=err.get("status")),
                      self.where, code=err.get("code"), retry_after_s=err.get("retry_after_s"))

    def _socket(self, sid: str) -> ClientConnection:
        self._here()
        sock = self.sockets.get(sid)
        if sock is None:
            raise Refusal(404, ErrorBody(detail=f"no connection drives session {sid!r} (closed or lost: the session "
                                         "ended with it)", status="not_found"), self.where)
        return sock

    def _drop(self, sock: ClientConnection) -> None:
        for sid in [s for s, k in self.sockets.items() if k is sock]:
            del self.sockets[sid]
        try:
            sock.close()
        except (OSError, WebSocketException):
            pass

    def _adopt(self, sock: ClientConnection, answer: ResetResponse, old: str | None = None) -> ResetResponse:
        if old is not None and old != answer.session_id:
            self.sockets.pop(old, None)  # the connection's session expired: the server made a new one
        self.sockets[answer.session_id] = sock
        return answer

    def _new_session(self, kind: str, data: dict[str, Any]) -> ResetResponse:
        sock = self._open(kind)
        try:
            return self._adopt(sock, _reset_answer(self._ask(sock, kind, data, session=False)))
        except BaseException:
            sock.close()
            raise

    def create(self, env_id, kwargs, seed, options) -> ResetResponse:
        if env_id != self.env_id:
            raise ValueError(f"this transport's connections open {self.env_id!r}, not {env_id!r}")
        return self._new_session("reset", {"seed": seed, "options": options, "kwargs": kwargs})

    def reset(self, sid, seed, options) -> ResetResponse:
        sock = self._socket(sid)
        return self._adopt(sock, _reset_answer(self._ask(sock, "reset", {"seed": seed, "options": options,
                                                                         "kwargs": self.kwargs})), sid)

    def step(self, sid, action) -> StepResponse:
        data = self._ask(self._socket(sid), "step", {"action": action})
        o = data["observation"]
        return decode(StepResponse, {"session_id": o["session_id"], "observation": o["text"], "reward": data["reward"],
                                     "terminated": o["terminated"], "truncated": o["truncated"], "info": o["info"]})

    def fork(self, sid, n) -> list[str]:
        """``n`` children, each attached by a connection of its own (all or nothing: when one fails, the
        connections opened are closed, and so their children deleted; the others go with ``sid``'s)."""
        sids = list(self._ask(self._socket(sid), "fork", {"n": n})["session_ids"])
        opened: list[str] = []
        try:
            for child in sids:
                self._new_session("attach", {"session_id": child})
                opened.append(child)
        except BaseException:
            for child in opened:
                self.delete(child)
            raise
        return sids

    def snapshot(self, sid) -> str:
        return str(self._ask(self._socket(sid), "snapshot", {})["snapshot"])

    def restore(self, token) -> ResetResponse:
        return self._new_session("reset", {"snapshot": token})

    def delete(self, sid) -> None:
        self._here()
        sock = self.sockets.pop(sid, None)
        if sock is not None:  # the server deletes the session with its connection
            self._drop(sock)

    def tools(self, sid) -> list[dict[str, Any]]:
        # over the session's own connection: /v1/envs refuses a session a connection holds (409 held, field case S58)
        return list(self._ask(self._socket(sid), "tools", {})["tools"])

    def close(self) -> None:
        self.closed = True
        self._here()
        for sid in list(self.sockets):
            self.delete(sid)
        if self._http is not None:
            self._http.close()


def make_transport(kind: str, url: str, env_id: str, kwargs: dict[str, Any], timeout_s: float,
                   connect_retries: int = 3, api_key: str | None = None) -> HttpTransport | WsTransport:
    """A transport by name: ``"http"`` (:class:`HttpTransport`) or ``"ws"`` (:class:`WsTransport`).

    Raises:
        ValueError: another name.
    """
    if kind == "http":
        return HttpTransport(url, timeout_s, connect_retries, api_key)
    if kind == "ws":
        return WsTransport(url, env_id, kwargs, timeout_s, connect_retries, api_key)
    raise ValueError(f"transport must be 'http' or 'ws', got {kind!r}")


# ------------------------------------------------------------------------------------------ the client
class SessionClient:
    """One env session on a forkyard server, over a :class:`Transport` (module docstring).

    Args:
        transport: how to reach the server (shared with the sessions forked from this one).
        env_id: the registered id the server runs.
        kwargs: the env's constructor kwargs.
        busy_timeout_s: seconds to keep sending an operation the server answered ``503 unavailable``.
        session_id: an existing session to drive (a fork's child), else None (made by the first reset).

    Every method raises as the module docstring says.
    """

    def __init__(self, transport: Transport, env_id: str, kwargs: dict[str, Any] | None = None,
                 busy_timeout_s: float = 30.0, session_id: str | None = None):
        BusyWait(busy_timeout_s)  # validates it
        self.transport, self.env_id, self.kwargs = transport, env_id, dict(kwargs or {})
        self.busy_timeout_s, self.session_id, self.closed = float(busy_timeout_s), session_id, False
        self.pid = os.getpid()  # the process the session belongs to (field case S59)

    def _do(self, op: str, fn: Any, *args: Any) -> Any:
        busy = None
        while True:
            try:
                return fn(*args)
            except Refusal as refusal:
                if is_busy(refusal.http_status, refusal.error.status):  # nothing ran: wait and send it again
                    busy = busy or BusyWait(self.busy_timeout_s)
                    if busy.wait(retry_after_s(refusal.retry_after_s)):
                        continue
                if op == "reset" and refusal.http_status == 404:
                    return None  # the session was lost: reset() opens a new one (field case S61)
                raise error_for(op, refusal) from None

    def _sid(self, op: str) -> str:
        if self.session_id is None:
            raise RuntimeError(f"{op} needs a session: reset first")
        if self.pid != os.getpid():
            raise inherited_error(f"env session {self.session_id!r} of {self.env_id!r}", self.pid,
                                  "Call reset() here to open a session of this process, or make the env here.")
        return self.session_id

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetResponse:
        """Reset the session: the first observation. Creates it on the first call, after it was lost, and in a
        fork child (the parent keeps its own): module docstring. RuntimeError once closed."""
        if self.closed:
            raise RuntimeError(f"this client of {self.env_id!r} is closed (its session ended): make a new one")
        if self.pid != os.getpid():
            self.session_id, self.pid = None, os.getpid()
        out = None
        if self.session_id is not None:
            out = self._do("reset", self.transport.reset, self.session_id, seed, options)
        if out is None:
            out = self._do("create", self.transport.create, self.env_id, self.kwargs, seed, options)
        self.session_id = out.session_id
        return out

    def step(self, action: str) -> StepResponse:
        """One action's outcome."""
        return self._do("step", self.transport.step, self._sid("step"), action)

    def fork(self, n: int = 1) -> list["SessionClient"]:
        """``n`` clients of new sessions at this session's state (server-side fork), sharing the transport."""
        sids = self._do("fork", self.transport.fork, self._sid("fork"), n)
        self.transport.refs += len(sids)
        return [SessionClient(self.transport, self.env_id, self.kwargs, self.busy_timeout_s, sid) for sid in sids]

    def snapshot(self) -> str:
        """The session's state as an opaque, authenticated token (:meth:`restore` takes it)."""
        return self._do("snapshot", self.transport.snapshot, self._sid("snapshot"))

    def restore(self, token: str) -> ResetResponse:
        """Replace this client's session by a new one at the state ``token`` holds (the old one is deleted):
        its observation."""
        out = self._do("restore", self.transport.restore, token)
        old, self.session_id = self.session_id, out.session_id
        if self.pid != os.getpid():
            old, self.pid = None, os.getpid()  # the parent's session: left to it
        if old is not None:
            self._delete(old)
        return out

    def tools(self) -> list[dict[str, Any]]:
        """The session's tools as JSON-schema definitions (``GET /v1/envs/{session_id}/tools``)."""
        return self._do("tools", self.transport.tools, self._sid("tools"))

    def _delete(self, sid: str) -> None:
        try:
            self.transport.delete(sid)
        except (Refusal, EnvInfraError, ValueError):
            pass  # the server's TTL reaps what could not be closed now

    def close(self) -> None:
        """Delete the session (best effort: the server's TTL reaps it otherwise); the transport, shared with
        forks, closes with the last client using it."""
        if self.closed:
            return
        self.closed = True
        if self.session_id is not None and self.pid == os.getpid():  # in a fork child: the parent's, left to it
            self._delete(self.session_id)
        self.session_id = None
        self.transport.refs -= 1
        if self.transport.refs <= 0:
            self.transport.close()


__all__ = ["HttpTransport", "Refusal", "SessionClient", "Transport", "WsTransport", "error_for",
           "make_transport"]
