"""The HTTP contract shared by the sandbox routes and the env routes: one error shape, one mapping
from domain errors to HTTP answers, the OpenAPI documentation of error answers, and two pure-ASGI
middlewares (a request-body limit applied before a body is read into memory, and a last-resort
handler that answers unexpected exceptions with the same error shape and keeps the connection).

Every error answer is ``application/json`` :class:`~sandbox_server.models.ErrorBody`
``{"detail": str, "status": str}``, FastAPI's own request-validation errors and malformed JSON included
(both 422). :data:`DOMAIN_ERRORS` is the one table from exception classes to statuses; the most
specific class of an exception wins.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

import gymnasium as gym
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import envs.errors
from sandbox_server.errors import (
    LimitExceeded, SandboxError, SandboxNotFound, ServiceUnavailable, SnapshotUnsupported, ToolRefused, WorkAbandoned,
)
from sandbox_server.models import ErrorBody

log = logging.getLogger("forkyard.http")

#: The ``status`` word of an error answer without a more specific one, by HTTP status.
STATUS_WORDS = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 409: "conflict", 413: "too_large",
                422: "invalid", 500: "internal", 503: "unavailable"}

#: Domain errors -> (HTTP status, status word). Looked up along the exception's MRO, so a subclass
#: listed here (LimitExceeded under ToolRefused, PoolExhausted under ServiceUnavailable) wins.
DOMAIN_ERRORS: dict[type[Exception], tuple[int, str]] = {
    LimitExceeded: (413, "too_large"),            # a documented limit (files per write, bytes of /scratch): no retry
    ToolRefused: (422, "refused"),                # nothing was executed
    SnapshotUnsupported: (422, "refused"),        # the writable areas hold what a snapshot cannot carry (a FIFO)
    SandboxNotFound: (404, "not_found"),
    WorkAbandoned: (503, "abandoned"),            # given up after it may have started: it may have run
    ServiceUnavailable: (503, "unavailable"),     # engine down, pool exhausted, env-session cap: nothing ran
    SandboxError: (503, "sandbox_error"),         # a sandbox failed (it is replaced): retry
    **envs.errors.WIRE,                           # env sessions' errors, declared with the words clients read back
    gym.error.ResetNeeded: (409, "conflict"),     # a step before the first reset
    ValueError: (422, "invalid"),                 # a value the service refused
}

_DESCRIPTIONS = {
    404: "Unknown id: never created, deleted, or expired after its idle TTL.",
    409: "The episode has ended: reset the session (or fork before the end); or (status held) an OpenEnv "
         "connection holds the session and only it may act on it.",
    413: "Too large: the request body is over this route's limit (refused before it is read), or the "
         "request would take a bounded resource past its limit (the detail names it).",
    422: "Invalid request: malformed JSON, a value of the wrong type or out of range, an unknown field, "
         "or a call the server refuses. Nothing was executed; the detail names the problem.",
    500: "An unexpected server error (a bug): the server logged it. Nothing the client sends causes one.",
    503: "Temporarily unavailable (engine down, pool or session cap exhausted, a sandbox or env failed): "
         "retry after the Retry-After seconds. Nothing was kept from the failed request.",
}


def _clean(text: str) -> str:
    """``text`` with lone surrogates escaped, so it always encodes as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(
    status: int, detail: str, word: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    """An :class:`ErrorBody` answer (``status`` 400 is answered 422: the one status for bad requests)."""
    if status == 400:
        status = 422
    body = {"detail": _clean(str(detail)), "status": word or STATUS_WORDS.get(status, "error")}
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")


def route_path(scope: Any) -> str:
    """The request's path inside this app: ``scope["path"]`` without the ``root_path`` of a mount (Starlette
    keeps the mount's prefix in ``path``), so path rules hold whether the app is served or mounted (field case
    S49)."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root):] or "/" if root and path.startswith(root) else path


def retry_after(seconds: float) -> dict[str, str]:
    """The ``Retry-After`` header for a delay in seconds (a whole number, at least 1)."""
    return {"Retry-After": str(max(1, math.ceil(seconds if math.isfinite(seconds) else 1)))}


def classify(exc: BaseException) -> tuple[int, str] | None:
    """``(status, word)`` of a domain error from :data:`DOMAIN_ERRORS`, or None if it is not one."""
    for cls in type(exc).__mro__:
        if cls in DOMAIN_ERRORS:
            return DOMAIN_ERRORS[cls]
    return None


def domain_response(exc: BaseException) -> Response:
    """The answer to a domain error (503s carry ``Retry-After``)."""
    status, word = classify(exc) or (500, "internal")
    headers = None
    if status == 503:
        headers = retry_after(exc.retry_after_s if isinstance(exc, ServiceUnavailable) else 1.0)
    return error_response(status, str(exc) or type(exc).__name__, word, headers)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` documenting ``codes`` (and 500) with :class:`ErrorBody`."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in sorted({*codes, 500}):
        doc: dict[str, Any] = {"model": ErrorBody, "description": _DESCRIPTIONS[code]}
        if code == 503:
            doc["headers"] = {"Retry-After": {"description": "seconds to wait before retrying", "required": True,
                                              "schema": {"type": "integer", "minimum": 1}}}
        out[code] = doc
    return out


def _validation_detail(errors: list[dict[str, Any]]) -> str:
    parts = []
    for e in errors[:10]:
        loc = ".".join(str(x) for x in e.get("loc", ()))
        msg = str(e.get("msg", "invalid value"))
        ctx_error = (e.get("ctx") or {}).get("error")
        if e.get("type") == "json_invalid" and ctx_error:
            msg = f"malformed JSON: {ctx_error}"
        parts.append(f"{loc}: {msg}" if loc else msg)
    if len(errors) > 10:
        parts.append(f"and {len(errors) - 10} more")
    return "; ".join(parts) or "invalid request"


OnError = Callable[[Request, BaseException, int], None]

# Request-body limits, in bytes. The limit of the routes that carry files (sandbox creation, file writes) is
# ``ServerSettings.max_body_bytes`` (``FORKYARD_MAX_BODY_BYTES``; default
# :func:`sandbox_server.settings.default_max_body_bytes`); every other route has a smaller one of these.

#: The smallest per-route body limit: bodies up to this many bytes are never refused for their size.
MIN_ROUTE_LIMIT = 1024
#: Sandbox routes that carry no files (exec, state, snapshot, clone, fork): room for metadata at its bound
#: (:data:`~sandbox_server.models.MAX_METADATA_BYTES`, escaped as JSON) and tool arguments.
SMALL_BODY_BYTES = 512 << 10
#: Env routes other than step (kwargs, options, fork counts); a step's limit follows the env's action length.
ENV_BODY_BYTES = 64 << 10
#: The most any batched env route (``/v1/envs/batch/...``) takes, whatever its items: each route's limit is
#: its single route's per item times ``MAX_BATCH_ITEMS``, capped here (``sandbox_server.routes.envs.batch_body_limit``).
#: The server's own ``max_body_bytes`` still caps every route (a server of env sessions alone defaults to this cap).
ENV_BATCH_BODY_BYTES = 4 << 20

#: ``path -> (limit, hint) | None``: a route's own body limit and words for the 413 saying why.
RouteLimit = Callable[[str], tuple[int, str] | None]


def install(app: FastAPI, *, max_body_bytes: int, route_limit: RouteLimit | None = None,
            on_error: OnError | None = None) -> None:
    """Give ``app`` the contract: the error handlers, the body limit and the last-resort handler.

    Args:
        max_body_bytes: the most bytes a request body may have.
        route_limit: ``path -> (limit, hint) | None``: a smaller limit for some routes (and words for
            the 413 detail saying why).
        on_error: called with (request, exception, status) for every domain error answered (metrics).
    """

    async def domain(request: Request, exc: Exception) -> Response:
        resp = domain_response(exc)
        if on_error is not None:
            on_error(request, exc, resp.status_code)
        return resp

    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not read the body
            detail = f"the request body could not be parsed: {type(exc.__cause__).__name__}: {exc.__cause__}"
        return error_response(exc.status_code, detail, headers=dict(exc.headers or {}) or None)

    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return error_response(422, _validation_detail(list(exc.errors())), "invalid")

    for cls in DOMAIN_ERRORS:
        app.add_exception_handler(cls, domain)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_middleware(CatchAll)  # inside BodyLimit (add_middleware puts the last one outermost)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes, route_limit=route_limit)
    build_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _tidy_openapi(build_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}


def _tidy_openapi(spec: dict[str, Any]) -> dict[str, Any]:
    """Make the generated schema say what the server does: FastAPI documents a list-shaped 422
    (``HTTPValidationError``) on every route with parameters, even where none can fail (a string path
    parameter); routes that can answer 422 document it themselves with :class:`ErrorBody`. And an error
    answer is always JSON, even on a route whose success is text (``/metrics``)."""
    for ops in spec.get("paths", {}).values():
        for op in ops.values():
            responses = op.get("responses", {})
            for code, resp in list(responses.items()):
                content = resp.get("content", {})
                if "HTTPValidationError" in str(content):
                    del responses[code]
                elif code[:1] in "45" and content and "application/json" not in content:
                    resp["content"] = {"application/json": {"schema": dict(_ERROR_REF)}}
    used = orjson.dumps(spec.get("paths", {})).decode()
    schemas = spec.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        if f"/{name}\"" not in used:
            schemas.pop(name, None)
    return spec


class BodyLimit:
    """Pure-ASGI middleware: refuse request bodies over a limit before they are read into memory.

    A declared ``Content-Length`` over the limit is answered 413 at once, without reading the body (one
    within it passes straight on: the HTTP server delivers no more than it declares). A streamed
    (chunked) body is read here until it ends, or until it passes the limit and is answered 413; at
    most the limit is ever buffered. A 413 closes the connection (the rest of the body is never read).

    Args:
        max_body_bytes: the limit of every route.
        route_limit: ``path -> (limit, hint) | None``: a smaller limit for some routes, never below
            :data:`MIN_ROUTE_LIMIT` (declared bodies up to that size pass without looking it up).
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, route_limit: RouteLimit | None = None):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.route_limit = route_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    pass
                break
        if declared is not None and declared <= MIN_ROUTE_LIMIT and declared <= self.max_body_bytes:
            await self.app(scope, receive, send)  # the hot path: a small body no route refuses
            return
        limit, hint = self.max_body_bytes, ""
        if self.route_limit is not None:
            special = self.route_limit(route_path(scope))
            if special is not None and special[0] < limit:
                limit, hint = max(special[0], MIN_ROUTE_LIMIT), special[1]
        if declared is not None:
            if declared > limit:
                await self._refuse(scope, receive, send, f"the request body has {declared} bytes", limit, hint)
            else:
                await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body arrived
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > limit:
                await self._refuse(scope, receive, send, f"the request body has more than {limit} bytes", limit, hint)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        pending: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        del chunks

        async def replay() -> Message:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, what: str, limit: int, hint: str) -> None:
        detail = f"{what}; this route accepts at most {limit} bytes" + (f" ({hint})" if hint else "")
        await error_response(413, detail, "too_large", {"Connection": "close"})(scope, receive, send)


class CatchAll:
    """Pure-ASGI middleware: answer an exception nothing else handled with a 500 :class:`ErrorBody`
    (logged with its traceback), instead of letting it reach the server, which would drop the
    keep-alive connection. (If the response had already started, the exception goes on.)"""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - the last resort, by design
            if scope["type"] != "http":
                raise
            log.exception("unexpected error answering %s %s", scope.get("method"), scope.get("path"))
            try:
                await error_response(500, f"internal error ({type(exc).__name__}); the server logged it",
                                     "internal")(scope, receive, send)
            except Exception:  # the response had started: the server has to drop the connection
                raise exc from None


__all__ = ["DOMAIN_ERRORS", "ENV_BATCH_BODY_BYTES", "ENV_BODY_BYTES", "MIN_ROUTE_LIMIT", "SMALL_BODY_BYTES",
           "STATUS_WORDS", "BodyLimit", "CatchAll", "RouteLimit", "classify", "domain_response", "error_response",
           "error_responses", "install", "retry_after"]
