"""The HTTP API (FastAPI, versioned under ``/v1``) over a :class:`SandboxService`.

Status codes: 404 unknown sandbox or snapshot; 422 refused tool call or malformed request (nothing
executed; ``detail`` names the problem); 503 with ``Retry-After`` when the engine is down or the pool is
exhausted; 500 never on bad input. Blocking work (engine calls, agent round trips) runs in worker
threads, never on the event loop, under a server-side deadline.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from typing import Any, Callable

import anyio
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from sandbox_server import env_api
from sandbox_server.backends import Backend, make_backend
from sandbox_server.errors import SandboxError, SandboxNotFound, ServiceUnavailable, ToolRefused
from sandbox_server.models import (
    CloneRequest, CloneResponse, CreateRequest, ErrorBody, ExecRequest, ForkRequest, Health, PoolStatus,
    SandboxInfo, SandboxList, SnapshotInfo, SnapshotRequest, StateUpdate, ToolList, WriteFilesRequest,
)
from sandbox_server.service import SandboxService, ServiceConfig
from sandbox_server.tools import ToolResult

#: Seconds added to a call's own deadline before the server gives up on a worker thread.
SERVER_GRACE_S = 10.0
_ERRORS = {404: {"model": ErrorBody}, 422: {"model": ErrorBody}, 503: {"model": ErrorBody}}


async def _blocking(fn: Callable[..., Any], *args: Any, deadline_s: float = 60.0, **kw: Any) -> Any:
    """Run ``fn`` in a worker thread; give up after ``deadline_s`` seconds with a 503 (the thread is left to finish)."""
    try:
        return await asyncio.wait_for(anyio.to_thread.run_sync(lambda: fn(*args, **kw), abandon_on_cancel=True),
                                      deadline_s)
    except asyncio.TimeoutError:
        raise ServiceUnavailable(f"the sandbox engine did not answer within {deadline_s:g} s", retry_after_s=5.0) from None


def get_service(request: Request) -> SandboxService:
    """FastAPI dependency: the app's service."""
    return request.app.state.service


