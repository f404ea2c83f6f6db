"""A Gymnasium env that proxies to a forkyard server's env sessions over HTTP.

``gymnasium.make("forkyard/ClueProbe-v0", server_url="http://localhost:8000")`` (any forkyard id)
returns a :class:`RemoteEnv`: ``reset`` opens a session on the server (or resets it), ``step`` sends
the action, ``fork(n)`` forks the server-side session and returns n ``RemoteEnv``s sharing this one's
HTTP connection pool, ``close`` deletes the session. The server runs the env (and its sandbox).

Transports (``transport=``):

* ``"http"`` (default): ``/v1/envs``, one ``httpx.Client`` with keep-alive, a timeout per request
  (``timeout_s``) and retries on connection errors; a request that may have reached the server is repeated
  only when that is safe (a reset, a delete, a read: never a step, so a step is never applied twice).
* ``"ws"``: the server's OpenEnv transport, one WebSocket connection per session
  (``/openenv/{env_id}/ws``; ``sandbox_server/routes/openenv.py``), about half the client CPU per step of
  an HTTP request. The session lives as long as the connection: ``close`` (or a dropped connection)
  ends it. A fork's children each open their own connection and attach their session. A message is sent
  again only after a busy answer (below).

Both send the server's API key (``api_key=``, else ``FORKYARD_API_KEY``: :mod:`envs.api_key`) and wait on a
busy server: a ``503 unavailable`` answer (nothing ran) is retried after its ``Retry-After`` for up to
``busy_timeout_s`` seconds (:mod:`envs.client_retry`).

A missing or wrong API key raises ``PermissionError``. Server and network failures raise
:class:`~envs.core.EnvInfraError` (trainers drop such episodes); a
step after the episode ended raises :class:`~envs.core.EpisodeFinishedError`; a value the server refuses
raises ``ValueError``.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import httpx
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from envs.api_key import api_key as resolve_api_key
from envs.api_key import auth_headers, redact_url
from envs.client_retry import (
    BUSY_TIMEOUT_S, KEEPALIVE_EXPIRY_S, BusyWait, is_busy, retry_after_s, safe_to_repeat,
)
from envs.core import EnvInfraError, EpisodeFinishedError
from envs.text_space import TextSpace

#: Transport errors after which the request may have reached the server with no answer coming back.
_NO_ANSWER = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _http_client(url: str, timeout_s: float, connect_retries: int, key: str | None) -> httpx.Client:
    """The keep-alive HTTP client of a RemoteEnv (shared with its forks): connect retries, idle connections
    kept :data:`~envs.client_retry.KEEPALIVE_EXPIRY_S`, the API key's header."""
    return httpx.Client(base_url=url, timeout=timeout_s, transport=httpx.HTTPTransport(retries=connect_retries),
                        limits=httpx.Limits(max_keepalive_connections=32, max_connections=64,
                                            keepalive_expiry=KEEPALIVE_EXPIRY_S),
                        headers=auth_headers(key))


def _error_status(resp: httpx.Response) -> str | None:
    """The ``status`` of an ErrorBody answer (None when the body is not one)."""
    try:
        body = resp.json()
    except ValueError:
        return None
    return body.get("status") if isinstance(body, dict) else None


