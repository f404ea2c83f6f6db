"""Typed FastAPI dependencies of the routes: what a route handler gets from the app it runs in.

Use the ``Annotated`` aliases as parameter types::

    @router.get("/pool")
    async def pool_status(svc: Service) -> PoolStatus: ...

* :data:`Service`: the app's :class:`SandboxService`; a server whose backend could not start answers 503
  (with ``Retry-After``) instead of calling the handler.
* :data:`MaybeService`: the service or None (health and metrics routes, which answer either way).
* :data:`Sessions`: the app's :class:`EnvSessions`.
* :data:`Host`: the app's :class:`SessionHost` (the env-session operations every transport shares).

The app (:func:`sandbox_server.app.create_app`) keeps them on ``app.state``: ``service`` (None until its
lifespan built one, or when the backend is down), ``backend_error`` and ``env_sessions``. The
dependencies are ``async`` so that FastAPI calls them on the event loop, without a thread hop.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from sandbox_server.env_sessions import NO_BACKEND_RETRY_S, EnvSessions
from sandbox_server.errors import ServiceUnavailable
from sandbox_server.service import SandboxService
from sandbox_server.session_host import SessionHost


async def get_service(request: Request) -> SandboxService:
    """The app's sandbox service. Raises ServiceUnavailable (503) when its backend could not start."""
    svc = getattr(request.app.state, "service", None)
    if svc is None:
        raise ServiceUnavailable(f"no sandbox backend: {getattr(request.app.state, 'backend_error', None)}",
                                 retry_after_s=NO_BACKEND_RETRY_S)
    return svc


async def get_optional_service(request: Request) -> SandboxService | None:
    """The app's sandbox service, or None when it has none (backend down)."""
    return getattr(request.app.state, "service", None)


async def get_env_sessions(request: Request) -> EnvSessions:
    """The app's env sessions."""
    return request.app.state.env_sessions


async def get_env_host(request: Request) -> SessionHost:
    """The app's env-session host (the operations every transport shares)."""
    return request.app.state.env_host


Service = Annotated[SandboxService, Depends(get_service)]
MaybeService = Annotated[SandboxService | None, Depends(get_optional_service)]
Sessions = Annotated[EnvSessions, Depends(get_env_sessions)]
Host = Annotated[SessionHost, Depends(get_env_host)]

__all__ = ["Host", "MaybeService", "Service", "Sessions", "get_env_host", "get_env_sessions", "get_optional_service",
           "get_service"]
