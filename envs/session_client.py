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
  ``httpx.HTTPTransport``: keep-alive connections shared by threads, a timeout per request, connect retries, and a
  request repeated after a connection closed with no answer only when that is safe,
  :func:`envs.client_retry.safe_to_repeat`: never a step, a create or a fork). ``envs.remote_vector.RemoteVectorEnv``
  drives the batched routes over the same class.
* :class:`WsTransport`: one WebSocket connection drives each session at ``/openenv/{env_id}/ws``; the session
  lives as long as its connection. Connections are opened when needed and kept (a few idle ones) for the next
  session: a fork's children ride the parent's connection, which owns them, until each is first used, when it
  attaches over an idle connection or a new one; unused children are deleted with one message.

Why one file: the transports and the client that decodes their answers are one protocol, read together (the
HTTP connections under :class:`HttpTransport` are their own module, :mod:`envs.http_connections`).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Iterable, Protocol

from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from envs.api_key import auth_headers, redact, split_credentials
from envs.client_retry import BusyWait, is_busy, retry_after_s
from envs.core import EnvInfraError, EpisodeFinishedError
from envs.errors import ActionTooLong, InvalidValue, SessionHeld, UnknownEnv, for_word
from envs.http_connections import BATCH_ITEMS, HttpConnections, dumps, loads
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
    :class:`SessionClient` objects using it); :meth:`close` frees its connections. A transport may also have
    ``delete_many(sids)``, which deletes many sessions in one request (:meth:`SessionClient.close_many` uses it)."""

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

    def delete_many(self, sids: list[str]) -> None:
        """Delete sessions with one ``POST /v1/envs/batch/delete`` (per :data:`~envs.http_connections.BATCH_ITEMS`);
        ids the server does not hold (or that a connection holds) are left as they are.

        Raises:
            Refusal: an error answer to a whole request; EnvInfraError: the server could not be reached."""
        sids = list(dict.fromkeys(sids))
        self.http.leases.discard(sids)
        for start in range(0, len(sids), BATCH_ITEMS):
            self._json("POST", "/v1/envs/batch/delete", {"items": [{"session_id": s}
                                                                   for s in sids[start:start + BATCH_ITEMS]]})

    def tools(self, sid) -> list[dict[str, Any]]:
        return self._json("GET", f"/v1/envs/{sid}/tools")["tools"]

    def close(self) -> None:
        self.http.close()


def _reset_answer(data: dict[str, Any]) -> ResetResponse:
    o = data["observation"]
    return decode(ResetResponse, {"session_id": o["session_id"], "observation": o["text"], "info": o["info"],
                                  "observation_max_length": o.get("observation_max_length"),
                                  "action_max_length": o.get("action_max_length")})


#: Idle WebSocket connections one :class:`WsTransport` keeps open for its next session (a fork child's attach, a
#: create, a restore); past this many, a connection whose session is deleted is closed.
IDLE_LINKS = 8


class _Link:
    """One WebSocket connection of a :class:`WsTransport`: the session it drives (None: idle, kept for the next
    one) and the fork children it made that no connection attached yet (the server deletes them with it)."""

    __slots__ = ("sock", "sid", "owns", "lock")

    def __init__(self, sock: ClientConnection):
        self.sock: ClientConnection = sock
        self.sid: str | None = None
        self.owns: set[str] = set()
        self.lock = threading.Lock()  # one message and its answer at a time (threads may share a connection)


class WsTransport:
    """Env sessions over the OpenEnv WebSocket transport of one env id (module docstring): each session is
    driven by a connection of its own, but connections are opened only when needed and kept for the next
    session:

    * ``create`` and ``restore`` take an idle connection (one whose session was deleted) or open one;
    * ``fork`` makes the children over the parent's connection, which owns them, and opens nothing: a child
      takes a connection of its own (idle, else new) and attaches there only when it is first used (a step,
      reset, fork, snapshot or tools), so children deleted unused cost no connection at all;
    * ``delete`` and :meth:`delete_many` send one ``delete`` message per connection for the sessions it drives or
      owns (a fork's unused children: one message), and keep the connection for the next session
      (:data:`IDLE_LINKS` at most; past that it is closed, which deletes its session).

    A connection that closed, or failed in the middle of a message (its answers could no longer be paired with
    its messages), is dropped: its session is lost (404), and so are the unattached children it owned. In a fork
    child the parent's connections are left untouched (field case S59). Thread-safe: one message at a time per
    connection.

    Args:
        url: the server's base URL (``http(s)://`` or ``ws(s)://``); a key in its user info is sent as the header
            when ``api_key`` is None (:func:`envs.api_key.split_credentials`: ValueError for one a URL cannot carry).
        env_id: the env id whose base path (``/openenv/{env_id}``) the connections open.
        kwargs: the env's constructor kwargs, sent with every reset (a connection whose session expired makes
            a new one with them).
        timeout_s: seconds to open a connection and to wait for any one answer.
        api_key: the server's API key, or None; connect_retries: kept for the HTTP transport's signature.

    Attributes:
        opened: connections opened so far (a count, for tests and benchmarks).
    """

    name = "ws"
    #: :meth:`close` deletes every session of the transport (the server deletes a connection's sessions with it).
    closing_deletes = True

    def __init__(self, url: str, env_id: str, kwargs: dict[str, Any], timeout_s: float, connect_retries: int = 3,
                 api_key: str | None = None):
        url, in_url = split_credentials(url)  # a key in the URL travels as a header, never in a URL (S60)
        self.url, self.env_id, self.kwargs, self.timeout_s = url, env_id, kwargs, timeout_s
        self.connect_retries, self.api_key = connect_retries, in_url if api_key is None else api_key
        base = "ws" + url[4:] if url.startswith("http") else url
        self.ws_url, self.where = f"{base}/openenv/{env_id}/ws", f"ws /openenv/{env_id}/ws"
        self.links: dict[str, _Link] = {}  # session id -> the connection that drives it
        self.pending: dict[str, _Link] = {}  # fork child not attached yet -> the connection that owns it
        self.idle: list[_Link] = []  # connections that drive no session (some own unattached children)
        self._lock = threading.Lock()  # guards the three above; never held across a message
        self.refs, self.closed, self.pid, self.opened = 1, False, os.getpid(), 0

    def _here(self) -> None:
        """In a fork child, forget (untouched) the parent's connections: their sessions are the parent's."""
        if self.pid != os.getpid():
            keep_inherited(*(link.sock for link in self._all_links()))
            self.links, self.pending, self.idle = {}, {}, []
            self._lock, self.pid = threading.Lock(), os.getpid()  # the parent's lock may be held by its thread

    def _all_links(self) -> list[_Link]:
        seen: dict[int, _Link] = {}
        for link in [*self.links.values(), *self.pending.values(), *self.idle]:
            seen[id(link)] = link
        return list(seen.values())

    @property
    def is_closed(self) -> bool:
        return self.closed

    @property
    def open_connections(self) -> int:
        """Connections this process holds open now (driving a session, owning children, or idle)."""
        self._here()
        with self._lock:
            return len(self._all_links())

    def _failed(self, kind: str, exc: BaseException) -> EnvInfraError:
        return EnvInfraError(redact(f"{kind} over {self.ws_url} failed: {exc!r}", (self.api_key,)))

    def _open(self, kind: str) -> _Link:
        if self.closed:
            raise EnvInfraError("the transport was closed (close() was called)")
        self._here()
        try:
            sock = connect(self.ws_url, open_timeout=self.timeout_s, max_size=None,
                           additional_headers=auth_headers(self.api_key)).__enter__()  # closed by _drop()
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status == 401:
                raise Refusal(401, ErrorBody(detail="the server requires an API key", status="unauthorized"),
                              self.where) from None
            raise self._failed(kind, exc) from exc
        except (OSError, TimeoutError, WebSocketException) as exc:
            raise self._failed(kind, exc) from exc
        self.opened += 1
        return _Link(sock)

    def _ask(self, link: _Link, kind: str, data: dict[str, Any], session: bool = True) -> dict[str, Any]:
        """One message and its answer's data; Refusal for an error answer, and a 404 when the connection of a
        ``session`` closed (the session ended with it)."""
        try:
            with link.lock:
                link.sock.send(dumps({"type": kind, "data": data}).decode())
                answer = loads(link.sock.recv(timeout=self.timeout_s))
        except (OSError, TimeoutError, WebSocketException) as exc:
            self._drop(link)  # closed, or a late answer may still come: no later message may read it
            if session and isinstance(exc, ConnectionClosed):
                raise Refusal(404, ErrorBody(detail=f"the connection closed ({exc}): its session ended with it",
                                             status="not_found"), self.where) from None
            raise self._failed(kind, exc) from exc
        if answer.get("type") != "error":
            return answer["data"]
        err = answer["data"]
        raise Refusal(err.get("http_status", 500), ErrorBody(detail=str(err.get("message")), status=err.get("status")),
                      self.where, code=err.get("code"), retry_after_s=err.get("retry_after_s"))

    def _lost(self, sid: str) -> Refusal:
        return Refusal(404, ErrorBody(detail=f"no connection drives session {sid!r} (closed or lost: the session "
                                      "ended with it)", status="not_found"), self.where)

    def _drop(self, link: _Link) -> None:
        """Close ``link`` and forget it: the server deletes its session and the children it owned."""
        with self._lock:
            for sid in [s for s, k in self.links.items() if k is link]:
                del self.links[sid]
            for sid in link.owns:
                if self.pending.get(sid) is link:
                    del self.pending[sid]
            link.owns.clear()
            link.sid = None
            if link in self.idle:
                self.idle.remove(link)
        try:
            link.sock.close()
        except (OSError, WebSocketException):
            pass

    def _release(self, link: _Link) -> None:
        """``link`` drives no session now: kept idle for the next one (always while it owns unattached children,
        whose sessions end with it), else closed when more than :data:`IDLE_LINKS` are idle."""
        with self._lock:
            if link.sid is not None:
                return
            if link not in self.idle:
                self.idle.append(link)
            surplus = not link.owns and len(self.idle) > IDLE_LINKS
        if surplus:
            self._drop(link)

    def _idle_link(self, prefer: _Link | None = None) -> _Link | None:
        """An idle connection taken from the pool (``prefer`` when it is idle), or None."""
        with self._lock:
            if prefer is not None and prefer in self.idle:
                self.idle.remove(prefer)
                return prefer
            return self.idle.pop() if self.idle else None

    def _session_link(self, kind: str, data: dict[str, Any], prefer: _Link | None = None
                      ) -> tuple[_Link, dict[str, Any]]:
        """Send ``kind`` (a message that gives its connection a session: ``reset``, ``attach``) over an idle
        connection (``prefer`` first) or a new one: (the connection, the answer's data). An idle connection found
        closed (the server restarted or dropped it) is dropped and the message sent over a new one."""
        self._here()
        link = self._idle_link(prefer)
        while True:
            fresh = link is None
            if link is None:
                link = self._open(kind)
            try:
                return link, self._ask(link, kind, data, session=False)
            except Refusal:
                self._release(link)  # an error answer: the connection is fine
                raise
            except EnvInfraError as exc:  # (dropped by _ask)
                if fresh or not isinstance(exc.__cause__, ConnectionClosed):
                    raise
                link = None
            except BaseException:
                self._drop(link)
                raise

    def _adopt(self, link: _Link, answer: ResetResponse, old: str | None = None) -> ResetResponse:
        with self._lock:
            if old is not None and old != answer.session_id:
                self.links.pop(old, None)  # the connection's session expired: the server made a new one
            link.sid = answer.session_id
            self.links[answer.session_id] = link
        return answer

    def _driving(self, sid: str) -> _Link:
        """The connection that drives ``sid``; an unattached fork child is attached now (over its owner when
        that drives nothing, else an idle or new connection). Refusal 404 for a session this transport lost."""
        self._here()
        link = self.links.get(sid)
        if link is not None:
            return link
        owner = self.pending.get(sid)
        if owner is None:
            raise self._lost(sid)
        try:
            link, _ = self._session_link("attach", {"session_id": sid}, prefer=owner)
        except Refusal as refusal:
            if not is_busy(refusal.http_status, refusal.error.status):  # lost, or attached elsewhere: not ours
                with self._lock:
                    if self.pending.get(sid) is owner:
                        del self.pending[sid]
                    owner.owns.discard(sid)
                self._release(owner)
            raise
        with self._lock:
            if self.pending.get(sid) is owner:
                del self.pending[sid]
            owner.owns.discard(sid)  # the server moved it to the attaching connection
            link.sid = sid
            self.links[sid] = link
        if link is not owner:
            self._release(owner)  # idle and owning nothing more: kept or closed
        return link

    def create(self, env_id, kwargs, seed, options) -> ResetResponse:
        if env_id != self.env_id:
            raise ValueError(f"this transport's connections open {self.env_id!r}, not {env_id!r}")
        link, data = self._session_link("reset", {"seed": seed, "options": options, "kwargs": kwargs})
        return self._adopt(link, _reset_answer(data))

    def reset(self, sid, seed, options) -> ResetResponse:
        link = self._driving(sid)
        return self._adopt(link, _reset_answer(self._ask(link, "reset", {"seed": seed, "options": options,
                                                                          "kwargs": self.kwargs})), sid)

    def step(self, sid, action) -> StepResponse:
        data = self._ask(self._driving(sid), "step", {"action": action})
        o = data["observation"]
        return decode(StepResponse, {"session_id": o["session_id"], "observation": o["text"], "reward": data["reward"],
                                     "terminated": o["terminated"], "truncated": o["truncated"], "info": o["info"]})

    def fork(self, sid, n) -> list[str]:
        """``n`` children, owned by ``sid``'s connection until each is first used (then attached by a connection
        of its own): one message, no connection opened."""
        link = self._driving(sid)
        sids = [str(s) for s in self._ask(link, "fork", {"n": n})["session_ids"]]
        with self._lock:
            for child in sids:
                self.pending[child] = link
            link.owns.update(sids)
        return sids

    def snapshot(self, sid) -> str:
        return str(self._ask(self._driving(sid), "snapshot", {})["snapshot"])

    def restore(self, token) -> ResetResponse:
        link, data = self._session_link("reset", {"snapshot": token})
        return self._adopt(link, _reset_answer(data))

    def delete(self, sid) -> None:
        self.delete_many([sid])

    def delete_many(self, sids: list[str]) -> None:
        """Delete sessions of this transport: one ``delete`` message per connection (a fork's unused children
        share their parent's: one message for all), whose connections are then kept idle or closed
        (:data:`IDLE_LINKS`). Unknown ids are skipped. Best effort: a failed connection is dropped (the server
        deletes what it held)."""
        self._here()
        groups: dict[int, tuple[_Link, list[str]]] = {}
        with self._lock:
            for sid in dict.fromkeys(sids):
                link = self.pending.pop(sid, None)
                if link is not None:
                    link.owns.discard(sid)
                else:
                    link = self.links.pop(sid, None)
                    if link is None:
                        continue
                    link.sid = None
                groups.setdefault(id(link), (link, []))[1].append(sid)
            closing = []
            room = IDLE_LINKS - len(self.idle)
            for key, (link, _) in list(groups.items()):
                if link.sid is None and not link.owns and link not in self.idle:
                    if room > 0:
                        room -= 1
                    else:
                        closing.append(link)  # closing it deletes its sessions: no message needed
                        del groups[key]
        for link in closing:
            self._drop(link)
        for link, group in groups.values():
            try:
                self._ask(link, "delete", {"session_ids": group}, session=False)
            except Refusal:
                pass  # (a session another connection holds now; the connection is fine)
            except EnvInfraError:
                continue  # dropped: the server deleted what it held
            self._release(link)

    def tools(self, sid) -> list[dict[str, Any]]:
        # over the session's own connection: /v1/envs refuses a session a connection holds (409 held, field case S58)
        return list(self._ask(self._driving(sid), "tools", {})["tools"])

    def close(self) -> None:
        """Close every connection (the server deletes their sessions and unattached children)."""
        self.closed = True
        self._here()
        with self._lock:
            links = self._all_links()
            self.links, self.pending, self.idle = {}, {}, []
        for link in links:
            try:
                link.sock.close()
            except (OSError, WebSocketException):
                pass


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
        last = self.transport.refs <= 1
        if self.session_id is not None and self.pid == os.getpid():  # in a fork child: the parent's, left to it
            if not (last and getattr(self.transport, "closing_deletes", False)):  # else closing deletes it
                self._delete(self.session_id)
        self.session_id = None
        self.transport.refs -= 1
        if self.transport.refs <= 0:
            self.transport.close()

    @staticmethod
    def close_many(clients: Iterable["SessionClient"]) -> None:
        """Close many clients (a fork's children, say) as :meth:`close` does, their sessions deleted with one
        request per transport: its ``delete_many`` (``/v1/envs/batch/delete``; over the WebSocket one message per
        connection, one in all for unused fork children), else one ``delete`` each. Best effort, as :meth:`close`."""
        groups: dict[int, tuple[Transport, dict[int, SessionClient]]] = {}
        for c in clients:
            if not c.closed:
                groups.setdefault(id(c.transport), (c.transport, {}))[1][id(c)] = c
        pid = os.getpid()
        for transport, group in groups.values():
            sids = [c.session_id for c in group.values() if c.session_id is not None and c.pid == pid]
            if transport.refs <= len(group) and getattr(transport, "closing_deletes", False):
                sids = []  # the transport closes below, and its sessions with it
            many = getattr(transport, "delete_many", None)
            try:
                if many is not None:
                    if sids:
                        many(sids)
                else:
                    for sid in sids:
                        try:
                            transport.delete(sid)
                        except (Refusal, EnvInfraError, ValueError):
                            pass
            except (Refusal, EnvInfraError, ValueError):
                pass  # the server's TTL reaps what could not be closed now
            for c in group.values():
                c.closed, c.session_id = True, None
                transport.refs -= 1
            if transport.refs <= 0:
                transport.close()


__all__ = ["IDLE_LINKS", "HttpTransport", "Refusal", "SessionClient", "Transport", "WsTransport", "error_for",
           "make_transport"]