class RemoteEnv(gym.Env):
    """Proxy to one env session on a forkyard server.

    Args:
        env_id: the registered id the server should run.
        server_url: base URL of the server, e.g. ``http://localhost:8000``.
        timeout_s: seconds to wait for any one request (sandbox tool calls included), default 60.
        connect_retries: retries of a failed connection (not of a request that was sent), default 3.
        transport: ``"http"`` (``/v1/envs``) or ``"ws"`` (the OpenEnv WebSocket transport).
        api_key: the server's API key (default: ``FORKYARD_API_KEY`` or ``FORKYARD_API_KEY_FILE``, read by
            :func:`envs.api_key.api_key`; None when neither is set), sent as ``Authorization: Bearer``.
        busy_timeout_s: seconds to keep retrying a request the server answered ``503 unavailable`` (nothing
            ran), honouring ``Retry-After`` (:mod:`envs.client_retry`); 0: never. Default 30.
        **kwargs: the env's constructor kwargs, sent to the server.

    Raises:
        ValueError: an unknown ``transport``, a negative ``busy_timeout_s``, or an API key
            :func:`envs.api_key.api_key` refuses.
    """

    metadata = {"render_modes": [], "render_fps": 1, "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, env_id: str, server_url: str, timeout_s: float = 60.0, connect_retries: int = 3,
                 transport: str = "http", api_key: str | None = None, busy_timeout_s: float = BUSY_TIMEOUT_S,
                 **kwargs: Any):
        if transport not in ("http", "ws"):
            raise ValueError(f"transport must be 'http' or 'ws', got {transport!r}")
        BusyWait(busy_timeout_s)  # validates it
        self.transport, self.timeout_s, self.busy_timeout_s = transport, float(timeout_s), float(busy_timeout_s)
        self._socket: ClientConnection | None = None
        self.env_id = env_id
        self.server_url = server_url.rstrip("/")
        self.kwargs = kwargs
        self._api_key = resolve_api_key(api_key)
        self._client = _http_client(self.server_url, self.timeout_s, connect_retries, self._api_key)
        self._client_refs = [1]  # shared with forks: the client closes when the last env using it closes
        self.session_id: str | None = None
        self.turn = 0
        self.done = False
        self.observation_space = TextSpace(8192)
        self.action_space = TextSpace(4096)

    # ------------------------------------------------------------------ transport
    def _request(self, method: str, path: str, json: dict | None = None) -> dict:
        busy, repeated = None, False
        while True:
            try:
                resp = self._client.request(method, path, json=json)
            except httpx.HTTPError as exc:
                if not repeated and isinstance(exc, _NO_ANSWER) and safe_to_repeat(method, path):
                    repeated = True  # the server closed an idle connection under it: once more, on a new one
                    continue
                raise EnvInfraError(f"{method} {redact_url(self.server_url)}{path} failed: {exc!r}") from exc
            if resp.status_code == 503 and is_busy(503, _error_status(resp)):
                busy = busy or BusyWait(self.busy_timeout_s)
                if busy.wait(retry_after_s(resp.headers.get("Retry-After"))):
                    continue
            break
        if resp.status_code == 401:
            raise PermissionError(f"{method} {path}: HTTP 401: {resp.text[:500]} (set FORKYARD_API_KEY or api_key=)")
        if resp.status_code == 409:
            raise EpisodeFinishedError(resp.json().get("detail", "the episode has ended"))
        if resp.status_code >= 500 or resp.status_code == 404 and path != "/v1/envs":
            raise EnvInfraError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:500]}")
        if resp.status_code >= 400:
            raise ValueError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:500]}")
        return resp.json() if resp.content else {}

    def _adopt(self, data: dict) -> None:
        self.observation_space = TextSpace(data["observation_max_length"])
        self.action_space = TextSpace(data["action_max_length"])

    def _ask(self, kind: str, data: dict) -> dict:
        """One message over this env's WebSocket (opened at first use); the answer's data."""
        busy = None
        while True:
            try:
                if self._socket is None:
                    url = "ws" + self.server_url[4:] if self.server_url.startswith("http") else self.server_url
                    self._socket = connect(f"{url}/openenv/{self.env_id}/ws", open_timeout=self.timeout_s,
                                           max_size=None, additional_headers=auth_headers(self._api_key),
                                           ).__enter__()  # entered as a context; closed by close()
                self._socket.send(json.dumps({"type": kind, "data": data}))
                answer = json.loads(self._socket.recv(timeout=self.timeout_s))
            except InvalidStatus as exc:
                if exc.response.status_code == 401:
                    raise PermissionError(f"{kind} over {redact_url(self.server_url)}/openenv/{self.env_id}/ws: HTTP 401: the server "
                                          "requires an API key (set FORKYARD_API_KEY or api_key=)") from None
                raise EnvInfraError(f"{kind} over {redact_url(self.server_url)}/openenv/{self.env_id}/ws failed: {exc!r}") from exc
            except (OSError, TimeoutError, WebSocketException) as exc:
                raise EnvInfraError(f"{kind} over {redact_url(self.server_url)}/openenv/{self.env_id}/ws failed: {exc!r}") from exc
            if answer.get("type") != "error":
                return answer["data"]
            err = answer["data"]
            if is_busy(err.get("http_status", 500), err.get("status")):  # nothing ran: wait and send it again
                busy = busy or BusyWait(self.busy_timeout_s)
                if busy.wait(retry_after_s(err.get("retry_after_s"))):
                    continue
            break
        status, text = err.get("http_status", 500), f"{kind}: {err.get('code')}: {err.get('message')}"
        if status == 409 and kind == "step":
            raise EpisodeFinishedError(err.get("message", "the episode has ended"))
        if status >= 500 or status == 404:
            raise EnvInfraError(text)
        raise ValueError(text)

    def _ws_result(self, data: dict) -> tuple[str, dict[str, Any]]:
        o = data["observation"]
        self.session_id = o["session_id"]
        if "observation_max_length" in o:
            self._adopt(o)
        self.turn, self.done = o["info"]["turn"], bool(data["done"])
        return o["text"], o["info"]

    # ------------------------------------------------------------------ Gymnasium API
    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise gym.error.ClosedEnvironmentError("this RemoteEnv is closed (its session ended): make a new one")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._check_open()
        super().reset(seed=seed)
        if self.transport == "ws":
            return self._ws_result(self._ask("reset", {"seed": seed, "options": options, "kwargs": self.kwargs}))
        if self.session_id is None:
            data = self._request("POST", "/v1/envs", {"env_id": self.env_id, "kwargs": self.kwargs, "seed": seed, "options": options})
            self.session_id = data["session_id"]
        else:
            data = self._request("POST", f"/v1/envs/{self.session_id}/reset", {"seed": seed, "options": options})
        self._adopt(data)
        self.turn, self.done = data["info"]["turn"], False
        return data["observation"], data["info"]

    def step(self, action: str):
        self._check_open()
        if self.session_id is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        if self.transport == "ws":
            data = self._ask("step", {"action": action})
            o = data["observation"]
            self.turn, self.done = o["info"]["turn"], bool(data["done"])
            return o["text"], data["reward"], o["terminated"], o["truncated"], o["info"]
        data = self._request("POST", f"/v1/envs/{self.session_id}/step", {"action": action})
        self.turn = data["info"]["turn"]
        self.done = data["terminated"] or data["truncated"]
        return data["observation"], data["reward"], data["terminated"], data["truncated"], data["info"]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The session's tools as JSON-schema definitions (``GET /v1/envs/{session_id}/tools``; the
        :class:`envs.features.ToolSchemas` feature of the env on the server, empty when it has none)."""
        if self.session_id is None:
            raise gym.error.ResetNeeded("call reset() before tool_schemas(): the tools are the session's")
        return self._request("GET", f"/v1/envs/{self.session_id}/tools")["tools"]

    def fork(self, n: int = 1) -> list["RemoteEnv"]:
        """n remote envs at this env's state (server-side fork: env, history and sandbox). The copies share this
        episode; their later unseeded resets draw independent episodes (``envs.core.TextEnv.fork``, field case S40).

        Raises:
            EnvInfraError: the server or the connection failed (with ``"ws"``, children attached before the
                failure stay open until they are closed or garbage-collected).
        """
        self._check_open()
        if self.session_id is None:
            raise gym.error.ResetNeeded("call reset() before fork()")
        if self.transport == "ws":
            sids = self._ask("fork", {"n": n})["session_ids"]
        else:
            sids = self._request("POST", f"/v1/envs/{self.session_id}/fork", {"n": n})["session_ids"]
        children = []
        for sid in sids:
            child = object.__new__(RemoteEnv)
            child.__dict__.update(self.__dict__)
            child.session_id, child._socket = sid, None
            self._client_refs[0] += 1
            children.append(child)
            if self.transport == "ws":  # its own connection; the parent's drops the children it still owns
                child._ws_result(child._ask("attach", {"session_id": sid}))
        return children

    def close(self) -> None:
        """Delete the server-side session (the server's TTL reaps it if the server is unreachable).
        The HTTP client, shared with forks, closes with the last env that uses it."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if self._socket is not None:  # the server ends the session with its connection
            try:
                self._socket.close()
            except (OSError, WebSocketException):
                pass
            self._socket, self.session_id = None, None
        if self.session_id is not None:
            try:
                self._client.delete(f"/v1/envs/{self.session_id}")
            except httpx.HTTPError:
                pass
            self.session_id = None
        self._client_refs[0] -= 1
        if self._client_refs[0] <= 0:
            self._client.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support (field case S44): a RemoteEnv with no server session yet pickles as its settings
        (env id, server URL, kwargs, transport, timeouts, API key: the pickle carries the key) and opens its own
        connection when unpickled.

        Raises:
            TypeError: the env holds a live server session (or WebSocket), which cannot cross a process
                boundary; pickle it before ``reset`` or make a new one in the other process.
        """
        if self.session_id is not None or self._socket is not None or getattr(self, "_closed", False):
            raise TypeError(
                f"cannot pickle a RemoteEnv holding live server session {self.session_id!r} of {self.env_id!r} on "
                f"{redact_url(self.server_url)} (or a closed one): the session and its connection cannot cross a process "
                "boundary; pickle the env before reset(), or make a new one in the other process")
        state = {k: v for k, v in self.__dict__.items() if k not in ("_client", "_client_refs", "_socket")}
        pool = getattr(self._client._transport, "_pool", None)  # httpx keeps the retries on its pool
        state["_connect_retries"] = getattr(pool, "_retries", 3)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        retries = state.pop("_connect_retries")
        self.__dict__.update(state)  # the API key (``_api_key``) travels with the settings
        self._socket = None
        self._client = _http_client(self.server_url, self.timeout_s, retries, getattr(self, "_api_key", None))
        self._client_refs = [1]

    def __del__(self):  # best effort: a garbage-collected env frees its server session
        try:
            if not self._client.is_closed:
                self.close()
        except Exception:  # noqa: BLE001
            pass


@dataclass(frozen=True)
class EnvFactory:
    """The Gymnasium entry point of a forkyard id: ``EnvFactory(...)(**kw)`` builds the local env (the class
    named by ``entry_point``, ``"module:Class"``), or a :class:`RemoteEnv` for ``env_id`` given ``server_url``.

    A module-level class of two strings, so specs and envs made by ``gymnasium.make`` pickle (field case S44:
    a closure here made every spec unpicklable); an unpickled factory imports its module on first call.
    """

    entry_point: str
    env_id: str

    def __call__(self, server_url: str | None = None, **kwargs: Any) -> gym.Env:
        if server_url:
            return RemoteEnv(self.env_id, server_url, **kwargs)
        module, _, name = self.entry_point.partition(":")
        return getattr(importlib.import_module(module), name)(**kwargs)


def env_factory(entry_point: str, env_id: str) -> EnvFactory:
    """A Gymnasium entry point (a picklable :class:`EnvFactory`) that builds the local env, or a
    :class:`RemoteEnv` given ``server_url``."""
    return EnvFactory(entry_point, env_id)
