"""The HTTP API (FastAPI, versioned under ``/v1``): the sandbox routes over a :class:`SandboxService` and the
env sessions under ``/v1/envs``. This module only builds the app (lifespan, HTTP contract, routers); the
routes are :mod:`sandbox_server.routes`, their dependencies :mod:`sandbox_server.deps`, and the server
command :mod:`sandbox_server.__main__` (``python -m sandbox_server``).

Status codes (every error answer is ``application/json`` ``ErrorBody {"detail": str, "status": str}``,
FastAPI's own validation errors included; each route documents the ones it can return):

* 200 / 201 / 204 success (201: something was created).
* 401 ``unauthorized``: the server requires an API key (``FORKYARD_API_KEY``) and the request did not carry
  it (:mod:`sandbox_server.auth`); every route and transport but ``/healthz``.
* 404 ``not_found``: unknown sandbox, snapshot, env id or env session (deleted, expired, or never made).
* 409 ``conflict``: a step on an env episode that has ended.
* 413 ``too_large``: a request body over the limit, refused from its declared length before it is read
  (a streamed body after at most the limit): ``max_body_bytes`` for the routes that carry files (sized for
  the largest file upload, :data:`~sandbox_server.settings.MAX_WRITE_BYTES` in base64), smaller ones for
  the others (:mod:`sandbox_server.http_contract`); or a bounded resource that the request would overflow
  (``LimitExceeded``).
* 422 ``invalid`` / ``refused``: malformed JSON, a value of the wrong type (strict: ``true`` is not an
  integer, ``2.0`` is not one either), out of range, an unknown field, or a tool call / kwarg the server
  refuses. Nothing ran.
* 503 with ``Retry-After``: ``unavailable`` (nothing ran: the engine is down, the pool or the env-session
  cap is exhausted, or the server is shutting down and refused it), ``sandbox_error`` / ``infra_error``
  (a sandbox or an env failed), ``abandoned`` (work that may have started was given up: past its
  deadline, or cut by a stop, :class:`Drain`, within :data:`DRAIN_GRACE_S`; clients never send it again
  by themselves). A failed request keeps nothing: work abandoned after an error answer (a
  deadline, a client that hung up, a shutdown) releases what it took.
* 500 ``internal``: only for a bug (logged); the keep-alive connection stays usable.

The mapping from domain errors to these answers is :data:`sandbox_server.http_contract.DOMAIN_ERRORS`.
Blocking work (engine calls, agent round trips) runs in worker threads, never on the event loop, under a
server-side deadline (:mod:`sandbox_server.work`). ``/metrics`` is Prometheus text, not JSON.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any

import anyio
import uvicorn
from fastapi import FastAPI, Request

from envs.api_key import api_keys as resolve_api_keys
from sandbox_server import http_contract
from sandbox_server.auth import ApiKeyMiddleware, HiddenKeys
from sandbox_server.backends import Backend, make_backend
from sandbox_server.env_sessions import EnvSessions, import_env_modules, reaper
from sandbox_server.errors import ServiceUnavailable
from sandbox_server.http_contract import ENV_BATCH_BODY_BYTES, ENV_BODY_BYTES, SMALL_BODY_BYTES
from sandbox_server.http_pipelining import HTTP_PROTOCOL
from sandbox_server.routes import envs as env_routes
from sandbox_server.routes import health, openenv, snapshots, tools
from sandbox_server.routes import sandboxes as sandbox_routes
from sandbox_server.service import SandboxService
from sandbox_server.session_host import SessionHost
from sandbox_server.settings import ServerSettings, ServiceConfig
from sandbox_server.session_lease import LeaseMiddleware
from sandbox_server.snapshot_tokens import SnapshotSealer
from sandbox_server.web_guard import WebGuard, WebGuardMiddleware

_DESCRIPTION = ("A pool of snapshot-cloneable sandboxes with a read-only tool whitelist and per-turn timeouts, and "
                "env sessions (/v1/envs) for every registered forkyard env. Every error answer is an ErrorBody "
                "{detail, status}; 503s carry Retry-After. See docs/sandbox.md.")
_ENV_DESCRIPTION = ("Env sessions (/v1/envs) for every registered forkyard env. Every error answer is an ErrorBody "
                    "{detail, status}.")

#: Seconds a request in flight when the server starts to drain (SIGTERM) may take to finish on its own; then
#: it is answered 503 and its work abandoned, which releases what it took (field case S39).
DRAIN_GRACE_S = 2.0
#: Seconds uvicorn waits for connections after the drain has cut every request before it cuts them itself
#: (a request that ignores cancellation): the last bound before the lifespan's clean-up.
DRAIN_BACKSTOP_S = 1.0


class Drain:
    """The bounded drain of one app (field case S39). :meth:`start` (called on the server's event loop when a
    stop is asked for) answers every new HTTP request 503 at once and gives the requests in flight
    ``grace_s`` seconds to finish; the rest are cancelled and answered 503 with ``Retry-After`` (their
    work is abandoned the usual way: what it took is released). The app's lifespan then destroys every
    sandbox. Applied by :class:`DrainMiddleware`; :class:`DrainingServer` starts it.

    Args:
        grace_s: seconds a request in flight may still take, after :meth:`start`.
    """

    def __init__(self, grace_s: float = DRAIN_GRACE_S):
        self.grace_s = grace_s
        self.draining = False
        self._inflight: set[asyncio.Task] = set()
        self._cut: set[asyncio.Task] = set()

    def start(self) -> None:
        """Begin draining (idempotent; on the event loop that serves the app)."""
        if not self.draining:
            self.draining = True
            asyncio.get_running_loop().call_later(self.grace_s, self._cut_all)

    def _cut_all(self) -> None:
        for task in list(self._inflight):
            self._cut.add(task)
            task.cancel("the server is shutting down")

    @staticmethod
    def answer(cut: bool = False) -> Any:
        """The 503 of a request the drain refused (``unavailable``: it did not run) or cut while it ran
        (``abandoned``: it may have run, so clients do not send it again by themselves)."""
        if cut:
            return http_contract.error_response(503, "the server is shutting down and cut this request while it ran; "
                                                     "it may have run", "abandoned",
                                                {**http_contract.retry_after(5.0), "Connection": "close"})
        return http_contract.error_response(503, "the server is shutting down; retry on another replica or once it "
                                                 "is back", "unavailable",
                                            {**http_contract.retry_after(5.0), "Connection": "close"})


class DrainMiddleware:
    """Pure-ASGI middleware applying a :class:`Drain` to every HTTP request (websockets are closed by uvicorn)."""

    def __init__(self, app: Any, drain: Drain):
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        drain = self.drain
        if drain.draining:
            return await drain.answer()(scope, receive, send)
        task = asyncio.current_task()
        assert task is not None  # an ASGI call always runs in a task
        started = False

        async def tracked(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        drain._inflight.add(task)
        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if task not in drain._cut:
                raise
            task.uncancel()  # cut by the drain, which answers it
            if not started:
                await drain.answer(cut=True)(scope, receive, send)
        finally:
            drain._inflight.discard(task)
            drain._cut.discard(task)


#: What a request to an app whose lifespan never ran is told (field case S49).
NOT_STARTED = ("this forkyard app was not started: its lifespan (the sandbox pool, the reaper of idle sessions, the "
               "clean-up at shutdown) never ran, as happens when it is mounted inside another app. Run it inside "
               "the parent's lifespan: `async with fy.router.lifespan_context(fy): yield` in the parent's "
               "`lifespan`, or serve it on its own (`python -m sandbox_server`)")


class StartedCheck:
    """Pure-ASGI middleware: while the app's lifespan has not started (or has ended), every HTTP request and
    WebSocket handshake is answered 500 ``not_started`` with :data:`NOT_STARTED` instead of reaching a
    half-made server (field case S49). The lifespan sets ``state.started``."""

    def __init__(self, app: Any, state: Any):
        self.app = app
        self.state = state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or self.state.started:
            return await self.app(scope, receive, send)
        if not self.state.not_started_logged:
            self.state.not_started_logged = True
            http_contract.log.error("%s", NOT_STARTED)
        if scope["type"] == "http":
            return await http_contract.error_response(500, NOT_STARTED, "not_started")(scope, receive, send)
        body = http_contract.error_response(500, NOT_STARTED, "not_started")
        await receive()  # websocket.connect
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": 500, "headers": body.raw_headers})
            await send({"type": "websocket.http.response.body", "body": body.body})
        else:
            await send({"type": "websocket.close", "code": 1011, "reason": "not started"})


class DrainingServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose stop (SIGTERM, SIGINT) first starts the app's :class:`Drain`, and which
    cuts what is still open :data:`DRAIN_BACKSTOP_S` after the drain's grace: the whole stop is bounded by
    ``grace_s`` + :data:`DRAIN_BACKSTOP_S` + the lifespan's clean-up (the sandboxes destroyed).

    Args:
        app: an app made by :func:`create_app`; ``**config``: ``uvicorn.Config`` keywords.
    """

    def __init__(self, app: FastAPI, **config: Any):
        self.drain: Drain = app.state.drain
        config.setdefault("timeout_graceful_shutdown", self.drain.grace_s + DRAIN_BACKSTOP_S)
        config.setdefault("http", HTTP_PROTOCOL)  # pipelined requests take turns with other connections (S56)
        super().__init__(uvicorn.Config(app, **config))

    async def shutdown(self, sockets: Any = None) -> None:
        self.drain.start()
        await super().shutdown(sockets)


