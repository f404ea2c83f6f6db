"""``/healthz`` and ``/metrics``. A server of env sessions alone has its own ``/healthz`` (:data:`env_router`)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from sandbox_server.deps import MaybeService, Sessions
from sandbox_server.http_contract import error_responses as R
from sandbox_server.models import EnvHealth, Health

#: Health and metrics of the full server (sandbox pool + env sessions).
router = APIRouter(tags=["health"])
#: Health of a server of env sessions alone.
env_router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses=R())
async def healthz(request: Request, svc: MaybeService) -> Health:
    """``ok`` when a backend is up and the pool's last start succeeded; ``degraded`` otherwise."""
    if svc is None:
        return Health(status="degraded", backend="none", detail=getattr(request.app.state, "backend_error", None) or "")
    err = svc.pool.last_error
    return Health(status="degraded" if err else "ok", backend=svc.backend.name, detail=err or "")


@router.get("/metrics", response_class=PlainTextResponse, responses={
    200: {"description": "Prometheus text exposition format 0.0.4",
          "content": {"text/plain": {"schema": {"type": "string"}}}}, **R()})
async def metrics(svc: MaybeService) -> Response:
    """Prometheus text format (not JSON): pool sizes, latency histograms, timeouts, rejected calls."""
    body = svc.metrics.render() if svc is not None else b""
    return PlainTextResponse(content=body, media_type="text/plain; version=0.0.4; charset=utf-8")


# The same operation as the full server's /healthz (its id and summary), with the env-only server's answer.
@env_router.get("/healthz", response_model=EnvHealth, responses=R(), summary="Healthz",
                operation_id="healthz_healthz_get")
async def env_healthz(sessions: Sessions) -> EnvHealth:
    """``ok`` and how many env sessions the server holds."""
    return EnvHealth(status="ok", env_sessions=len(sessions))
