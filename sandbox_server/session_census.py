"""What an operator may know of a server's env sessions: counts, never ids (field case S63).

:class:`Census` is the one source of the env-session figures that ``/healthz`` answers and ``/metrics``
exposes (:class:`sandbox_server.metrics.EnvSessionCollector`), in every server mode: the full server, a
degraded one (no sandbox backend) and ``--no-sandboxes``. It groups sessions by env id and by transport:

* the env id is the registered name (the part after ``module:`` of Gymnasium's ``"module:Id"`` form, which
  names the same env): a bounded label, since a server makes sessions only of registered envs;
* the transport is the one that made the session (:data:`TRANSPORT`): ``rest`` (``/v1/envs``, single and
  batched routes: one wire, and a session made by either is driven by both) or ``openenv`` (the OpenEnv
  WebSocket, ``/openenv/{env_id}/ws``).

Session ids, kwargs and keys never appear in a census.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field

#: The transport of the current task (labels the sessions it makes); a transport other than ``rest`` sets it
#: for the task that serves a connection (:mod:`sandbox_server.routes.openenv`).
TRANSPORT: contextvars.ContextVar[str] = contextvars.ContextVar("forkyard_transport", default="rest")
#: Every value :data:`TRANSPORT` takes.
TRANSPORTS = ("rest", "openenv")


def env_label(env_id: str) -> str:
    """The registered name of ``env_id`` (``"module:Id"`` -> ``"Id"``): the env id of a census."""
    return env_id.rpartition(":")[2]


@dataclass(frozen=True)
class Census:
    """Env-session counts of one store at one moment (:meth:`sandbox_server.env_sessions.EnvSessions.census`).

    Attributes:
        open: ``{(env id, transport): sessions held now}`` (only groups with a session).
        expired: ``{(env id, transport): sessions closed by the idle TTL since the server started}``.
        refused: creates and forks refused at the session cap since the server started (one per request
            item, whatever its ``n``).
        connection_held: sessions an open connection holds (an OpenEnv WebSocket's own and its forks not
            yet attached): the TTL does not expire them while it is open (field case S48).
        in_use: what counts against the cap: sessions, room reserved for sessions being made, and envs held
            outside sessions (a Ray rollout worker's).
        max_sessions: the cap.
    """

    open: dict[tuple[str, str], int] = field(default_factory=dict)
    expired: dict[tuple[str, str], int] = field(default_factory=dict)
    refused: int = 0
    connection_held: int = 0
    in_use: int = 0
    max_sessions: int = 0

    @property
    def total(self) -> int:
        """Sessions held now."""
        return sum(self.open.values())

    def groups(self) -> list[tuple[str, str, int, int]]:
        """``(env id, transport, open, expired)`` of every group with a session now or an expiry so far, sorted."""
        keys = sorted(set(self.open) | set(self.expired))
        return [(e, t, self.open.get((e, t), 0), self.expired.get((e, t), 0)) for e, t in keys]


__all__ = ["TRANSPORT", "TRANSPORTS", "Census", "env_label"]
