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

URL tokens (field case S60). Clients that are not forkyard's (OpenEnv's ``GenericEnvClient``, verifiers) carry
a credential only in a URL, ``http://forkyard:CREDENTIAL@host/openenv/...``, and print and store that URL (in
connection errors, in traces). The credential to put there is a URL token, worth little when leaked, never the
server's key: ``POST /v1/tokens`` with the key (``Authorization: Bearer KEY``; body ``{"ttl_s": 3600, "env_id":
"forkyard/ClueProbe-v0"}``, both optional) answers 201 ``{"token", "expires_at", "scope", "userinfo"}``. A token
opens only paths under its ``scope`` (``/openenv/`` or ``/openenv/{env_id}/``: the OpenEnv routes and WebSocket),
until ``expires_at`` (``ttl_s`` seconds, at most :data:`MAX_TOKEN_TTL_S`), sent as Basic's password or as Bearer;
it is URL-safe as it is, mints no other token, and is sealed (HMAC-SHA256) with a secret derived from the first
key and opened with any (so a key's retirement at the end of a rotation retires its tokens, and a restart keeps
them). The key itself still opens everything when sent as Basic credentials (refusing it would break every
client set up by the previous docs), but the first such request logs a warning that points to tokens.

The key comes from :func:`envs.api_key.api_key` (``FORKYARD_API_KEY`` or ``FORKYARD_API_KEY_FILE``), the
reader the clients use too. ``/healthz`` stays open so that orchestrators (compose's health check,
Kubernetes probes) need no secret; it reveals no session id, sandbox nor setting: only counts (the pool's,
and env sessions' by registered env id and transport).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from sandbox_server.http_contract import route_path

#: Paths served without a key.
OPEN_PATHS = frozenset({"/healthz"})
#: The route that mints URL tokens (served by the middleware itself).
TOKEN_PATH = "/v1/tokens"
#: What every URL token starts with.
TOKEN_PREFIX = "fyt1."
#: A URL token's lifetime when the request names none, and the longest one may ask, in seconds.
TOKEN_TTL_S, MAX_TOKEN_TTL_S = 3600, 7 * 86400

log = logging.getLogger(__name__)


class HiddenKey(str):
    """A key whose ``repr`` hides it (Starlette's ``Middleware`` records show their keyword arguments)."""

    def __repr__(self) -> str:
        return "<hidden>"


class HiddenKeys(tuple):
    """The keys a server accepts (``NEW,OLD`` during a rotation), whose ``repr`` hides them."""

    def __repr__(self) -> str:
        return "<hidden>"


class ApiKeyMiddleware:
    """Refuse (401) every HTTP request and WebSocket handshake that carries neither one of the keys nor a URL token
    of its path, and answer ``POST /v1/tokens`` (module docstring).

    Args:
        app: the ASGI app to guard.
        key: the key, or the keys accepted during a rotation (``NEW``, ``OLD``; field case S54), each checked by
            :func:`envs.api_key.check_key` before it gets here. Tokens are sealed with the first, opened with any.
        clock: seconds since the epoch (``time.time``; tests pass their own).
    """

    def __init__(self, app: ASGIApp, key: str | Sequence[str], clock: Callable[[], float] = time.time):
        self.app = app
        self._keys = tuple(k.encode("ascii") for k in ((key,) if isinstance(key, str) else key))
        self._seals = tuple(hmac.new(k, b"forkyard url token v1", hashlib.sha256).digest() for k in self._keys)
        self._clock = clock
        self.key_in_url_warned = False

    def __repr__(self) -> str:
        return f"ApiKeyMiddleware(app={self.app!r}, key=<hidden>)"

    def credential(self, scope: Scope) -> tuple[bytes | None, bool]:
        """The secret the request carries (``Authorization: Bearer`` or HTTP Basic's password) and whether it
        came as Basic (how a credential written in a URL's user info travels); ``(None, False)`` without one."""
        header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), None)
        if header is None:
            return None, False
        scheme, _, value = header.partition(b" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme == b"basic":
            try:
                return base64.b64decode(value, validate=True).partition(b":")[2], True
            except (binascii.Error, ValueError):
                return None, True
        return (value, False) if scheme == b"bearer" else (None, False)

    def is_key(self, value: bytes | None) -> bool:
        """Whether ``value`` is one of the server's keys (every key compared, in constant time each)."""
        matched = False
        for key in self._keys:  # the time taken does not say which one matched
            matched |= value is not None and hmac.compare_digest(value, key)
        return matched

    def authorized(self, scope: Scope) -> bool:
        """Whether the request carries a key, or an unexpired URL token whose scope holds the request's path."""
        value, basic = self.credential(scope)
        if self.is_key(value):
            if basic and not self.key_in_url_warned:
                self.key_in_url_warned = True
                log.warning("a client sent the server's API key as HTTP Basic credentials, as a key written in a "
                            "URL travels; clients print and store URLs (field case S60): give them a scoped, "
                            "expiring URL token (POST %s) instead", TOKEN_PATH)
            return True
        if value is None or not value.startswith(TOKEN_PREFIX.encode()):
            return False
        prefix = open_token(value.decode("ascii", "replace"), self._seals, self._clock())
        path = route_path(scope)
        return prefix is not None and path.startswith(prefix) and ".." not in path.split("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or route_path(scope) in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http" and route_path(scope) == TOKEN_PATH:
            await self.mint(scope, receive, send)
            return
        if self.authorized(scope):
            await self.app(scope, receive, send)
            return
        has_header = any(k == b"authorization" for k, _ in scope.get("headers", ()))
        detail = ("the API key is wrong (or the URL token is wrong, expired or not for this path)" if has_header else
                  "this server requires an API key: send 'Authorization: Bearer KEY' (clients read FORKYARD_API_KEY)")
        if scope["type"] == "http":
            await _answer(send, 401, {"detail": detail, "status": "unauthorized"})
            return
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await _answer(send, 401, {"detail": detail, "status": "unauthorized"}, "websocket.")
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})

    async def mint(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/tokens``: a URL token (module docstring), for a request that carries one of the keys."""
        if scope["method"] != "POST":
            await _answer(send, 405, {"detail": f"{TOKEN_PATH} takes POST", "status": "method_not_allowed"})
            return
        if not self.is_key(self.credential(scope)[0]):  # a token never mints another
            detail = f"{TOKEN_PATH} needs the server's API key ('Authorization: Bearer KEY'), not a URL token"
            await _answer(send, 401, {"detail": detail, "status": "unauthorized"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > 4096:
                await _answer(send, 413, {"detail": "a token request is at most 4096 bytes", "status": "too_large"})
                return
            if not message.get("more_body"):
                break
        try:
            ttl_s, prefix = token_request(orjson.loads(body) if body.strip() else {})
        except (ValueError, orjson.JSONDecodeError) as exc:
            await _answer(send, 422, {"detail": str(exc), "status": "invalid"})
            return
        expires = int(self._clock()) + ttl_s
        token = seal_token(self._seals[0], prefix, expires)
        await _answer(send, 201, {"token": token, "expires_at": expires, "scope": prefix,
                                  "userinfo": f"forkyard:{token}"})


def token_request(body: Any) -> tuple[int, str]:
    """``(ttl_s, path prefix)`` of a ``POST /v1/tokens`` body ``{"ttl_s": int, "env_id": str}`` (both optional:
    :data:`TOKEN_TTL_S`, every env id).

    Raises:
        ValueError: not an object, another field, a ``ttl_s`` outside 1..:data:`MAX_TOKEN_TTL_S`, an ``env_id``
            that is not a plain id (empty, ``..``, a leading or trailing ``/``, control characters).
    """
    if not isinstance(body, dict) or set(body) - {"ttl_s", "env_id"}:
        raise ValueError('the body is {"ttl_s": seconds, "env_id": id}, both optional')
    ttl_s, env_id = body.get("ttl_s", TOKEN_TTL_S), body.get("env_id")
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not 1 <= ttl_s <= MAX_TOKEN_TTL_S:
        raise ValueError(f"ttl_s must be an integer of seconds in 1..{MAX_TOKEN_TTL_S}")
    if env_id is None:
        return ttl_s, "/openenv/"
    if (not isinstance(env_id, str) or not env_id or env_id != env_id.strip("/") or ".." in env_id.split("/")
            or any(ord(c) < 33 or ord(c) == 127 for c in env_id)):
        raise ValueError("env_id must be a registered env id such as forkyard/ClueProbe-v0")
    return ttl_s, f"/openenv/{env_id}/"


def seal_token(seal: bytes, prefix: str, expires: int) -> str:
    """A URL token for paths under ``prefix`` until ``expires`` (seconds since the epoch), sealed (HMAC-SHA256)
    with ``seal``: ``fyt1.PAYLOAD.MAC``, URL-safe base64 without padding (characters a URL carries as they are)."""
    payload = _b64(orjson.dumps({"exp": expires, "path": prefix}))
    return f"{TOKEN_PREFIX}{payload}.{_b64(hmac.new(seal, payload.encode(), hashlib.sha256).digest())}"


def open_token(token: str, seals: Sequence[bytes], now: float) -> str | None:
    """The path prefix of ``token`` when one of ``seals`` sealed it and it has not expired at ``now``; else None."""
    try:
        _, payload, mac = token.split(".")
        given = base64.urlsafe_b64decode(mac + "=" * (-len(mac) % 4))
        ok = False
        for seal in seals:
            ok |= hmac.compare_digest(hmac.new(seal, payload.encode(), hashlib.sha256).digest(), given)
        if not ok:
            return None
        claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        prefix, expires = claims["path"], claims["exp"]
    except (ValueError, TypeError, KeyError, binascii.Error, orjson.JSONDecodeError):
        return None
    return prefix if isinstance(prefix, str) and isinstance(expires, int) and now < expires else None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


async def _answer(send: Send, status: int, body: dict[str, Any], kind: str = "") -> None:
    """An HTTP answer (``kind="websocket."``: a WebSocket handshake's denial) with a JSON ``body``."""
    data = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="forkyard"'))
    await send({"type": f"{kind}http.response.start", "status": status, "headers": headers})
    await send({"type": f"{kind}http.response.body", "body": data})


__all__ = ["ApiKeyMiddleware", "HiddenKey", "HiddenKeys", "MAX_TOKEN_TTL_S", "OPEN_PATHS", "TOKEN_PATH",
           "TOKEN_TTL_S", "open_token", "seal_token", "token_request"]
