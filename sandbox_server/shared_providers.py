"""The cache of sandbox providers shared by the envs of one process: kept, looked up, closed.

:mod:`sandbox_server.embedded` makes the providers (a backend's in-process service, a server's client, a Ray
cluster's) and keeps each here under its backend name; whoever must free them (interpreter exit, a Ray node
host shutting down: :meth:`ray_cluster.nodes.NodeHost.shutdown`) calls :func:`close_shared_providers`
without importing what makes them.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any, Callable

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


def shared(name: str, make: Callable[[], Any]) -> Any:
    """The provider kept under ``name``, made by ``make()`` (under the cache's lock) the first time.
    Raises what ``make`` raises (nothing is kept then)."""
    with _lock:
        if name not in _providers:
            _providers[name] = make()
        return _providers[name]


def close_shared_providers() -> None:
    """Close every provider kept here (their sandboxes are destroyed); a later call makes new ones. Runs at
    interpreter exit; call it earlier to free the sandboxes sooner."""
    with _lock:
        providers = list(_providers.values())
        _providers.clear()
    for provider in providers:
        provider.close()


def close_shared_provider(name: str) -> bool:
    """Close the provider kept under ``name`` (a later :func:`shared` makes a new one). Returns whether one
    was kept."""
    with _lock:
        provider = _providers.pop(name, None)
    if provider is not None:
        provider.close()
    return provider is not None


atexit.register(close_shared_providers)

__all__ = ["close_shared_provider", "close_shared_providers", "shared"]
