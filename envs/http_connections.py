"""The HTTP connections of forkyard's env clients: one ``httpx.HTTPTransport`` per server, shared by threads.

:class:`HttpConnections` sends a request's JSON bytes (the callers encode them with orjson) and hands back the
status, the answer's bytes and its ``Retry-After``; it decodes nothing (``envs.session_client`` and
``envs.remote_vector`` do, with :func:`dumps` and :func:`loads`: orjson when installed, else the standard
library's json). Users: ``envs.session_client.HttpTransport`` (``/v1/envs``, and ``/v1/envs/batch/delete`` for
many sessions at once) and ``envs.remote_vector.RemoteVectorEnv`` (the batched routes).

What it keeps of httpx: its transport (``httpx.HTTPTransport``, the public layer under ``httpx.Client``):
keep-alive HTTP/1.1 connections (idle ones kept :data:`~envs.client_retry.KEEPALIVE_EXPIRY_S`, under the server's
keep-alive timeout), connect retries, one timeout for each connect, write and read, and httpx's exceptions. What it
leaves out: ``httpx.Client``, whose every request parses and joins the URL, merges the client's headers, cookies
and timeout, runs the auth and redirect flows and stores the answer's cookies; none of that serves these requests
(fixed headers, no cookies, no redirects, and a client given its own transport, as this one was, reads no proxy
from the environment), and it was 40-50% of httpx's client CPU per request: measured side by side on
2026-12-02 (a loaded 2-core machine), a batched step of 32 sessions cost 750 us of client CPU through
``Client.request``-like calls, 580 us through ``HTTPTransport.handle_request`` (median of 1,500). Here each path's
URL is parsed once and kept (:data:`URL_CACHE` paths), the headers are built once, and a request is an
``httpx.Request`` of those parts. What it adds: the API key's header (:mod:`envs.api_key`), a request sent once
more when its connection closed with no answer and :func:`envs.client_retry.safe_to_repeat` allows it (never a
step, a create or a fork, which may have run), and :class:`~envs.core.EnvInfraError` for every network failure,
naming the server by its URL without user info: a key in the URL's user info is taken out
(:func:`envs.api_key.split_credentials`) and sent as a header, and every message goes through
:func:`envs.api_key.redact`, so the key never shows whatever characters it holds (field case S60).
The transport is per process (:class:`envs.process_local.PerProcess`, field case S59): used in a fork child, it
opens connections of the child's own and leaves the parent's untouched.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from envs.api_key import auth_headers, redact, split_credentials
from envs.client_retry import KEEPALIVE_EXPIRY_S, safe_to_repeat
from envs.core import EnvInfraError
from envs.process_local import PerProcess
from envs.session_lease import Leases, lease_headers

try:  # a faster codec when the server extras are installed; plain JSON either way
    import orjson

    dumps, loads = orjson.dumps, orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    def dumps(obj: Any) -> bytes:
        """``obj`` as UTF-8 JSON bytes."""
        return json.dumps(obj, ensure_ascii=False).encode("utf-8")

    loads = json.loads

#: httpx's errors after which a request may have reached the server with no answer coming back.
_NO_ANSWER = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


#: Most items one batched request carries: the server's ``MAX_BATCH_ITEMS`` (``sandbox_server.models``; a test
#: checks that the two agree). Larger batches are split.
BATCH_ITEMS = 128
#: Most request URLs kept parsed (one per path: a single-session route names its session, so one per session and
#: route); the cache is emptied when full.
URL_CACHE = 4096


class HttpConnections:
    """Keep-alive HTTP/1.1 connections to one server: one ``httpx.HTTPTransport`` (thread-safe), so threads and the
    sessions forked from one another share them.

    Args:
        url: ``http://host[:port][/prefix]`` (or https); a key in the URL's user info
            (``http://forkyard:KEY@host``, percent-encoded where it holds reserved characters) is sent as
            ``Authorization: Bearer`` when ``api_key`` is None; the URL is kept without it.
        timeout_s: seconds for a connect, for sending a request and for each read of an answer.
        retries: retries of a failed connect (httpx tries again at once, then 0.5 s, 1 s, ... apart); a request that
            was sent is repeated only per :meth:`request`.
        api_key: sent as ``Authorization: Bearer`` (the URL's user info is then dropped).

    Raises:
        ValueError: a URL that is not http(s)://host, or whose user info
            :func:`envs.api_key.split_credentials` refuses (the message shows no credential).
    """

    def __init__(self, url: str, timeout_s: float, retries: int = 3, api_key: str | None = None):
        url, in_url = split_credentials(url)
        api_key = in_url if api_key is None else api_key  # the explicit key wins
        self._secrets = (api_key, in_url)
        try:
            base = httpx.URL(url)
        except httpx.InvalidURL:
            base = None
        if base is None or base.scheme not in ("http", "https") or not base.host:
            raise ValueError(redact(f"server_url must be http://host[:port] or https://..., got {url!r}",
                                    self._secrets))
        self.url, self.timeout_s, self.retries = url, timeout_s, retries
        headers = {"Content-Type": "application/json", "Accept": "application/json", **auth_headers(api_key),
                   **lease_headers()}
        # Every request's headers, built once (httpx.Request adds Host and Content-Length), and its timeouts.
        self._headers = httpx.Headers(headers)
        self._extensions = {"timeout": httpx.Timeout(timeout_s).as_dict()}
        self._prefix = url.rstrip("/")
        self._urls: dict[str, httpx.URL] = {}
        self.leases = Leases(self)  # the sessions made through these connections, renewed while we live (S51)
        limits = httpx.Limits(max_keepalive_connections=32, max_connections=64, keepalive_expiry=KEEPALIVE_EXPIRY_S)
        self._transports = PerProcess(lambda: httpx.HTTPTransport(retries=retries, limits=limits))
        self.closed = False

    def _url(self, path: str) -> httpx.URL:
        """``path`` under the base URL, parsed once (:data:`URL_CACHE`)."""
        url = self._urls.get(path)
        if url is None:
            if len(self._urls) >= URL_CACHE:
                self._urls.clear()
            url = self._urls[path] = httpx.URL(self._prefix + path)
        return url

    @property
    def transport(self) -> httpx.HTTPTransport:
        """This process's ``httpx.HTTPTransport`` (a fork child opens its own on first use: field case S59)."""
        return self._transports.get()

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` was called (httpx's name)."""
        return self.closed

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, str | None]:
        """Send one request to ``path`` (under the URL's prefix; ``body``: JSON bytes): the HTTP status, the
        answer's body and its ``Retry-After`` header (None when absent). A request whose connection closed with
        no answer is sent once more, on a new connection, when :func:`~envs.client_retry.safe_to_repeat` allows.

        Raises:
            EnvInfraError: after :meth:`close`, a connect that failed every retry, a timeout, a lost answer.
        """
        if self.closed:
            raise EnvInfraError("the connection to the server was closed (close() was called)")
        repeated = False
        while True:
            try:  # a request of parts made once, to httpx's transport (module docstring)
                resp = self.transport.handle_request(httpx.Request(method, self._url(path), headers=self._headers,
                                                                   content=body, extensions=self._extensions))
                try:
                    data = resp.read()
                finally:
                    resp.close()
            except httpx.HTTPError as exc:
                if isinstance(exc, _NO_ANSWER):
                    if not repeated and safe_to_repeat(method, path):
                        repeated = True  # the server closed an idle connection under it: once more, on a new one
                        continue
                    raise EnvInfraError(redact(f"{method} {self.url}{path}: the server disconnected with no answer "
                                               f"(it may have run): {exc!r}", self._secrets)) from exc
                raise EnvInfraError(redact(f"{method} {self.url}{path} failed: {exc!r}", self._secrets)) from exc
            except RuntimeError as exc:  # httpx: closed by another thread meanwhile
                raise EnvInfraError(redact(f"{method} {self.url}{path}: {exc}", self._secrets)) from exc
            return resp.status_code, data, resp.headers.get("Retry-After")

    def post(self, path: str, body: bytes) -> tuple[int, bytes, str | None]:
        """``request("POST", path, body)``."""
        return self.request("POST", path, body)

    def close(self) -> None:
        """Close every connection of this process (in a fork child, the parent's are left untouched); later
        requests raise EnvInfraError."""
        self.closed = True
        transport = self._transports.owned()
        if transport is not None:
            transport.close()


__all__ = ["BATCH_ITEMS", "URL_CACHE", "HttpConnections", "dumps", "loads"]
