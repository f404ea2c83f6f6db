"""An OpenEnv client that also speaks forkyard's fork extension (needs the ``openenv-core`` package).

OpenEnv's own clients (``GenericEnvClient``, or a typed ``EnvClient`` subclass) run forkyard episodes
unchanged against ``http://HOST:PORT/openenv/{env_id}`` (see ``sandbox_server/routes/openenv.py``).
:class:`ForkyardEnvClient` is ``GenericEnvClient`` plus the extension's messages::

    from envs.openenv_client import ForkyardEnvClient

    base = "http://127.0.0.1:8000/openenv/forkyard/ClueProbe-v0"
    with ForkyardEnvClient(base_url=base).sync() as env:
        env.reset(seed=0, kwargs={"max_turns": 4})
        env.step({"action": "probe(0)"})
        children = env.fork(2)                  # 2 session ids at this state, owned by this connection
        token = env.snapshot()                  # opaque, authenticated: restore with env.reset(snapshot=token)
        with ForkyardEnvClient(base_url=base).sync() as branch:
            branch.attach(children[0])          # this connection now drives the child
            branch.step({"action": "probe(1)"})
        env.delete(children[1:])                # or leave them: they go when this connection closes

Every method raises ``RuntimeError("Server error: ... (code: ...)")`` on an error answer, as OpenEnv's
client does. The server's API key (``api_key=``, else the key in ``base_url``'s user info, else
``FORKYARD_API_KEY``: :func:`envs.api_key.client_credentials`) goes in the WebSocket handshake's
``Authorization`` header; the client keeps the URL without user info, so no message of OpenEnv's or of
websockets' can show the key (field case S60). OpenEnv's own clients, which send no header, carry a credential
in the URL's user info instead, ``http://forkyard:TOKEN@HOST:PORT/openenv/{env_id}``, and print that URL in
their errors: give them a URL token (``POST /v1/tokens``: :mod:`sandbox_server.auth`), never the server's key.

The session lives on the connection. A connection that closed (the server restarted or dropped it) or failed
in the middle of a message (a late answer could be read as the next one's) is dropped: the message raises
:class:`~envs.core.EnvInfraError` (a ``RuntimeError``), never sent again, and a ``reset`` (which needs nothing
of the lost episode) opens a new connection (field case S61). Used in a fork child, the client never touches
the parent's connection (field case S59): ``reset`` and ``attach`` open one of the child's own; anything else
raises :class:`~envs.process_local.InheritedConnectionError`, and ``close`` leaves the parent's connection open.
"""

from __future__ import annotations

import os
from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.generic_client import GenericEnvClient
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.protocol import State

from envs.api_key import auth_headers, client_credentials, redact
from envs.core import EnvInfraError
from envs.process_local import inherited_error, keep_inherited

#: Messages that start a session on a connection (so they may open a new one: field cases S59, S61).
_OPENERS = ("reset", "attach")


class ForkyardEnvClient(GenericEnvClient):
    """``GenericEnvClient`` with ``fork``, ``attach``, ``snapshot`` and ``delete`` (async; ``.sync()`` wraps
    them like the others). Observations are dicts: ``text``, ``info``, ``terminated``, ``truncated``,
    ``session_id``.

    Args:
        base_url: ``http://HOST:PORT/openenv/{env_id}`` (a key in its user info is sent as a header instead).
        api_key: the server's API key (default: the URL's, else ``FORKYARD_API_KEY`` / ``FORKYARD_API_KEY_FILE``).
        **kwargs: ``GenericEnvClient``'s own (timeouts, message size).

    Raises:
        ValueError: an API key (or URL user info) :func:`envs.api_key.client_credentials` refuses.
    """

    _ws: Any  # OpenEnv's connection (None until connect), set by the base class

    def __init__(self, base_url: str, *, api_key: str | None = None, **kwargs: Any):
        base_url, key = client_credentials(base_url, api_key, "base_url")
        super().__init__(base_url=base_url, **kwargs)
        self._headers, self._secrets = auth_headers(key), (key,)
        self._ws_pid = os.getpid()

    def _parents(self, kind: str | None) -> None:
        """In a fork child, leave the parent's connection untouched; refuse ``kind`` unless it opens a session."""
        if self._ws is not None and self._ws_pid != os.getpid():
            keep_inherited(self._ws)
            self._ws, pid = None, self._ws_pid
            if kind is not None and kind not in _OPENERS:
                raise inherited_error("this ForkyardEnvClient's WebSocket session", pid, f"{kind!r} is refused: "
                                      "reset() here opens a session of this process, or make the client here.")

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None and ws.state is not State.CLOSED:
            ws.transport.abort()  # no close handshake: the connection's answers cannot be trusted

    async def connect(self) -> "ForkyardEnvClient":
        """Open the WebSocket (once), sending the API key's header; ConnectionError when it cannot."""
        self._parents(None)
        if self._ws is None:
            try:
                self._ws = await ws_connect(self._ws_url, open_timeout=self._connect_timeout,
                                            max_size=self._max_message_size, additional_headers=self._headers)
            except Exception as exc:  # noqa: BLE001 - as OpenEnv's client: any failure to open is a ConnectionError
                raise ConnectionError(redact(f"Failed to connect to {self._ws_url}: {exc}", self._secrets)) from exc
            self._ws_pid = os.getpid()
        return self

    async def disconnect(self) -> None:
        """Close the WebSocket (in a fork child, only one this process opened)."""
        self._parents(None)
        await super().disconnect()

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        """OpenEnv's exchange, plus the module docstring's rules for lost connections and fork children."""
        kind = str(message.get("type"))
        self._parents(kind)
        if kind in _OPENERS and self._ws is not None and self._ws.state is State.CLOSED:
            self._ws = None  # its session ended with it: a reset needs nothing of it
        await self._ensure_connected()  # ConnectionError when it cannot, as OpenEnv's client
        try:
            return await super()._send_and_receive(message)
        except (OSError, TimeoutError, WebSocketException) as exc:
            self._drop()
            if kind in _OPENERS and isinstance(exc, ConnectionClosed):  # closed as it was sent: open a new one
                await self._ensure_connected()
                return await super()._send_and_receive(message)
            raise EnvInfraError(redact(f"{kind} over {self._ws_url} failed: {exc!r}; the connection is closed and "
                                       "its session ended: reset() opens a new one", self._secrets)) from exc

    async def fork(self, n: int = 1) -> list[str]:
        """``n`` new sessions at this session's state: their ids (deleted when this connection closes unless
        another connection attaches them)."""
        answer = await self._send_and_receive({"type": "fork", "data": {"n": n}})
        return list(answer["data"]["session_ids"])

    async def attach(self, session_id: str) -> StepResult[dict[str, Any]]:
        """Drive ``session_id`` (a fork's child) from this connection; its latest observation."""
        answer = await self._send_and_receive({"type": "attach", "data": {"session_id": session_id}})
        return self._parse_result(answer.get("data", {}))

    async def snapshot(self) -> str:
        """This session's state as an opaque token; ``reset(snapshot=token)`` restores it."""
        answer = await self._send_and_receive({"type": "snapshot", "data": {}})
        return str(answer["data"]["snapshot"])

    async def delete(self, session_ids: list[str]) -> dict[str, list[str]]:
        """Close many sessions in one message: ``{"deleted": [...], "missing": [...]}``."""
        answer = await self._send_and_receive({"type": "delete", "data": {"session_ids": list(session_ids)}})
        return dict(answer["data"])


__all__ = ["ForkyardEnvClient"]
