"""Leases: env sessions released within a bound when the process that opened them ends, however it ends
(field case S51).

A process ended by SIGTERM (torchrun, accelerate, SLURM and ``docker stop`` end workers that way), SIGKILL or a
crash runs no finalizer, so the sessions it opened over HTTP would stay on the server until their idle TTL
(``FORKYARD_ENV_TTL_S``, 600 s), sandboxes included. A client asks for a lease instead: every request that makes
sessions (``POST /v1/envs``, ``/restore``, ``/{id}/fork``, ``/batch/create``, ``/batch/fork``) may carry the header
``Forkyard-Lease-S: SECONDS``; the sessions it makes then expire after that many seconds without a request that
touches them, instead of the TTL (the shorter of the two applies). The client renews the leases of the sessions it
holds with ``POST /v1/envs/batch/renew`` ``{"session_ids": [...]}`` (forkyard's HTTP clients do it from a
background thread, :mod:`envs.session_lease`); when the process is gone the renewals stop and the reaper closes
its sessions within the lease plus the reaper's period (at most 5 s). A session an OpenEnv connection holds
never expires while the connection is open, and goes with the connection (field case S48).

A lease is between :data:`MIN_LEASE_S` and :data:`~sandbox_server.settings.MAX_SECONDS`; another value, or one
that is not a number, is refused (422) before anything runs.
"""

from __future__ import annotations

import contextvars
import math

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from envs.wire import LEASE_HEADER
from sandbox_server.settings import MAX_SECONDS

#: The shortest lease a client may ask for, in seconds (renewals cost a request each third of it).
MIN_LEASE_S = 5.0
#: The lease of the sessions the current request makes (None: none asked; the idle TTL alone applies).
LEASE: contextvars.ContextVar[float | None] = contextvars.ContextVar("forkyard_lease", default=None)
_HEADER = LEASE_HEADER.lower().encode("ascii")


def parse_lease(value: str) -> float:
    """The lease in seconds a ``Forkyard-Lease-S`` header names.

    Raises:
        ValueError: not a number, not finite, or outside [:data:`MIN_LEASE_S`, ``MAX_SECONDS``].
    """
    try:
        lease = float(value.strip())
    except ValueError:
        raise ValueError(f"{LEASE_HEADER} must be a number of seconds, got {value[:40]!r}") from None
    if not math.isfinite(lease) or not MIN_LEASE_S <= lease <= MAX_SECONDS:
        raise ValueError(f"{LEASE_HEADER} must be between {MIN_LEASE_S:g} and {MAX_SECONDS:g} seconds, got {lease!r}")
    return lease


class LeaseMiddleware:
    """Pure-ASGI middleware: sets :data:`LEASE` for the HTTP request that carries ``Forkyard-Lease-S`` (the
    session store reads it when it registers new sessions); answers 422 ``invalid`` to a bad value."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = next((v for k, v in scope.get("headers", ()) if k == _HEADER), None) if scope["type"] == "http" else None
        if raw is None:
            await self.app(scope, receive, send)
            return
        try:
            lease = parse_lease(raw.decode("latin-1"))
        except ValueError as exc:
            body = orjson.dumps({"detail": str(exc), "status": "invalid"})
            await send({"type": "http.response.start", "status": 422,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        token = LEASE.set(lease)
        try:
            await self.app(scope, receive, send)
        finally:
            LEASE.reset(token)


__all__ = ["LEASE", "LEASE_HEADER", "MIN_LEASE_S", "LeaseMiddleware", "parse_lease"]
