"""What a web page may not do to a forkyard server: the ``Host`` and ``Origin`` checks (field cases S46, S47).

A server on loopback without an API key is the documented default, and a browser is a client on that loopback:
any page its user visits can send requests to ``127.0.0.1``. Two doors stay shut to it.

* **Origin** (cross-site requests, every WebSocket): browsers apply no same-origin policy to WebSockets and send
  simple cross-site POSTs, but they always send ``Origin`` with a handshake and with a cross-site request. A
  request whose ``Origin`` is not the server's own (the ``Host`` it was sent to), not a loopback origin
  (``http://localhost:3000``, ``http://127.0.0.1:8080``, ``http://[::1]``, ``*.localhost``) and not one the
  operator allows (``FORKYARD_ALLOWED_ORIGINS``) is refused; ``Origin: null`` (sandboxed frames, ``file:`` pages)
  too. Clients that send no ``Origin`` (forkyard's, OpenEnv's, curl, ``websockets``) are served.
* **Host** (DNS rebinding): a page on ``attacker.example`` that rebinds its name to ``127.0.0.1`` reaches the
  server with ``Host: attacker.example:PORT`` and reads the answers (same origin, for the browser). A request
  that arrived on a loopback address (the socket's own address, ASGI ``scope["server"]``, whatever the server
  was bound to) is served only for a loopback host name (``localhost``, ``*.localhost``, a loopback IP) or a
  name the operator lists (``FORKYARD_ALLOWED_HOSTS``). A request that arrived on another address follows the
  operator's list when one is set, and is not checked otherwise (the port is reachable without a browser's
  help; set ``FORKYARD_API_KEY``). Behind a reverse proxy on the same machine, list the public names.

Both lists are comma-separated; an item ``*`` allows any, ``*.example.com`` any subdomain of ``example.com``
(hosts only). A refusal is HTTP 403 ``{"detail": ..., "status": "forbidden"}`` on every route and transport, a
WebSocket handshake included (uvicorn's denial response; close code 1008 without that extension), before any
key check, body read or route. The settings are :attr:`~sandbox_server.settings.ServerSettings.allowed_hosts` and
:attr:`~sandbox_server.settings.ServerSettings.allowed_origins`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header value (``name``, ``name:port``, ``[v6]``, ``[v6]:port``), the name
    lower-cased without brackets or a trailing dot; None if the value is malformed."""
    try:
        parts = urlsplit("//" + value.strip())
        name, port = parts.hostname, parts.port
    except ValueError:  # a port out of range or not a number, a bracket left open
        return None
    if not name or any(c in value for c in "/?#@ \\"):
        return None
    return name.rstrip("."), port


def is_loopback_name(name: str) -> bool:
    """Whether a host name always means this machine: ``localhost``, a name under ``.localhost`` (RFC 6761
    reserves it; browsers resolve it to loopback themselves) or a loopback IP address."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _arrived_on_loopback(scope: Scope) -> bool:
    """Whether the connection's local address (``scope["server"]``) is a loopback IP address."""
    server = scope.get("server")
    if not server or server[1] is None:  # a unix socket, or an app called without a server (tests' transports)
        return False
    try:
        return ipaddress.ip_address(str(server[0]).partition("%")[0]).is_loopback
    except ValueError:
        return False


def _listed(name: str, patterns: Iterable[str]) -> bool:
    for pattern in patterns:
        if pattern == "*" or pattern == name or (pattern.startswith("*.") and name.endswith(pattern[1:])):
            return True
    return False


