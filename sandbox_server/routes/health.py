"""``/healthz`` and ``/metrics`` of every server mode: the full server (:data:`router`; degraded when it has no
sandbox backend) and a server of env sessions alone (:data:`env_router`, ``--no-sandboxes``).

Both answer the env sessions the server holds (field case S63), from one source, the store's
:meth:`~sandbox_server.env_sessions.EnvSessions.census`: counts by env id and transport, expiries by the idle
TTL, refusals at the cap; never a session id. ``/healthz`` needs no API key (probes), ``/metrics`` does.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from sandbox_server.deps import MaybeService, Sessions
from sandbox_server.env_sessions import EnvSessions
from sandbox_server.http_contract import error_responses as R
from sandbox_server.metrics import render_env_sessions
from sandbox_server.models import EnvHealth, EnvSessionCounts, EnvSessionGroup, Health

#: Health and metrics of the full server (sandbox pool + env sessions).
router = APIRouter(tags=["health"])
#: Health and metrics of a server of env sessions alone.
env_router = APIRouter(tags=["health"])


def env_session_counts(sessions: EnvSessions) -> EnvSessionCounts:
    """The counts of ``sessions`` now (their :meth:`~sandbox_server.env_sessions.EnvSessions.census`)."""
    c = sessions.census()
    return EnvSessionCounts(open=c.total, connection_held=c.connection_held, in_use=c.in_use,
                            max_sessions=c.max_sessions, expired=sum(c.expired.values()), refused=c.refused,
                            groups=[EnvSessionGroup(env_id=e, transport=t, open=n, expired=x)
                                    for e, t, n, x in c.groups()])


_METRICS_DOC = {200: {"description": "Prometheus text exposition format 0.0.4",
                      "content": {"text/plain": {"schema": {"type": "string"}}}}, **R()}


def _text(body: bytes) -> Response:
    return PlainTextResponse(content=body, media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/healthz", response_model=Health, responses=R())
async def healthz(request: Request, svc: MaybeService, sessions: Sessions) -> Health:
    """``ok`` when a backend is up and the pool's last start succeeded; ``degraded`` otherwise; with the env
    sessions held (:class:`EnvSessionCounts`)."""
    counts = env_session_counts(sessions)
    if svc is None:
        return Health(status="degraded", backend="none", env_sessions=counts.open, env_session_counts=counts,
                      detail=getattr(request.app.state, "backend_error", None) or "")
    err = svc.pool.last_error
    return Health(status="degraded" if err else "ok", backend=svc.backend.name, detail=err or "",
                  env_sessions=counts.open, env_session_counts=counts)


@router.get("/metrics", response_class=PlainTextResponse, responses=_METRICS_DOC)
async def metrics(svc: MaybeService, sessions: Sessions) -> Response:
    """Prometheus text format (not JSON): pool sizes, latency histograms, timeouts, rejected calls (none without
    a backend), and the env sessions (:class:`~sandbox_server.metrics.EnvSessionCollector`)."""
    body = svc.metrics.render() if svc is not None else b""
    return _text(body + render_env_sessions(sessions.census))


# The same operations as the full server's (their ids and summaries), with the env-only server's answers.
@env_router.get("/healthz", response_model=EnvHealth, responses=R(), summary="Healthz",
                operation_id="healthz_healthz_get")
async def env_healthz(sessions: Sessions) -> EnvHealth:
    """``ok`` and the env sessions the server holds."""
    counts = env_session_counts(sessions)
    return EnvHealth(status="ok", env_sessions=counts.open, env_session_counts=counts)


@env_router.get("/metrics", response_class=PlainTextResponse, responses=_METRICS_DOC, summary="Metrics",
                operation_id="metrics_metrics_get")
async def env_metrics(sessions: Sessions) -> Response:
    """Prometheus text format (not JSON): the env sessions (:class:`~sandbox_server.metrics.EnvSessionCollector`)."""
    return _text(render_env_sessions(sessions.census))
