"""A Gymnasium env that proxies to a forkyard server's env sessions.

``gymnasium.make("forkyard/ClueProbe-v0", server_url="http://localhost:8000")`` (any forkyard id)
returns a :class:`RemoteEnv`: ``reset`` opens a session on the server (or resets it), ``step`` sends
the action, ``fork(n)`` forks the server-side session and returns n ``RemoteEnv``s sharing this one's
transport, ``close`` deletes the session. The server runs the env (and its sandbox). ``RemoteEnv`` is a
Gymnasium shim over :class:`envs.session_client.SessionClient`, which moves the operations and decodes the
answers and errors of both transports the same way.

Transports (``transport=``):

* ``"http"`` (default): ``/v1/envs``, keep-alive connections of one ``httpx.HTTPTransport``
  (``envs.http_connections.HttpConnections``) with a timeout per request (``timeout_s``) and retries on
  connection errors; a request that may have reached the server is repeated only when that is safe (a reset,
  a delete, a read: never a step, so a step is never applied twice).
* ``"ws"``: the server's OpenEnv transport, one WebSocket connection driving each session
  (``/openenv/{env_id}/ws``; ``sandbox_server/routes/openenv.py``), the least client CPU per step. The
  session lives as long as the connection: ``close`` (or a dropped connection) ends it. Connections are opened
  only when needed and a few idle ones are kept for the next session: a fork's children ride the parent's
  connection until each is first used (then it attaches over an idle or a new connection), so a fork opens no
  connection and children closed unused cost none (``envs.session_client.WsTransport``). A message is sent again
  only after a busy answer (below).

:func:`close_many` closes many envs (a fork's children) with one request per transport: ``/v1/envs/batch/delete``
over HTTP, one message per connection over the WebSocket.

Both send the server's API key (``api_key=``, else ``FORKYARD_API_KEY``: :mod:`envs.api_key`) and wait on a
busy server: a ``503 unavailable`` answer (nothing ran) is retried after its ``Retry-After`` for up to
``busy_timeout_s`` seconds (:mod:`envs.client_retry`).

A missing or wrong API key raises ``PermissionError``. Server and network failures raise
:class:`~envs.core.EnvInfraError` (trainers drop such episodes); a
step after the episode ended raises :class:`~envs.core.EpisodeFinishedError`; a value the server refuses
raises ``ValueError``.

A session lost on the server (it restarted, or the session expired) fails its episode's next step with
:class:`~envs.core.EnvInfraError` (never replayed), and ``reset`` opens a new session (field case S61). An env
used in a fork child (a ``fork`` multiprocessing pool, a DataLoader worker) opens connections of its own there;
the session opened before the fork stays the parent's: ``reset`` in the child opens the child's own, anything
else on the parent's raises :class:`~envs.process_local.InheritedConnectionError` (field case S59).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Iterable

import gymnasium as gym

from envs.api_key import client_credentials, conceal, redact
from envs.client_retry import BUSY_TIMEOUT_S, BusyWait
from envs.finalize import run_finalizer
from envs.session_client import SessionClient, make_transport
from envs.text_space import TextSpace


class RemoteEnv(gym.Env):
    """Proxy to one env session on a forkyard server: a Gymnasium shim over
    :class:`envs.session_client.SessionClient`.

    Args:
        env_id: the registered id the server should run.
        server_url: base URL of the server, e.g. ``http://localhost:8000``; a key in its user info
            (``http://forkyard:KEY@host:8000``, percent-encoded) is taken out and sent as a header, the URL kept
            without it (:func:`envs.api_key.client_credentials`, field case S60).
        timeout_s: seconds to wait for any one request (sandbox tool calls included), default 60.
        connect_retries: retries of a failed connection (not of a request that was sent), default 3.
        transport: ``"http"`` (``/v1/envs``) or ``"ws"`` (the OpenEnv WebSocket transport).
        api_key: the server's API key (default: the URL's, else ``FORKYARD_API_KEY`` or ``FORKYARD_API_KEY_FILE``,
            read by :func:`envs.api_key.api_key`; None when none is set), sent as ``Authorization: Bearer``.
        busy_timeout_s: seconds to keep retrying a request the server answered ``503 unavailable`` (nothing
            ran), honouring ``Retry-After`` (:mod:`envs.client_retry`); 0: never. Default 30.
        **kwargs: the env's constructor kwargs, sent to the server.

    Raises:
        ValueError: an unknown ``transport``, a negative ``busy_timeout_s``, or an API key (or URL user info)
            :func:`envs.api_key.client_credentials` refuses; the message shows no key.
    """

    metadata = {"render_modes": [], "render_fps": 1, "autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}

    def __init__(self, env_id: str, server_url: str, timeout_s: float = 60.0, connect_retries: int = 3,
                 transport: str = "http", api_key: str | None = None, busy_timeout_s: float = BUSY_TIMEOUT_S,
                 **kwargs: Any):
        if transport not in ("http", "ws"):
            raise ValueError(f"transport must be 'http' or 'ws', got {transport!r}")
        BusyWait(busy_timeout_s)  # validates it
        self.transport, self.timeout_s, self.busy_timeout_s = transport, float(timeout_s), float(busy_timeout_s)
        self.connect_retries = int(connect_retries)
        self.env_id = env_id
        self.server_url, self._api_key = client_credentials(server_url.rstrip("/"), api_key)
        self.kwargs = kwargs
        self._session = self._new_session()
        self.turn = 0
        self.done = False
        self.observation_space = TextSpace(8192)
        self.action_space = TextSpace(4096)

    @property
    def spec(self) -> gym.envs.registration.EnvSpec | None:
        """The Gymnasium spec ``gymnasium.make`` gave this env (None otherwise)."""
        return self.__dict__.get("_spec")

    @spec.setter
    def spec(self, value: gym.envs.registration.EnvSpec | None) -> None:
        """Keep ``value`` with its ``api_key`` and ``server_url`` kwargs concealed (:func:`envs.api_key.conceal`):
        ``gymnasium.make(env.spec)`` still works, ``repr(env.spec)`` shows no key (field case S60)."""
        if value is not None:
            value = dataclasses.replace(value, kwargs=conceal(value.kwargs))
        self.__dict__["_spec"] = value

    def _new_session(self) -> SessionClient:
        wire = make_transport(self.transport, self.server_url, self.env_id, self.kwargs, self.timeout_s,
                              self.connect_retries, self._api_key)
        return SessionClient(wire, self.env_id, self.kwargs, self.busy_timeout_s)

    @property
    def session_id(self) -> str | None:
        """The server-side session's id (None before the first ``reset`` and after ``close``)."""
        return self._session.session_id

    @property
    def _client(self):
        """The transport (shared with forks); ``is_closed`` once the last env using it closed."""
        return self._session.transport

    # ------------------------------------------------------------------ Gymnasium API
    def _check_open(self) -> None:
        if self._session.closed:
            raise gym.error.ClosedEnvironmentError("this RemoteEnv is closed (its session ended): make a new one")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._check_open()
        super().reset(seed=seed)
        data = self._session.reset(seed, options)
        lengths = data.observation_max_length, data.action_max_length
        if lengths != (self.observation_space.max_length, self.action_space.max_length):
            self.observation_space, self.action_space = TextSpace(lengths[0]), TextSpace(lengths[1])
        self.turn, self.done = data.info["turn"], False
        return data.observation, data.info

    def step(self, action: str):
        self._check_open()
        if self._session.session_id is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        data = self._session.step(action)
        self.turn, self.done = data.info["turn"], data.terminated or data.truncated
        return data.observation, data.reward, data.terminated, data.truncated, data.info

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The session's tools as JSON-schema definitions (``GET /v1/envs/{session_id}/tools``; the
        :class:`envs.features.ToolSchemas` feature of the env on the server, empty when it has none)."""
        if self._session.session_id is None:
            raise gym.error.ResetNeeded("call reset() before tool_schemas(): the tools are the session's")
        return self._session.tools()

    def fork(self, n: int = 1) -> list["RemoteEnv"]:
        """n remote envs at this env's state (server-side fork: env, history and sandbox), in one request; they
        share this env's transport and Gymnasium spaces (the space objects themselves, until a reset of the copy
        names other lengths). The copies share this episode; their later unseeded resets draw independent
        episodes (``envs.core.TextEnv.fork``, field case S40). With ``"ws"`` the children ride this env's
        connection until each is first used (module docstring); if that connection fails first, they are lost
        with it (their step raises EnvInfraError, a reset opens a new session). Close them together with
        :func:`close_many` (one request).

        Raises:
            EnvInfraError: the server or the connection failed.
        """
        self._check_open()
        if self._session.session_id is None:
            raise gym.error.ResetNeeded("call reset() before fork()")
        children = []
        for session in self._session.fork(n):
            child = object.__new__(RemoteEnv)
            child.__dict__.update(self.__dict__)
            child._session = session
            children.append(child)
        return children

    def close(self) -> None:
        """Delete the server-side session (the server's TTL reaps it if the server is unreachable).
        The transport, shared with forks, closes with the last env that uses it."""
        self._session.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickle support (field case S44): a RemoteEnv with no server session yet pickles as its settings
        (env id, server URL, kwargs, transport, timeouts, API key: the pickle carries the key) and opens its own
        connection when unpickled.

        Raises:
            TypeError: the env holds a live server session (or WebSocket), which cannot cross a process
                boundary; pickle it before ``reset`` or make a new one in the other process.
        """
        if self.session_id is not None or self._session.closed:
            raise TypeError(
                f"cannot pickle a RemoteEnv holding live server session {self.session_id!r} of {self.env_id!r} on "
                f"{redact(self.server_url)} (or a closed one): the session and its connection cannot cross a "
                "process boundary; pickle the env before reset(), or make a new one in the other process")
        return {k: v for k, v in self.__dict__.items() if k != "_session"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)  # the API key (``_api_key``) travels with the settings
        self._session = self._new_session()

    def __del__(self):  # best effort: a garbage-collected env frees its server session, never on an event loop
        session = self.__dict__.get("_session")
        if session is not None:
            run_finalizer(session.close)


def close_many(envs: Iterable[RemoteEnv]) -> None:
    """Close many :class:`RemoteEnv` (a fork's children, say) as ``close`` does, their server sessions deleted with
    one request per transport (``/v1/envs/batch/delete`` over HTTP; over the WebSocket one message per connection,
    one in all for children never used): :meth:`envs.session_client.SessionClient.close_many`. Best effort (the
    server's TTL or lease reaps what could not be deleted now); never raises for a server or network failure."""
    SessionClient.close_many([env._session for env in envs])


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