def create_app(backend: Backend | str | None = None, config: ServiceConfig | None = None, *,
               service: SandboxService | None = None, warm: bool = True, max_body_bytes: int | None = None,
               sandboxes: bool = True, sandbox_provider: Any = None, api_key: str | None = None,
               settings: ServerSettings | None = None) -> FastAPI:
    """Build the FastAPI app. The service starts (orphan clean-up, pool warm-up) in the lifespan.

    Args:
        backend: a backend instance, or a registered backend name (:data:`sandbox_server.backends.BACKENDS`),
            built with :func:`~sandbox_server.backends.make_backend` when the app starts, with ``settings``
            (their ``server_name``, ``sandbox_image`` and ``corpus``; default name: ``settings.backend``).
        config: service limits, env-session TTL and cap (default: :meth:`ServiceConfig.from_env`, read now).
        service: use this already-built service instead (its config then applies; the app closes it at
            shutdown). Not together with ``backend`` or ``config``.
        warm: wait at start-up until ``min_idle`` sandboxes are idle.
        max_body_bytes: request-body limit in bytes of the routes that carry files (default
            ``ServerSettings().max_body_bytes``; with ``sandboxes=False``,
            :data:`~sandbox_server.http_contract.ENV_BATCH_BODY_BYTES`, the batched env routes' cap); other
            routes have smaller ones.
        settings: how the server runs (body limit, env modules, snapshot key, allowed hosts and origins, and the
            backend built from a name: its name, server name, image, corpus); default
            :class:`~sandbox_server.settings.ServerSettings` read from ``FORKYARD_*`` now, once: nothing the app
            or its backend does later reads a ``FORKYARD_*`` variable again.
        sandboxes: False: a server of env sessions alone (``python -m sandbox_server --no-sandboxes``): no
            sandbox service, no sandbox routes; sandbox-backed envs (FileQA) are refused with a 422 unless
            ``sandbox_provider`` is given.
        sandbox_provider: with ``sandboxes=False``, a started sandbox service (or client) the env sessions of
            sandbox-backed envs take their sandboxes from; the caller keeps it (it is not closed here).
        api_key: the key every route and transport but ``/healthz`` requires (:mod:`sandbox_server.auth`), or
            several, comma-separated, any of which is accepted (``NEW,OLD`` during a rotation); default:
            :func:`envs.api_key.api_keys` (``FORKYARD_API_KEY`` or ``FORKYARD_API_KEY_FILE``, read now), none
            when neither is set: no key required.

    If the backend cannot be built (engine down), the app still starts: ``/healthz`` says degraded and
    sandbox routes (and sandbox-backed env sessions) answer 503. Env sessions of sandbox-backed envs
    (FileQA) take their sandboxes from this app's own service, whatever its backend.

    Raises:
        ValueError: ``service`` together with ``backend`` or ``config``; ``sandboxes=False`` with ``backend``
            or ``service``; ``sandbox_provider`` with ``sandboxes=True``; a limit that is not positive; a key
            :func:`envs.api_key.api_key` refuses; an env module of ``FORKYARD_ENV_MODULES`` that cannot be imported.
    """
    settings = settings if settings is not None else ServerSettings()
    door_keys = resolve_api_keys(api_key)
    if service is not None and (backend is not None or config is not None):
        raise ValueError("pass either service, or backend and config, not both: a service has its own")
    if not sandboxes and (backend is not None or service is not None):
        raise ValueError("sandboxes=False serves env sessions alone: it takes no backend or service")
    if sandboxes and sandbox_provider is not None:
        raise ValueError("sandbox_provider is for sandboxes=False: a full server's env sessions use its own service")
    cfg = service.config if service is not None else (config or ServiceConfig.from_env())
    if max_body_bytes is None:
        max_body_bytes = settings.max_body_bytes if sandboxes else ENV_BATCH_BODY_BYTES
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
    import_env_modules(settings.env_modules)  # the envs the operator named (ValueError if one fails)
    sessions = EnvSessions(ttl_s=cfg.env_ttl_s, max_sessions=cfg.max_env_sessions, sandbox_provider=sandbox_provider)
    key = settings.snapshot_key
    host = SessionHost(sessions, SnapshotSealer(key.get_secret_value() if key is not None else None))
    backend_error: list[str] = []

    def build() -> SandboxService | None:
        if service is not None:
            return service
        b = backend
        if b is None or isinstance(b, str):
            try:
                b = make_backend(b if b is not None else settings.backend, settings=settings)
            except ServiceUnavailable as exc:  # engine down, no isolation: a degraded server that says why
                backend_error.append(str(exc))
                return None
        return SandboxService(b, cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        svc = await anyio.to_thread.run_sync(build) if sandboxes else None
        app.state.service = svc
        app.state.backend_error = backend_error[0] if backend_error else None
        reaper_task = None
        try:  # whatever fails from here on, the service (and every sandbox it started) is closed
            if svc is not None:
                await anyio.to_thread.run_sync(lambda: svc.start(wait=warm))
            if sandboxes:  # sandbox-backed env sessions (FileQA) take their sandboxes from this app's own service
                sessions.sandbox_provider = svc
                sessions.sandbox_unavailable = (
                    None if svc is not None else f"no sandbox backend: {app.state.backend_error}")
            reaper_task = asyncio.create_task(reaper(sessions))
            app.state.started = True
            yield
        finally:
            app.state.started = False
            if reaper_task is not None:
                reaper_task.cancel()
            await anyio.to_thread.run_sync(sessions.close_all)  # first: env sessions give their sandboxes back
            if svc is not None:
                await anyio.to_thread.run_sync(svc.close)

    def count_unavailable(request: Request, exc: BaseException, status: int) -> None:
        svc = getattr(request.app.state, "service", None)
        if svc is not None and status == 503:
            svc.metrics.unavailable.labels(type(exc).__name__).inc()

    def route_limit(path: str) -> tuple[int, str] | None:
        """Env routes: their own limits. Sandbox routes: only creation and file writes carry files; every
        other one's body is refused past :data:`SMALL_BODY_BYTES` before it is read."""
        env_limit = env_routes.body_limit(sessions, path)
        if env_limit is not None:
            return env_limit
        if not sandboxes:  # a server of env sessions alone has no other route that takes a body
            return ENV_BODY_BYTES, "this server serves env sessions only"
        if sandbox_routes.carries_files(path):
            return None
        return SMALL_BODY_BYTES, "this route's body holds no files"

    if sandboxes:
        app = FastAPI(title="forkyard sandbox service", version="1", description=_DESCRIPTION, lifespan=lifespan)
    else:
        app = FastAPI(title="forkyard env sessions", version="1", description=_ENV_DESCRIPTION, lifespan=lifespan)
    app.state.service = None
    app.state.backend_error = None
    app.state.env_sessions = sessions
    app.state.env_host = host
    app.state.openenv_owners = {}  # session id -> the OpenEnv connection responsible for it (routes/openenv.py)
    http_contract.install(app, max_body_bytes=max_body_bytes, route_limit=route_limit,
                          on_error=count_unavailable if sandboxes else None)
    app.add_middleware(LeaseMiddleware)  # Forkyard-Lease-S: the lease of the sessions a request makes (S51)
    app.state.started, app.state.not_started_logged = False, False  # the lifespan sets it (field case S49)
    app.add_middleware(StartedCheck, state=app.state)
    app.state.drain = Drain()  # a stop drains within a bound (DrainingServer starts it; field case S39)
    app.add_middleware(DrainMiddleware, drain=app.state.drain)
    app.state.api_key_required = bool(door_keys)
    if door_keys:  # before any route, body limit or body read
        app.add_middleware(ApiKeyMiddleware, key=HiddenKeys(door_keys))
    # outermost: a web page's request is refused before anything else (field cases S46, S47)
    app.add_middleware(WebGuardMiddleware, guard=WebGuard(settings.allowed_hosts.split(","),
                                                          settings.allowed_origins.split(",")))
    app.include_router(env_routes.router)
    app.include_router(openenv.router)
    if sandboxes:
        for router in (sandbox_routes.router, snapshots.router, tools.router, health.router):
            app.include_router(router)
    else:
        app.include_router(health.env_router)
    return app


def create_env_app(ttl_s: float | None = None, max_sessions: int | None = None, *, sandbox_provider: Any = None,
                   max_body_bytes: int | None = None, api_key: str | None = None) -> FastAPI:
    """A FastAPI app serving only env sessions (enough for ClueProbe): ``create_app(sandboxes=False)``.

    Args:
        ttl_s: seconds an env session may stay idle (default: ``env_ttl_s`` of
            :meth:`ServiceConfig.from_env`, i.e. ``FORKYARD_ENV_TTL_S`` or 600).
        max_sessions: most env sessions at once (default: ``max_env_sessions``, ``FORKYARD_MAX_ENV_SESSIONS``).
        sandbox_provider: a started sandbox service for sandbox-backed envs (FileQA); without one they
            are refused with 422. The caller keeps ownership (it is not closed here).
        max_body_bytes: request-body limit (default :data:`~sandbox_server.http_contract.ENV_BATCH_BODY_BYTES`,
            the batched routes' cap; each single route has its own smaller one;
            a step's limit follows the env's action length).
        api_key: as :func:`create_app`'s (default: ``FORKYARD_API_KEY`` / ``FORKYARD_API_KEY_FILE``).

    Raises:
        pydantic.ValidationError (a ValueError): ``ttl_s`` not positive or ``max_sessions`` below 1.
    """
    config = ServiceConfig.from_env(env_ttl_s=ttl_s, max_env_sessions=max_sessions)
    return create_app(config=config, sandboxes=False, sandbox_provider=sandbox_provider, max_body_bytes=max_body_bytes,
                      api_key=api_key)


__all__ = ["DRAIN_BACKSTOP_S", "DRAIN_GRACE_S", "NOT_STARTED", "Drain", "DrainMiddleware", "DrainingServer",
           "StartedCheck", "create_app", "create_env_app"]
