"""Sandbox providers shared by the envs of one process (the embedded default: no server needed).

:func:`shared_provider` is ``envs.sandbox.PROVIDER_FACTORY``: an env given a backend name (``"local"``,
``"docker"``, any name in :data:`sandbox_server.backends.BACKENDS`) gets an in-process
:class:`~sandbox_server.service.SandboxService` over that backend, started on first use and closed at exit;
an env given a server URL gets a :class:`~sandbox_server.client.SandboxClient`, and one given ``ray:ADDRESS``
a :class:`~sandbox_server.ray_sandboxes.RayProvider` (sandboxes on the nodes of a Ray cluster). A server never uses this
module: it passes its own service to the envs it serves.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

_providers: dict[str, Any] = {}
_lock = threading.Lock()
_inherited: list[Any] = []  # a forked child's copies of its parent's providers (never used, never closed)


def _forget_inherited_providers() -> None:
    """In a forked child (an async vector env's worker), the parent's sandbox services are not ours: their
    agents' pipes and sockets are shared with the parent, and their threads did not survive the fork.
    Forget them (without closing: the parent still uses them); the child starts its own."""
    global _lock
    _inherited.extend(_providers.values())  # kept referenced: no finalizer of theirs may run in the child
    _providers.clear()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_inherited_providers)


def shared_provider(backend: str | None = None) -> Any:
    """The provider of ``backend`` shared by every env of this process (see the module docstring); None
    means ``FORKYARD_BACKEND`` or ``local`` (:class:`~sandbox_server.settings.ServerSettings`).

    Raises:
        ValueError: an unknown backend name (not a URL either).
        ServiceUnavailable (a ``envs.sandbox.SandboxFailure``): the backend cannot start (engine down,
            no bubblewrap).
    """
    if backend is None:
        from sandbox_server.settings import ServerSettings

        backend = ServerSettings().backend
    with _lock:
        if backend in _providers:
            return _providers[backend]
        if backend.startswith(("http://", "https://")):
            from sandbox_server.client import SandboxClient

            provider: Any = SandboxClient(backend)
        elif backend.startswith("ray:"):
            from sandbox_server.ray_sandboxes import RayProvider

            provider = RayProvider(backend[4:] or "auto")
        else:
            from sandbox_server.backends import make_backend
            from sandbox_server.service import SandboxService
            from sandbox_server.settings import ServiceConfig

            provider = SandboxService(make_backend(backend), ServiceConfig()).start(wait=False)
        _providers[backend] = provider
        return provider


def close_shared_providers() -> None:
    """Close every provider :func:`shared_provider` made in this process (their sandboxes are destroyed);
    a later call makes new ones. Runs at interpreter exit; call it earlier to free the sandboxes sooner."""
    with _lock:
        providers = list(_providers.values())
        _providers.clear()
    for provider in providers:
        provider.close()


atexit.register(close_shared_providers)
