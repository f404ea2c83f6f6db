"""The sandboxes under a server's env sessions: held as long as their sessions are (field case S48).

A sandbox-backed env (FileQA) takes its sandboxes from the server's sandbox service, whose own idle clock
(``FORKYARD_IDLE_TTL_S``) would delete a sandbox that no tool call touched for that long, even under an env
session that a connection holds open or that its TTL has not reclaimed. So the env sessions of a server hand
their envs a :class:`HeldSandboxes` in front of the service: it remembers every sandbox the envs created,
forked or restored and have not released, and :meth:`HeldSandboxes.keep_alive` (called by the env-session
reaper) restarts their idle clocks. The env-session clock alone then decides: when a session closes (TTL,
delete, its connection gone) its env releases the sandbox, which leaves the set; a release that fails leaves
it too, so the sandbox's own TTL reclaims it.

A provider without ``touch`` (a remote server's client) is passed through unchanged in every call; its
sandboxes keep their server's idle clock.
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Sequence


class HeldSandboxes:
    """A sandbox provider (:class:`envs.sandbox.SandboxProvider`) in front of ``provider`` that remembers
    the sandboxes its envs hold.

    Args:
        provider: the server's sandbox service (or any provider; ``touch`` makes :meth:`keep_alive` work).
    """

    def __init__(self, provider: Any):
        self.provider = provider
        self._held: set[str] = set()
        self._mu = threading.Lock()

    @property
    def name(self) -> str:
        """The provider's name (what its sandboxes run on)."""
        return str(self.provider.name)

    def _add(self, ids: Iterable[str]) -> None:
        with self._mu:
            self._held.update(ids)

    def held(self) -> set[str]:
        """A copy of the ids of the sandboxes the envs hold now."""
        with self._mu:
            return set(self._held)

    def create(self, **kwargs: Any) -> Any:
        """The provider's ``create`` (keywords as its own); the new sandbox is held."""
        box = self.provider.create(**kwargs)
        self._add([box.id])
        return box

    def fork(self, sandbox_id: str, n: int) -> Sequence[Any]:
        """The provider's ``fork``; the copies are held."""
        boxes = self.provider.fork(sandbox_id, n)
        self._add(b.id for b in boxes)
        return boxes

    def delete(self, sandbox_id: str) -> None:
        """The provider's ``delete``; the sandbox is no longer held, even when the delete failed (then the
        sandbox's own idle clock reclaims it)."""
        try:
            self.provider.delete(sandbox_id)
        finally:
            with self._mu:
                self._held.discard(sandbox_id)

    def exec(self, sandbox_id: str, tool: str, args: dict[str, Any], timeout_s: float | None = None) -> Any:
        """The provider's ``exec``."""
        return self.provider.exec(sandbox_id, tool, args, timeout_s=timeout_s)

    def tools(self) -> Sequence[Any]:
        """The provider's tool whitelist."""
        return self.provider.tools()

    def data_dir(self) -> str:
        """The provider's data folder."""
        return str(self.provider.data_dir())

    def keep_alive(self) -> int:
        """Restart the idle clock of every held sandbox (``provider.touch(ids)``); returns how many were
        touched (0 for a provider without ``touch``). Errors of the provider propagate."""
        touch = getattr(self.provider, "touch", None)
        ids = self.held()
        if touch is None or not ids:
            return 0
        return int(touch(ids))


class HeldExportingSandboxes(HeldSandboxes):
    """:class:`HeldSandboxes` of a provider that exports sandboxes (env snapshots then carry the sandbox)."""

    def export(self, sandbox_id: str) -> bytes:
        """The provider's ``export`` (a tar of the sandbox's writable areas)."""
        return bytes(self.provider.export(sandbox_id))


def hold_sandboxes(provider: Any) -> HeldSandboxes:
    """A :class:`HeldSandboxes` in front of ``provider``: the exporting kind when it has ``export`` (so an env's
    ``isinstance(provider, ExportingProvider)`` answers as it would for ``provider`` itself)."""
    return (HeldExportingSandboxes if callable(getattr(provider, "export", None)) else HeldSandboxes)(provider)


def provider_ttl_s(provider: Any) -> float | None:
    """The idle TTL in seconds of ``provider``'s sandboxes when it says (a service's ``config.idle_ttl_s``),
    else None: the env-session reaper runs often enough to touch them before it passes."""
    ttl = getattr(getattr(provider, "config", None), "idle_ttl_s", None)
    return float(ttl) if isinstance(ttl, (int, float)) and ttl > 0 else None


__all__ = ["HeldExportingSandboxes", "HeldSandboxes", "hold_sandboxes", "provider_ttl_s"]
