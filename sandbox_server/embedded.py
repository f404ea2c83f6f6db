"""Sandbox providers shared by the envs of one process (the embedded default: no server needed).

:func:`shared_provider` is the entry point ``default`` of the group ``forkyard.sandbox_providers``
(``pyproject.toml``), which :func:`envs.sandbox.provider_for` loads: an env given a backend name (``"local"``,
``"docker"``, any name in :data:`sandbox_server.backends.BACKENDS`) gets an in-process
:class:`~sandbox_server.service.SandboxService` over that backend, started on first use and closed at exit;
an env given a server URL gets a :class:`~sandbox_server.client.SandboxClient`, and one given ``ray:ADDRESS``
what the factory ``ray`` of the same group makes of ``ADDRESS`` (forkyard's: sandboxes on the nodes of a Ray
cluster, the ray extra). A server never uses this module: it passes its own service to the envs it serves.
"""

from __future__ import annotations

from typing import Any

from sandbox_server.shared_providers import close_shared_providers, shared


def shared_provider(backend: str | None = None) -> Any:
    """The provider of ``backend`` shared by every env of this process (see the module docstring); None
    means ``FORKYARD_BACKEND`` or ``local`` (:class:`~sandbox_server.settings.ServerSettings`). Kept by
    :mod:`sandbox_server.shared_providers` (closed at exit, or by :func:`close_shared_providers`).

    Raises:
        ValueError: an unknown backend name (not a URL either).
        ServiceUnavailable (a ``envs.sandbox.SandboxFailure``): the backend cannot start (engine down,
            no bubblewrap).
    """
    if backend is None:
        from sandbox_server.settings import ServerSettings

        backend = ServerSettings().backend
    return shared(backend, lambda: _make(backend))


def _make(backend: str) -> Any:
    if backend.startswith(("http://", "https://")):
        from sandbox_server.client import SandboxClient

        return SandboxClient(backend)
    if backend.startswith("ray:"):  # the Ray code is a plugin of the group: reached by name, never imported here
        from envs.sandbox import provider_for

        return provider_for(backend[4:] or "auto", name="ray")
    from sandbox_server.backends import make_backend
    from sandbox_server.service import SandboxService
    from sandbox_server.settings import ServiceConfig

    return SandboxService(make_backend(backend), ServiceConfig()).start(wait=False)


__all__ = ["close_shared_providers", "shared_provider"]