def _origin_key(origin: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an ``Origin`` value, default ports filled in; None if it is not one."""
    try:
        parts = urlsplit(origin.strip())
        scheme, name, port = parts.scheme.lower(), parts.hostname, parts.port
    except ValueError:
        return None
    if scheme not in _DEFAULT_PORTS or not name or parts.path not in ("", "/") or parts.query or parts.username:
        return None
    return scheme, name.rstrip("."), port if port is not None else _DEFAULT_PORTS[scheme]


class WebGuard:
    """The Host and Origin policy of one server (module docstring).

    Args:
        allowed_hosts: host names (``*``, ``*.example.com`` patterns) served besides loopback names; on a
            connection that did not arrive on loopback, a non-empty list is the whole rule.
        allowed_origins: origins (``https://app.example.com:8443``, or ``*``) allowed besides the server's own and
            loopback ones.

    Raises:
        ValueError: an item of ``allowed_origins`` that is not an origin (``scheme://host[:port]``).
    """

    def __init__(self, allowed_hosts: Iterable[str] = (), allowed_origins: Iterable[str] = ()):
        self.allowed_hosts = tuple(h.strip().lower().rstrip(".") for h in allowed_hosts if h.strip())
        origins = [o.strip() for o in allowed_origins if o.strip()]
        self.any_origin = "*" in origins
        keys = {o: _origin_key(o) for o in origins if o != "*"}
        bad = [o for o, k in keys.items() if k is None]
        if bad:
            raise ValueError(f"not origins (scheme://host[:port]): {bad}")
        self.allowed_origins = frozenset(k for k in keys.values() if k is not None)

    def refusal(self, scope: Scope) -> str | None:
        """Why the request of ``scope`` (HTTP or WebSocket) is refused, or None if it may go on."""
        headers = {k: v for k, v in scope.get("headers", ()) if k in (b"host", b"origin")}
        host_value = headers.get(b"host", b"").decode("latin-1")
        host = split_host(host_value) if host_value else None
        if host_value and host is None:
            return "the Host header is malformed"
        if host is not None:
            name = host[0]
            if _arrived_on_loopback(scope):
                if not (is_loopback_name(name) or _listed(name, self.allowed_hosts)):
                    return (f"host {name!r} is not served: this request came through a loopback address, where only "
                            "loopback names (localhost, 127.0.0.1, [::1]) and the names in FORKYARD_ALLOWED_HOSTS are "
                            "served (a guard against DNS rebinding)")
            elif self.allowed_hosts and not _listed(name, self.allowed_hosts):
                return f"host {name!r} is not in FORKYARD_ALLOWED_HOSTS"
        if b"origin" not in headers:
            return None
        return self._origin_refusal(headers[b"origin"].decode("latin-1"), host, scope)

    def _origin_refusal(self, origin: str, host: tuple[str, int | None] | None, scope: Scope) -> str | None:
        key = _origin_key(origin)
        if key is not None:
            if self.any_origin or key in self.allowed_origins or is_loopback_name(key[1]):
                return None
            if host is not None and key[1] == host[0]:
                secure = scope.get("scheme") in ("https", "wss")
                port = host[1] if host[1] is not None else (443 if secure else 80)
                if key[2] == port:
                    return None  # the server's own origin (a page it served, the API docs)
        shown = origin if len(origin) <= 100 else origin[:100] + "..."
        return (f"origin {shown!r} may not use this server: only its own origin, loopback origins and those in "
                "FORKYARD_ALLOWED_ORIGINS may (a guard against web pages driving it); clients that send no Origin "
                "are served")


class WebGuardMiddleware:
    """Refuse (403 ``forbidden``) every HTTP request and WebSocket handshake a :class:`WebGuard` refuses, before
    anything else runs. Pure ASGI; other scope types pass through.

    Args:
        app: the ASGI app to guard.
        guard: the policy.
    """

    def __init__(self, app: ASGIApp, guard: WebGuard):
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        why = self.guard.refusal(scope) if scope["type"] in ("http", "websocket") else None
        if why is None:
            await self.app(scope, receive, send)
            return
        body = orjson.dumps({"detail": why, "status": "forbidden"})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 403, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": 403, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": "forbidden"})


__all__ = ["WebGuard", "WebGuardMiddleware", "is_loopback_name", "split_host"]
