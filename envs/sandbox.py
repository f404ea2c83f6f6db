"""What a sandbox-backed env needs from a sandbox service: the :class:`SandboxProvider` protocol and the two
errors a provider may raise. Envs receive a provider; they never know which service or backend is behind it.

A provider is passed to the env (``sandbox_provider=``; a server passes its own service, so every env
session it serves runs on the server's backend), or named by a backend string and looked up through
:func:`provider_for`. forkyard's implementations live in ``sandbox_server``: ``SandboxService`` (in-process)
and ``SandboxClient`` (a server over HTTP). Any object with these methods works, in the manner of
Gymnasium's duck-typed spaces: an env author who brings another sandbox (a VM, a remote runtime) writes
an adapter, not a subclass.

Errors: a provider raises :class:`SandboxRefusal` (or a subclass) when it refuses a tool call and nothing
ran (the env turns it into an invalid-action observation), and :class:`SandboxFailure` (or a subclass)
when the sandbox or its service failed (the env ends the episode as ``infra_error``).
"""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Any, Protocol, Sequence, runtime_checkable

from envs.plugins import load_entry_point


class SandboxFailure(RuntimeError):
    """The sandbox or its service failed (engine down, pool exhausted, agent died); not the action's fault."""


class SandboxRefusal(ValueError):
    """The provider refused a tool call (a tool off the whitelist, a bad argument or path); nothing ran."""


@runtime_checkable
class SandboxProvider(Protocol):
    """The sandbox service an env takes sandboxes from. Sandbox ids are opaque strings; times in seconds.

    Results are duck-typed: ``create`` and ``fork`` return objects with an ``id``; ``exec`` returns an object
    with ``status`` (``"ok"``, ``"error"``, ``"timeout"``), ``stdout``, ``stderr`` (str), ``exit_code``
    (int or None), ``truncated`` (bool), ``message`` (str) and ``sandbox_replaced`` (bool: the sandbox
    failed and was replaced, so the episode's state is gone); ``tools`` returns objects with ``name`` and
    ``params`` (ordered parameter names). ``sandbox_server.tools.ToolResult`` and ``ToolSpec`` are such objects.
    """

    #: What the sandboxes run on, for humans and snapshot checks: ``"local"``, ``"docker"``, or a server URL.
    name: str

    def create(self, *, files: dict[str, bytes] | None = None, archive: bytes | None = None) -> Any:
        """A new sandbox, optionally with per-episode ``files`` under /scratch (path -> bytes) or rebuilt
        from an ``archive`` made by ``export``. Raises SandboxFailure (or SandboxRefusal for bad files). A provider
        that offers opt-in tool families also takes ``families`` (a list of names: forkyard's ``workspace``);
        only envs that need them pass it."""

    def exec(self, sandbox_id: str, tool: str, args: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Run one whitelisted tool call with a deadline of ``timeout_s`` seconds."""

    def fork(self, sandbox_id: str, n: int) -> Sequence[Any]:
        """``n`` independent copies of a sandbox (all or none)."""

    def delete(self, sandbox_id: str) -> None:
        """Release a sandbox."""

    def tools(self) -> Sequence[Any]:
        """The tool whitelist (objects with ``name`` and ``params``)."""

    def data_dir(self) -> str:
        """A host folder holding the same files as the sandboxes' read-only ``/data`` (for generating
        questions from them). Raises SandboxFailure when it cannot be had."""


@runtime_checkable
class ExportingProvider(SandboxProvider, Protocol):
    """A provider that can export a sandbox's writable areas (so env snapshots carry the sandbox)."""

    def export(self, sandbox_id: str) -> bytes:
        """A tar of the sandbox's writable areas, for ``create(archive=...)``."""


#: The entry-point group of the function that turns a backend name or a server URL into a provider shared by
#: the envs of this process; :func:`provider_for` takes its entry named ``default`` (forkyard declares one in
#: ``pyproject.toml``; another package may declare its own under another name and be chosen by ``name=``).
PROVIDER_GROUP = "forkyard.sandbox_providers"


def provider_for(backend: str | None, name: str = "default", **options: Any) -> SandboxProvider:
    """The provider of ``backend`` (a registered backend name such as ``"local"``, a server URL, or None for
    the factory's default), made by the factory ``name`` of :data:`PROVIDER_GROUP` and shared by every env of
    this process. ``options``: keywords of that factory, passed on (forkyard's ``ray`` takes the server's
    ``settings``); an env passes none.

    Raises:
        SandboxFailure: the backend cannot start. ValueError: an unknown backend name. TypeError: ``options``
            the factory does not take.
        ImportError: no factory of that name is installed (``pip install forkyard[server]``), it cannot be
            imported (any exception of its import, named with its distribution), or it is refused (several
            packages declare the name and none is forkyard: :func:`envs.plugins.choose`).
    """
    return _factory(name)(backend, **options)


@functools.cache
def _factory(name: str):
    """The factory ``name`` of :data:`PROVIDER_GROUP`, looked up once per process (a scan of the installed
    packages' entry points costs tens of milliseconds): forkyard's own wins over another package's of the same
    name, whatever ``sys.path`` order (field case S52, :func:`envs.plugins.load_entry_point`)."""
    found = [ep for ep in importlib.metadata.entry_points(group=PROVIDER_GROUP) if ep.name == name]
    if not found:
        raise ImportError(f"no sandbox provider factory {name!r} in the entry-point group {PROVIDER_GROUP!r}: "
                          "install forkyard with its server extra (pip install 'forkyard[server]')")
    return load_entry_point(PROVIDER_GROUP, found)


__all__ = ["ExportingProvider", "PROVIDER_GROUP", "SandboxFailure", "SandboxProvider", "SandboxRefusal",
           "provider_for"]
