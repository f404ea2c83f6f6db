"""Leases on the env sessions a process opens over HTTP, renewed while the process lives (field case S51).

A process ended by SIGTERM, SIGKILL or a crash runs no finalizer and closes no session. So forkyard's HTTP
clients (:class:`~envs.http_connections.HttpConnections`, under ``RemoteEnv``, ``RemoteVectorEnv``, TRL's
``environment_factory`` instances) ask the server for a lease of :data:`LEASE_S` seconds on every session they make
(the header :data:`envs.wire.LEASE_HEADER`), and one daemon thread per process renews the leases of the sessions
that process still holds every third of that (``POST /v1/envs/batch/renew``). While the process lives its
sessions never expire, however long it thinks between steps; once it is gone, however it ended, the server closes
them within :data:`LEASE_S` plus its reaper's period (at most 5 s): 65 s, against the idle TTL (600 s) before.

A fork child (``os.fork``) never renews its parent's sessions: each :class:`Leases` keeps the sessions of the
process that made them, and a child starts its own renewal thread for its own (field case S59).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any

import orjson

from envs.wire import LEASE_HEADER

#: Seconds of the lease forkyard's HTTP clients ask for on the sessions they make.
LEASE_S = 60.0
#: Most session ids one renewal names (the server's limit, ``sandbox_server.models.MAX_RENEW_IDS``).
RENEW_CHUNK = 1024
_RENEW_PATH = "/v1/envs/batch/renew"

log = logging.getLogger("forkyard.lease")


def lease_headers() -> dict[str, str]:
    """The header a client sends on every request so that the sessions it makes carry a lease."""
    return {LEASE_HEADER: f"{LEASE_S:g}"}


class Leases:
    """The sessions one set of connections holds, by the process that made them; renewed by that process's
    keeper thread until :meth:`discard` (a delete) or the server says they are gone.

    Args:
        connections: the ``HttpConnections`` the renewals are sent through (held weakly: closing or dropping
            it stops its renewals).
    """

    def __init__(self, connections: Any):
        self._connections = weakref.ref(connections)
        self._sids: dict[int, set[str]] = {}
        self._lock = threading.Lock()
        self.disabled = False  # a server without the renew route (an older release): its TTL applies

    def add(self, sids: list[str]) -> None:
        """Hold ``sids`` (sessions this process just made): their leases are renewed from now on."""
        if not sids:
            return
        with self._lock:
            self._sids.setdefault(os.getpid(), set()).update(sids)
        _keeper().watch(self)

    def discard(self, sids: list[str]) -> None:
        """Stop renewing ``sids`` (deleted, or lost)."""
        with self._lock:
            mine = self._sids.get(os.getpid())
            if mine is not None:
                mine.difference_update(sids)

    def held(self) -> list[str]:
        """The sessions this process holds here, sorted."""
        with self._lock:
            return sorted(self._sids.get(os.getpid(), ()))

    def renew(self) -> int:
        """Renew every session this process holds here now; forget those the server no longer has. Returns
        how many were renewed. Never raises: a failed renewal is logged and tried again next period."""
        connections = self._connections()
        if connections is None or connections.closed or self.disabled:
            return 0
        renewed = 0
        held = self.held()
        for start in range(0, len(held), RENEW_CHUNK):
            chunk = held[start:start + RENEW_CHUNK]
            try:
                status, data, _ = connections.request("POST", _RENEW_PATH, orjson.dumps({"session_ids": chunk}))
            except Exception as exc:  # noqa: BLE001 - the server is away: the next period tries again
                log.debug("lease renewal failed: %s", exc)
                return renewed
            if status in (404, 405):
                self.disabled = True  # a server without leases: the sessions live by its idle TTL
                return renewed
            if status != 200:
                log.debug("lease renewal answered %s", status)
                return renewed
            answer = orjson.loads(data)
            self.discard(answer.get("missing", []))
            renewed += len(answer.get("renewed", []))
        return renewed


class _Keeper:
    """One daemon thread per process renewing every watched :class:`Leases` each third of :data:`LEASE_S`."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._watched: weakref.WeakSet[Leases] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, leases: Leases) -> None:
        with self._lock:
            self._watched.add(leases)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="forkyard-lease", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        stop = threading.Event()
        while not stop.wait(LEASE_S / 3):
            with self._lock:
                watched = list(self._watched)
            for leases in watched:
                leases.renew()


_KEEPER: _Keeper | None = None
_KEEPER_LOCK = threading.Lock()


def _keeper() -> _Keeper:
    """This process's keeper (a fork child makes its own: the parent's thread does not exist there)."""
    global _KEEPER
    with _KEEPER_LOCK:
        if _KEEPER is None or _KEEPER.pid != os.getpid():
            _KEEPER = _Keeper()
        return _KEEPER


__all__ = ["LEASE_S", "Leases", "lease_headers"]
