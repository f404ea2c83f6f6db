"""The server's door: a bearer key required on every route and transport but ``/healthz``.

:class:`ApiKeyMiddleware` is pure ASGI and wraps the whole app, so it sees every HTTP request (``/v1``,
``/openenv``, ``/metrics``, ``/docs``, ``/openapi.json``) and every WebSocket handshake before any route,
body limit or body read. A request is let in when its ``Authorization`` header is ``Bearer KEY`` or HTTP
Basic credentials whose password is ``KEY`` (what a WebSocket library sends for a URL
``ws://user:KEY@host/...``); the comparison takes constant time (``hmac.compare_digest``). Otherwise:

* HTTP: 401 ``{"detail": ..., "status": "unauthorized"}`` (:class:`~sandbox_server.models.ErrorBody`) with
  ``WWW-Authenticate: Bearer``; the body is never read.
* WebSocket: the handshake is refused with the same 401 answer (uvicorn's WebSocket denial response);
  a server without that extension closes the handshake with code 1008 (policy violation).

The key comes from :func:`envs.api_key.api_key` (``FORKYARD_API_KEY`` or ``FORKYARD_API_KEY_FILE``), the
reader the clients use too. ``/healthz`` stays open so that orchestrators (compose's health check,
Kubernetes probes) need no secret; it reveals no session id, sandbox nor setting: only counts (the pool's,
and env sessions' by registered env id and transport).
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Sequence

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from sandbox_server.http_contract import route_path

#: Paths served without a key.
OPEN_PATHS = frozenset({"/healthz"})


class HiddenKey(str):
    """A key whose ``repr`` hides it (Starlette's ``Middleware`` records show their keyword arguments)."""

    def __repr__(self) -> str:
        return "<hidden>"


class HiddenKeys(tuple):
    """The keys a server accepts (``NEW,OLD`` during a rotation), whose ``repr`` hides them."""

    def __repr__(self) -> str:
        return "<hidden>"


class ApiKeyMiddleware:
    """Refuse (401) every HTTP request and WebSocket handshake that does not carry one of the keys (module
    docstring).

    Args:
        app: the ASGI app to guard.
        key: the key, or the keys accepted during a rotation (``NEW``, ``OLD``; field case S54), each checked by
            :func:`envs.api_key.check_key` before it gets here.
    """

    def __init__(self, app: ASGIApp, key: str | Sequence[str]):
        self.app = app
        self._keys = tuple(k.encode("ascii") for k in ((key,) if isinstance(key, str) else key))

    def __repr__(self) -> str:
        return f"ApiKeyMiddleware(app={self.app!r}, key=<hidden>)"

    def authorized(self, scope: Scope) -> bool:
        """Whether the request's ``Authorization`` header carries the key (Bearer, or Basic's password)."""
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if header is None:
            return False
        scheme, _, value = header.partition(b" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == b"basic":
            try:
                value = base64.b64decode(value, validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                return False
        elif scheme != b"bearer":
            return False
        matched = False
        for key in self._keys:  # every key compared: the time taken does not say which one matched
            matched |= hmac.compare_digest(value, key)
        return matched

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or route_path(scope) in OPEN_PATHS or self.authorized(scope):
            await self.app(scope, receive, send)
            return
        has_header = any(k == b"authorization" for k, _ in scope.get("headers", ()))
        detail = ("the API key is wrong" if has_header else
                  "this server requires an API key: send 'Authorization: Bearer KEY' (clients read FORKYARD_API_KEY)")
        body = orjson.dumps({"detail": detail, "status": "unauthorized"})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"www-authenticate", b'Bearer realm="forkyard"')]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})


__all__ = ["ApiKeyMiddleware", "HiddenKey", "HiddenKeys", "OPEN_PATHS"]
