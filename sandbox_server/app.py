"""The HTTP API (FastAPI, versioned under ``/v1``) over a :class:`SandboxService`, plus the env
sessions of :mod:`sandbox_server.env_api` under ``/v1/envs``.

Status codes (every error answer is ``application/json`` ``ErrorBody {"detail": str, "status": str}``,
FastAPI's own validation errors included; each route documents the ones it can return):

* 200 / 201 / 204 success (201: something was created).
* 404 ``not_found``: unknown sandbox, snapshot, env id or env session (deleted, expired, or never made).
* 409 ``conflict``: a step on an env episode that has ended.
* 413 ``too_large``: a request body over the limit, refused from its declared length before it is read
  (a streamed body after at most the limit): ``max_body_bytes`` for the sandbox routes (sized for the
  largest file upload, :data:`~sandbox_server.service.MAX_WRITE_BYTES` in base64), smaller ones for the
  env routes; or a bounded resource that the request would overflow (``LimitExceeded``).
* 422 ``invalid`` / ``refused``: malformed JSON, a value of the wrong type (strict: ``true`` is not an
  integer, ``2.0`` is not one either), out of range, an unknown field, or a tool call / kwarg the server
  refuses. Nothing ran.
* 503 ``unavailable`` / ``sandbox_error`` / ``infra_error`` with ``Retry-After``: the engine is down, the
  pool or the env-session cap is exhausted, a sandbox or an env failed, or the server gave up on work
  past its deadline. A failed request keeps nothing: work abandoned after an error answer (a deadline,
  or a client that hung up) releases what it took.
* 500 ``internal``: only for a bug (logged); the keep-alive connection stays usable.

The mapping from domain errors to these answers is :data:`sandbox_server.http_contract.DOMAIN_ERRORS`,
shared by both route sets. Blocking work (engine calls, agent round trips) runs in worker threads, never
on the event loop, under a server-side deadline. ``/metrics`` is Prometheus text, not JSON.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import threading
import time
from contextlib import asynccontextmanager
from typing import Any, Callable

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from sandbox_server import env_api, http_contract
from sandbox_server.backends import Backend, make_backend
from sandbox_server.errors import ServiceUnavailable
from sandbox_server.models import (
    CloneRequest, CloneResponse, CreateRequest, ExecRequest, ForkRequest, Health, PoolStatus, SandboxInfo,
    SandboxList, SnapshotInfo, SnapshotRequest, StateUpdate, ToolList, WriteFilesRequest,
)
from sandbox_server.service import MAX_WRITE_BYTES, CancelToken, SandboxService, ServiceConfig
from sandbox_server.tools import ToolResult

#: Seconds added to a call's own deadline before the server gives up on a worker thread.
SERVER_GRACE_S = 10.0
#: Default request-body limit: the largest legitimate body is a file upload of MAX_WRITE_BYTES in
#: base64 (4/3 of it) plus room for names and JSON. ``$FORKYARD_MAX_BODY_BYTES`` overrides it.
MAX_BODY_BYTES = 4 * math.ceil(MAX_WRITE_BYTES / 3) + (1 << 20)
#: Body limit of the sandbox routes that carry no files (exec, state, snapshot, clone, fork): room for
#: metadata at its bound (``models.MAX_METADATA_BYTES``, escaped as JSON) and tool arguments.
SMALL_BODY_BYTES = 512 << 10


async def _disconnected(request: Request) -> None:
    """Return once the client has closed its connection (the request body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _consume(task: asyncio.Future) -> None:
    """Retrieve an abandoned task's outcome, so nothing is reported as never retrieved."""
    if not task.cancelled():
        task.exception()


async def _blocking(fn: Callable[..., Any], *args: Any, deadline_s: float = 60.0, request: Request | None = None,
                    undo: Callable[[Any], None] | None = None, **kw: Any) -> Any:
    """Run ``fn(*args, **kw)`` in a worker thread; give up after ``deadline_s`` seconds with a 503.

    Work that takes resources (create, clone, fork) passes ``undo`` (how to release its result): ``fn``
    then also gets ``cancel=CancelToken()``. Giving up sets the token, so the service releases what it
    took instead of handing it out; if the service had already claimed its result, the result is
    ready: it is returned, or released with ``undo`` when the client is gone. With ``request`` the
    server also gives up when the client hangs up. Work without a token is left to finish in its thread.
    """
    token = CancelToken() if undo is not None else None
    if token is not None:
        kw["cancel"] = token
    work = asyncio.ensure_future(anyio.to_thread.run_sync(functools.partial(fn, *args, **kw)))
    watch = asyncio.ensure_future(_disconnected(request)) if request is not None else None
    try:
        done, _ = await asyncio.wait([work] if watch is None else [work, watch], timeout=deadline_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server cancelled this request: give up the same way
        if token is None or token.set():
            work.add_done_callback(_consume)
        else:  # claimed: release the result when it arrives (in a thread: undo blocks)
            work.add_done_callback(lambda t: t.cancelled() or t.exception() or threading.Thread(
                target=undo, args=(t.result(),), daemon=True).start())
        raise
    finally:
        if watch is not None:
            watch.cancel()
    if work in done:
        return work.result()
    client_gone = watch is not None and watch in done
    if token is not None and not token.set():  # the work was claimed: its result is ready
        result = await work
        if not client_gone:
            return result
        await anyio.to_thread.run_sync(undo, result)
    else:
        work.add_done_callback(_consume)
    if client_gone:
        raise ServiceUnavailable("the client closed the connection before the work finished; nothing was kept")
    raise ServiceUnavailable(f"the sandbox engine did not answer within {deadline_s:g} s", retry_after_s=5.0)


def get_service(request: Request) -> SandboxService:
    """FastAPI dependency: the app's service."""
    return request.app.state.service


def create_app(backend: Backend | str | None = None, config: ServiceConfig | None = None, *,
               service: SandboxService | None = None, warm: bool = True, max_body_bytes: int | None = None) -> FastAPI:
    """Build the FastAPI app. The service starts (orphan clean-up, pool warm-up) in the lifespan.

    Args:
        backend: a backend instance, or ``"local"`` / ``"docker"`` (default ``$FORKYARD_BACKEND`` or local).
        config: service limits, env-session TTL and cap (default: :meth:`ServiceConfig.from_env`, read now).
        service: use this already-built service instead (its config then applies; the app closes it at
            shutdown). Not together with ``backend`` or ``config``.
        warm: wait at start-up until ``min_idle`` sandboxes are idle.
        max_body_bytes: request-body limit in bytes (default ``$FORKYARD_MAX_BODY_BYTES`` or
            :data:`MAX_BODY_BYTES`); env routes have smaller ones.

    If the backend cannot be built (engine down), the app still starts: ``/healthz`` says degraded and
    sandbox routes (and sandbox-backed env sessions) answer 503. Env sessions of sandbox-backed envs
    (FileQA) take their sandboxes from this app's own service, whatever its backend.

    Raises:
        ValueError: ``service`` together with ``backend`` or ``config``, or a limit that is not positive.
    """
    if service is not None and (backend is not None or config is not None):
        raise ValueError("pass either service, or backend and config, not both: a service has its own")
    cfg = service.config if service is not None else (config or ServiceConfig.from_env())
    if max_body_bytes is None:
        max_body_bytes = int(os.environ.get("FORKYARD_MAX_BODY_BYTES", MAX_BODY_BYTES))
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be positive, got {max_body_bytes}")
    sessions = env_api.EnvSessions(ttl_s=cfg.env_ttl_s, max_sessions=cfg.max_env_sessions)
    backend_error: list[str] = []

    def build() -> SandboxService | None:
        if service is not None:
            return service
        b = backend
        if b is None or isinstance(b, str):
            kind = b or os.environ.get("FORKYARD_BACKEND", "local")
            try:
                kw: dict[str, Any] = {}
                if kind == "docker":
                    kw = dict(image=os.environ.get("FORKYARD_SANDBOX_IMAGE", "forkyard-sandbox:latest"),
                              server_name=os.environ.get("FORKYARD_SERVER_NAME", "default"))
                b = make_backend(kind, **kw)
            except ServiceUnavailable as exc:
                backend_error.append(str(exc))
                return None
        return SandboxService(b, cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        svc = await anyio.to_thread.run_sync(build)
        app.state.service = svc
        app.state.backend_error = backend_error[0] if backend_error else None
        reaper_task = None
        try:  # whatever fails from here on, the service (and every sandbox it started) is closed
            if svc is not None:
                await anyio.to_thread.run_sync(lambda: svc.start(wait=warm))
            # Sandbox-backed env sessions (FileQA) take their sandboxes from this app's own service.
            sessions.sandbox_provider = svc
            sessions.sandbox_unavailable = None if svc is not None else f"no sandbox backend: {app.state.backend_error}"
            reaper_task = asyncio.create_task(env_api.reaper(sessions))
            yield
        finally:
            if reaper_task is not None:
                reaper_task.cancel()
            await anyio.to_thread.run_sync(sessions.close_all)  # first: env sessions give their sandboxes back
            if svc is not None:
                await anyio.to_thread.run_sync(svc.close)

    def count_unavailable(request: Request, exc: BaseException, status: int) -> None:
        svc = getattr(request.app.state, "service", None)
        if svc is not None and status == 503:
            svc.metrics.unavailable.labels(type(exc).__name__).inc()

    app = FastAPI(title="forkyard sandbox service", version="1",
                  description="A pool of snapshot-cloneable sandboxes with a read-only tool whitelist and "
                              "per-turn timeouts, and env sessions (/v1/envs) for every registered "
                              "forkyard env. Every error answer is an ErrorBody {detail, status}; 503s carry "
                              "Retry-After. See docs/sandbox.md.", lifespan=lifespan)
    def route_limit(path: str) -> tuple[int, str] | None:
        """Only sandbox creation and file writes carry files: every other sandbox route's body is small,
        so it is refused past :data:`SMALL_BODY_BYTES` before it is read (env routes: their own limits)."""
        if path.startswith("/v1/envs"):
            return sessions.body_limit(path)
        if path == "/v1/sandboxes" or path.endswith("/files"):
            return None
        return SMALL_BODY_BYTES, "this route's body holds no files"

    http_contract.install(app, max_body_bytes=max_body_bytes, route_limit=route_limit,
                          on_error=count_unavailable)
    env_api.install(app, sessions)

    def svc_of(request: Request) -> SandboxService:
        svc = request.app.state.service
        if svc is None:
            raise ServiceUnavailable(f"no sandbox backend: {request.app.state.backend_error}", retry_after_s=10.0)
        return svc

    def release(svc: SandboxService) -> Callable[[Any], None]:
        """Undo of a create / clone / fork whose client is gone: delete what it made."""
        def undo(result: Any) -> None:
            for info in result if isinstance(result, list) else [result]:
                try:
                    svc.delete(info.id)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        return undo

    R = http_contract.error_responses
    r = APIRouter(prefix="/v1")
    S = Depends(svc_of)

    @r.post("/sandboxes", response_model=SandboxInfo, status_code=201, tags=["sandboxes"], responses=R(413, 422, 503))
    async def create_sandbox(request: Request, body: CreateRequest | None = None, svc: SandboxService = S) -> SandboxInfo:
        """Take a warm sandbox for a new session (optionally with per-episode files under /scratch)."""
        body = body or CreateRequest()
        files = WriteFilesRequest(files=body.files, encoding=body.encoding).decoded() if body.files else None
        return await _blocking(svc.create, cwd=body.cwd, env=body.env, metadata=body.metadata, files=files,
                               deadline_s=svc.config.acquire_timeout_s + SERVER_GRACE_S, request=request,
                               undo=release(svc))

    @r.get("/sandboxes", response_model=SandboxList, tags=["sandboxes"], responses=R(503))
    async def list_sandboxes(svc: SandboxService = S) -> SandboxList:
        """Every live session."""
        return SandboxList(sandboxes=svc.list())

    @r.get("/sandboxes/{sandbox_id}", response_model=SandboxInfo, tags=["sandboxes"], responses=R(404, 503))
    async def get_sandbox(sandbox_id: str, svc: SandboxService = S) -> SandboxInfo:
        """One session's state."""
        return svc.get(sandbox_id)

    @r.delete("/sandboxes/{sandbox_id}", status_code=204, tags=["sandboxes"], responses=R(404, 503))
    async def delete_sandbox(sandbox_id: str, svc: SandboxService = S) -> Response:
        """End a session; its sandbox is destroyed and replaced in the pool."""
        await _blocking(svc.delete, sandbox_id)
        return Response(status_code=204)

    @r.post("/sandboxes/{sandbox_id}/exec", response_model=ToolResult, tags=["tools"], responses=R(404, 413, 422, 503))
    async def exec_tool(sandbox_id: str, body: ExecRequest, svc: SandboxService = S) -> ToolResult:
        """Run one whitelisted tool call. Refused calls answer 422 and run nothing."""
        limit = min(body.timeout_s or svc.config.default_timeout_s, svc.config.max_timeout_s) \
            if body.timeout_s is not None and body.timeout_s > 0 else svc.config.max_timeout_s
        return await _blocking(svc.exec, sandbox_id, body.tool, body.args, body.timeout_s,
                               deadline_s=limit + SERVER_GRACE_S + svc.config.acquire_timeout_s)

    @r.put("/sandboxes/{sandbox_id}/files", status_code=204, tags=["sandboxes"], responses=R(404, 413, 422, 503))
    async def write_files(sandbox_id: str, body: WriteFilesRequest, svc: SandboxService = S) -> Response:
        """Write per-episode files under /scratch (server-side; not a tool)."""
        await _blocking(svc.write_files, sandbox_id, body.decoded())
        return Response(status_code=204)

    @r.patch("/sandboxes/{sandbox_id}/state", response_model=SandboxInfo, tags=["sandboxes"],
             responses=R(404, 413, 422, 503))
    async def update_state(sandbox_id: str, body: StateUpdate, svc: SandboxService = S) -> SandboxInfo:
        """Set the working directory, environment variables or metadata of a session."""
        return svc.update_state(sandbox_id, cwd=body.cwd, env=body.env, metadata=body.metadata)

    @r.post("/sandboxes/{sandbox_id}/snapshot", response_model=SnapshotInfo, status_code=201, tags=["snapshots"],
            responses=R(404, 413, 422, 503))
    async def snapshot(request: Request, sandbox_id: str, body: SnapshotRequest | None = None,
                       svc: SandboxService = S) -> SnapshotInfo:
        """Capture /scratch, /tmp and the session state as a stored snapshot (with a TTL)."""
        return await _blocking(svc.snapshot, sandbox_id, (body or SnapshotRequest()).ttl_s, request=request,
                               undo=lambda info: svc.delete_snapshot(info.id))

    @r.get("/snapshots/{snapshot_id}", response_model=SnapshotInfo, tags=["snapshots"], responses=R(404, 503))
    async def get_snapshot(snapshot_id: str, svc: SandboxService = S) -> SnapshotInfo:
        """A stored snapshot's info."""
        return svc.get_snapshot(snapshot_id)

    @r.delete("/snapshots/{snapshot_id}", status_code=204, tags=["snapshots"], responses=R(404, 503))
    async def delete_snapshot(snapshot_id: str, svc: SandboxService = S) -> Response:
        """Forget a snapshot."""
        svc.delete_snapshot(snapshot_id)
        return Response(status_code=204)

    @r.post("/snapshots/{snapshot_id}/clone", response_model=CloneResponse, status_code=201, tags=["snapshots"],
            responses=R(404, 413, 422, 503))
    async def clone(request: Request, snapshot_id: str, body: CloneRequest | None = None,
                    svc: SandboxService = S) -> CloneResponse:
        """n new independent sandboxes restored to the snapshot (all or none)."""
        t0 = time.perf_counter()
        out = await _blocking(svc.clone, snapshot_id, (body or CloneRequest()).n, request=request, undo=release(svc),
                              deadline_s=svc.config.acquire_timeout_s * 2 + SERVER_GRACE_S)
        return CloneResponse(snapshot_id=snapshot_id, sandboxes=out, duration_s=time.perf_counter() - t0)

    @r.post("/sandboxes/{sandbox_id}/fork", response_model=CloneResponse, status_code=201, tags=["snapshots"],
            responses=R(404, 413, 422, 503))
    async def fork(request: Request, sandbox_id: str, body: ForkRequest | None = None,
                   svc: SandboxService = S) -> CloneResponse:
        """Snapshot + clone in one call: n independent copies of the sandbox (all or none)."""
        t0 = time.perf_counter()
        out = await _blocking(svc.fork, sandbox_id, (body or ForkRequest()).n, request=request, undo=release(svc),
                              deadline_s=svc.config.acquire_timeout_s * 2 + SERVER_GRACE_S)
        return CloneResponse(sandboxes=out, duration_s=time.perf_counter() - t0)

    @r.get("/tools", response_model=ToolList, tags=["tools"], responses=R(503))
    async def list_tools(svc: SandboxService = S) -> ToolList:
        """The tool whitelist with each tool's ordered parameters and JSON schema."""
        c = svc.config
        return ToolList(tools=svc.tools(), default_timeout_s=c.default_timeout_s, max_timeout_s=c.max_timeout_s,
                        output_cap_bytes=c.output_cap_bytes)

    @r.get("/pool", response_model=PoolStatus, tags=["pool"], responses=R(503))
    async def pool_status(svc: SandboxService = S) -> PoolStatus:
        """Warm pool sizes and limits."""
        return svc.pool_status()

    app.include_router(r)

    @app.get("/healthz", response_model=Health, tags=["health"], responses=R())
    async def healthz(request: Request) -> Health:
        """``ok`` when a backend is up and the pool's last start succeeded; ``degraded`` otherwise."""
        svc = request.app.state.service
        if svc is None:
            return Health(status="degraded", backend="none", detail=request.app.state.backend_error or "")
        err = svc.pool.last_error
        return Health(status="degraded" if err else "ok", backend=svc.backend.name, detail=err or "")

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse, responses={
        200: {"description": "Prometheus text exposition format 0.0.4",
              "content": {"text/plain": {"schema": {"type": "string"}}}}, **R()})
    async def metrics(request: Request) -> Response:
        """Prometheus text format (not JSON): pool sizes, latency histograms, timeouts, rejected calls."""
        svc = request.app.state.service
        body = svc.metrics.render() if svc is not None else b""
        return PlainTextResponse(content=body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def serve(host: str = "127.0.0.1", port: int = 8000, backend: Backend | str | None = None,
          config: ServiceConfig | None = None, log_level: str = "info") -> None:
    """Run the API with uvicorn until interrupted (blocks). ``backend``: instance, ``"local"`` or ``"docker"``."""
    import uvicorn

    uvicorn.run(create_app(backend, config), host=host, port=port, log_level=log_level, access_log=False)