def create_app(backend: Backend | str | None = None, config: ServiceConfig | None = None, *,
               service: SandboxService | None = None, warm: bool = True) -> FastAPI:
    """Build the FastAPI app. The service starts (orphan clean-up, pool warm-up) in the lifespan.

    Args:
        backend: a backend instance, or ``"local"`` / ``"docker"`` (default ``$FORKYARD_BACKEND`` or local).
        config: service limits (default: :meth:`ServiceConfig.from_env`).
        service: use this already-built service instead (the app then closes it at shutdown).
        warm: wait at start-up until ``min_idle`` sandboxes are idle.

    If the backend cannot be built (engine down), the app still starts: ``/healthz`` says degraded and
    sandbox routes answer 503.
    """
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
        return SandboxService(b, config or ServiceConfig.from_env())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        svc = await anyio.to_thread.run_sync(build)
        app.state.service = svc
        app.state.backend_error = backend_error[0] if backend_error else None
        if svc is not None:
            await anyio.to_thread.run_sync(lambda: svc.start(wait=warm))
            # Sandbox-backed envs served by this app (FileQA) take their sandboxes from this pool.
            from envs.fileqa import set_provider

            replaced = set_provider(svc.backend.name, svc)
        else:
            replaced = None
        reaper_task = asyncio.create_task(env_api.reaper(app.state.env_sessions))
        try:
            yield
        finally:
            reaper_task.cancel()
            await anyio.to_thread.run_sync(app.state.env_sessions.close_all)
            if svc is not None:
                from envs.fileqa import set_provider

                set_provider(svc.backend.name, replaced)
                await anyio.to_thread.run_sync(svc.close)

    app = FastAPI(title="forkyard sandbox service", version="1",
                  description="A pool of snapshot-cloneable sandboxes with a read-only tool whitelist and "
                              "per-turn timeouts, and env sessions (/v1/envs) for every registered "
                              "forkyard env. See docs/sandbox.md.", lifespan=lifespan)
    env_api.install(app)

    def svc_of(request: Request) -> SandboxService:
        svc = request.app.state.service
        if svc is None:
            raise ServiceUnavailable(f"no sandbox backend: {request.app.state.backend_error}", retry_after_s=10.0)
        return svc

    @app.exception_handler(ToolRefused)
    async def _refused(request: Request, exc: ToolRefused) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(exc), "status": "refused"})

    @app.exception_handler(SandboxNotFound)
    async def _notfound(request: Request, exc: SandboxNotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(exc), "status": "not_found"})

    @app.exception_handler(ServiceUnavailable)
    async def _unavailable(request: Request, exc: ServiceUnavailable) -> JSONResponse:
        svc = request.app.state.service
        if svc is not None:
            svc.metrics.unavailable.labels(type(exc).__name__).inc()
        return JSONResponse(status_code=503, content={"detail": str(exc), "status": "unavailable"},
                            headers={"Retry-After": str(max(1, int(round(exc.retry_after_s))))})

    @app.exception_handler(SandboxError)
    async def _sandbox_error(request: Request, exc: SandboxError) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": str(exc), "status": "sandbox_error"},
                            headers={"Retry-After": "1"})

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": str(exc), "status": "invalid"})

    r = APIRouter(prefix="/v1", responses=_ERRORS)
    S = Depends(svc_of)

    @r.post("/sandboxes", response_model=SandboxInfo, status_code=201, tags=["sandboxes"])
    async def create_sandbox(body: CreateRequest | None = None, svc: SandboxService = S) -> SandboxInfo:
        """Take a warm sandbox for a new session (optionally with per-episode files under /scratch)."""
        body = body or CreateRequest()
        files = WriteFilesRequest(files=body.files, encoding=body.encoding).decoded() if body.files else None
        return await _blocking(svc.create, cwd=body.cwd, env=body.env, metadata=body.metadata, files=files,
                               deadline_s=svc.config.acquire_timeout_s + SERVER_GRACE_S)

    @r.get("/sandboxes", response_model=SandboxList, tags=["sandboxes"])
    async def list_sandboxes(svc: SandboxService = S) -> SandboxList:
        """Every live session."""
        return SandboxList(sandboxes=svc.list())

    @r.get("/sandboxes/{sandbox_id}", response_model=SandboxInfo, tags=["sandboxes"])
    async def get_sandbox(sandbox_id: str, svc: SandboxService = S) -> SandboxInfo:
        """One session's state."""
        return svc.get(sandbox_id)

    @r.delete("/sandboxes/{sandbox_id}", status_code=204, tags=["sandboxes"])
    async def delete_sandbox(sandbox_id: str, svc: SandboxService = S) -> Response:
        """End a session; its sandbox is destroyed and replaced in the pool."""
        await _blocking(svc.delete, sandbox_id)
        return Response(status_code=204)

    @r.post("/sandboxes/{sandbox_id}/exec", response_model=ToolResult, tags=["tools"])
    async def exec_tool(sandbox_id: str, body: ExecRequest, svc: SandboxService = S) -> ToolResult:
        """Run one whitelisted tool call. Refused calls answer 422 and run nothing."""
        limit = min(body.timeout_s or svc.config.default_timeout_s, svc.config.max_timeout_s) \
            if isinstance(body.timeout_s, (int, float)) and body.timeout_s > 0 else svc.config.max_timeout_s
        return await _blocking(svc.exec, sandbox_id, body.tool, body.args, body.timeout_s,
                               deadline_s=limit + SERVER_GRACE_S + svc.config.acquire_timeout_s)

    @r.put("/sandboxes/{sandbox_id}/files", status_code=204, tags=["sandboxes"])
    async def write_files(sandbox_id: str, body: WriteFilesRequest, svc: SandboxService = S) -> Response:
        """Write per-episode files under /scratch (server-side; not a tool)."""
        await _blocking(svc.write_files, sandbox_id, body.decoded())
        return Response(status_code=204)

    @r.patch("/sandboxes/{sandbox_id}/state", response_model=SandboxInfo, tags=["sandboxes"])
    async def update_state(sandbox_id: str, body: StateUpdate, svc: SandboxService = S) -> SandboxInfo:
        """Set the working directory, environment variables or metadata of a session."""
        return svc.update_state(sandbox_id, cwd=body.cwd, env=body.env, metadata=body.metadata)

    @r.post("/sandboxes/{sandbox_id}/snapshot", response_model=SnapshotInfo, status_code=201, tags=["snapshots"])
    async def snapshot(sandbox_id: str, body: SnapshotRequest | None = None, svc: SandboxService = S) -> SnapshotInfo:
        """Capture /scratch, /tmp and the session state as a stored snapshot (with a TTL)."""
        return await _blocking(svc.snapshot, sandbox_id, (body or SnapshotRequest()).ttl_s)

    @r.get("/snapshots/{snapshot_id}", response_model=SnapshotInfo, tags=["snapshots"])
    async def get_snapshot(snapshot_id: str, svc: SandboxService = S) -> SnapshotInfo:
        """A stored snapshot's info."""
        return svc.get_snapshot(snapshot_id)

    @r.delete("/snapshots/{snapshot_id}", status_code=204, tags=["snapshots"])
    async def delete_snapshot(snapshot_id: str, svc: SandboxService = S) -> Response:
        """Forget a snapshot."""
        svc.delete_snapshot(snapshot_id)
        return Response(status_code=204)

    @r.post("/snapshots/{snapshot_id}/clone", response_model=CloneResponse, status_code=201, tags=["snapshots"])
    async def clone(snapshot_id: str, body: CloneRequest | None = None, svc: SandboxService = S) -> CloneResponse:
        """n new independent sandboxes restored to the snapshot."""
        import time

        t0 = time.perf_counter()
        out = await _blocking(svc.clone, snapshot_id, (body or CloneRequest()).n,
                              deadline_s=svc.config.acquire_timeout_s * 2 + SERVER_GRACE_S)
        return CloneResponse(snapshot_id=snapshot_id, sandboxes=out, duration_s=time.perf_counter() - t0)

    @r.post("/sandboxes/{sandbox_id}/fork", response_model=CloneResponse, status_code=201, tags=["snapshots"])
    async def fork(sandbox_id: str, body: ForkRequest | None = None, svc: SandboxService = S) -> CloneResponse:
        """Snapshot + clone in one call: n independent copies of the sandbox."""
        import time

        t0 = time.perf_counter()
        out = await _blocking(svc.fork, sandbox_id, (body or ForkRequest()).n,
                              deadline_s=svc.config.acquire_timeout_s * 2 + SERVER_GRACE_S)
        return CloneResponse(sandboxes=out, duration_s=time.perf_counter() - t0)

    @r.get("/tools", response_model=ToolList, tags=["tools"])
    async def list_tools(svc: SandboxService = S) -> ToolList:
        """The tool whitelist with each tool's ordered parameters and JSON schema."""
        c = svc.config
        return ToolList(tools=svc.tools(), default_timeout_s=c.default_timeout_s, max_timeout_s=c.max_timeout_s,
                        output_cap_bytes=c.output_cap_bytes)

    @r.get("/pool", response_model=PoolStatus, tags=["pool"])
    async def pool_status(svc: SandboxService = S) -> PoolStatus:
        """Warm pool sizes and limits."""
        return svc.pool_status()

    app.include_router(r)

    @app.get("/healthz", response_model=Health, tags=["health"])
    async def healthz(request: Request) -> Health:
        """``ok`` when a backend is up and the pool's last start succeeded; ``degraded`` otherwise."""
        svc = request.app.state.service
        if svc is None:
            return Health(status="degraded", backend="none", detail=request.app.state.backend_error or "")
        err = svc.pool.last_error
        return Health(status="degraded" if err else "ok", backend=svc.backend.name, detail=err or "")

    @app.get("/metrics", tags=["health"])
    async def metrics(request: Request) -> Response:
        """Prometheus text format: pool sizes, latency histograms, timeouts, rejected calls."""
        svc = request.app.state.service
        body = svc.metrics.render() if svc is not None else b""
        return Response(content=body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def serve(host: str = "127.0.0.1", port: int = 8000, backend: Backend | str | None = None,
          config: ServiceConfig | None = None, log_level: str = "info") -> None:
    """Run the API with uvicorn until interrupted (blocks). ``backend``: instance, ``"local"`` or ``"docker"``."""
    import uvicorn

    uvicorn.run(create_app(backend, config), host=host, port=port, log_level=log_level, access_log=False)
