"""Sandbox providers shared by the envs of one process (the embedded default: no server needed).

:func:`shared_provider` is the entry point ``default`` of the group ``forkyard.sandbox_providers``
(``pyproject.toml``), which :func:`envs.sandbox.provider_for` loads: an env given a backend name (``"local"``,
``"docker"``, any name in :data:`sandbox_server.backends.BACKENDS`) gets an in-process
:class:`~sandbox_server.service.SandboxService` over that backend, started on first use and closed at exit;
an env given a server URL gets a :class:`~sandbox_server.client.SandboxClient`, and one given ``ray:ADDRESS``
what the factory ``ray`` of the same group makes of ``ADDRESS`` (forkyard's: sandboxes on the nodes of a Ray
cluster, the ray extra). A server never uses this module: it passes its own service to the envs it serves.

The settings a provider is made with (:func:`shared_settings`: default backend, server name, docker image,
corpus) are read once, where the provider is made, and passed down to it (the backend reads no variable). A
process whose providers must carry other values than its ``FORKYARD_*`` variables say (a Ray node host: its
sandboxes are labelled ``<server name>-<node name>``) says so with :func:`use_shared_settings`, never by
writing the environment.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from sandbox_server.settings import ServerSettings
from sandbox_server.shared_providers import close_shared_providers, shared

_overrides: dict[str, Any] = {}  # use_shared_settings: fields given in place of their FORKYARD_* variables
_overrides_lock = threading.Lock()


def shared_settings() -> ServerSettings:
    """The settings a shared provider made now is made with: the values given to :func:`use_shared_settings`,
    every other field from its ``FORKYARD_*`` variable, read now, else its default.

    Raises:
        pydantic.ValidationError: a ``FORKYARD_*`` variable (or a value given to :func:`use_shared_settings`)
            holds a bad value.
    """
    with _overrides_lock:
        values = dict(_overrides)
    return ServerSettings(**values)


def use_shared_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """From now on, make this process's shared providers with ``values`` (fields of
    :class:`~sandbox_server.settings.ServerSettings`, ``{"server_name": "srv-n1"}``) in place of their
    ``FORKYARD_*`` variables; ``{}``: the variables again. The values given before are replaced, and returned
    (pass them back to restore them). Providers already kept keep what they were made with
    (:func:`close_shared_providers` first to remake them).

    Raises:
        ValueError: a name that is not a field of the settings (values are checked where a provider is made).
    """
    unknown = sorted(set(values) - set(ServerSettings.model_fields))
    if unknown:
        raise ValueError(f"not fields of ServerSettings: {unknown}")
    global _overrides
    with _overrides_lock:
        before, _overrides = _overrides, dict(values)
    return before


def shared_provider(backend: str | None = None) -> Any:
    """The provider of ``backend`` shared by every env of this process (see the module docstring); None
    means the ``backend`` of :func:`shared_settings` (``FORKYARD_BACKEND`` or ``local``). Kept by
    :mod:`sandbox_server.shared_providers` (closed at exit, or by :func:`close_shared_providers`); one made
    now takes :func:`shared_settings`, read once here.

    Raises:
        ValueError: an unknown backend name (not a URL either); a bad ``FORKYARD_*`` variable
            (``pydantic.ValidationError``).
        ServiceUnavailable (a ``envs.sandbox.SandboxFailure``): the backend cannot start (engine down,
            no bubblewrap).
    """
    if backend is None:
        settings = shared_settings()
        return shared(settings.backend, lambda: _make(settings.backend, settings))
    return shared(backend, lambda: _make(backend, shared_settings()))  # read only when one is made


def _make(backend: str, settings: ServerSettings) -> Any:
    if backend.startswith(("http://", "https://")):
        from sandbox_server.client import SandboxClient

        return SandboxClient(backend)
    if backend.startswith("ray:"):  # the Ray code is a plugin of the group: reached by name, never imported here
        from envs.sandbox import provider_for

        return provider_for(backend[4:] or "auto", name="ray", settings=settings)
    from sandbox_server.backends import make_backend
    from sandbox_server.service import SandboxService
    from sandbox_server.settings import ServiceConfig

    return SandboxService(make_backend(backend, settings=settings), ServiceConfig()).start(wait=False)


__all__ = ["close_shared_providers", "shared_provider", "shared_settings", "use_shared_settings"]
