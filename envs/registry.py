"""forkyard's env registry is Gymnasium's: a forkyard env is a Gymnasium ``EnvSpec`` whose entry point is an
:class:`envs.remote.EnvFactory` (the one :func:`register_env` puts there), which carries the env's own entry point
(``"module:Class"``, a :class:`~envs.core.TextEnv`) and builds either that class or, given ``server_url``, a
:class:`~envs.remote.RemoteEnv`. The spec's ``kwargs`` are the env's defaults.

Every reader asks here: :func:`forkyard_specs` (every forkyard id, in registration order) and :func:`env_spec` (one
id), so ``gymnasium.make``, the server (``/v1/envs``, ``/openenv``), the trainers and the catalog
(:func:`envs.catalog.catalog`) see one list. Envs from installed packages join through the entry-point group
``forkyard.envs`` (:data:`ENV_PLUGINS`, loaded by :func:`load_env_plugins` when :mod:`envs` is imported):
an entry ``"ns/Name-v0" = "module:Class"`` registers that TextEnv class under the entry's name; an entry naming
any other callable calls it once, to register what it will.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gymnasium.envs.registration import EnvSpec, register, registry

from envs.core import TextEnv
from envs.plugins import PluginGroup
from envs.remote import EnvFactory, env_factory
from envs.suite import SUITE

#: The entry-point group of env plugins.
ENV_PLUGIN_GROUP = "forkyard.envs"
#: The env plugins of installed packages: loaded once (:func:`load_env_plugins`); ``plugin_errors`` says which
#: failed and why (a plugin that fails is logged and named, never fatal).
ENV_PLUGINS = PluginGroup()


class ForkyardSpec(NamedTuple):
    """One registered forkyard env: what Gymnasium's ``EnvSpec`` of the id holds, read as forkyard's.

    Attributes:
        env_id: the id (``"forkyard/ClueProbe-v0"``).
        entry_point: the env class as ``"module:Class"`` (a :class:`~envs.core.TextEnv` subclass).
        kwargs: the registered default constructor kwargs (a copy: changing it changes nothing registered).
    """

    env_id: str
    entry_point: str
    kwargs: dict[str, Any]


def as_forkyard_spec(spec: EnvSpec) -> ForkyardSpec | None:
    """``spec`` read as a forkyard env's (its entry point an :class:`~envs.remote.EnvFactory`), or None for any
    other Gymnasium env."""
    factory = spec.entry_point
    if not isinstance(factory, EnvFactory):
        return None
    return ForkyardSpec(spec.id, factory.entry_point, dict(spec.kwargs))


def forkyard_specs() -> dict[str, ForkyardSpec]:
    """Every forkyard env in Gymnasium's registry (built-in, the suite, plugins, and any registered since by
    :func:`register_env`), by id, in registration order."""
    ENV_PLUGINS.load_plugins()
    found = (as_forkyard_spec(spec) for spec in list(registry.values()))
    return {s.env_id: s for s in found if s is not None}


def env_spec(env_id: str) -> ForkyardSpec:
    """The registered forkyard env ``env_id`` (an id as registered: no ``module:`` prefix).

    Raises:
        KeyError: ``env_id`` is no forkyard env; the message lists the registered ids and, when a plugin of that
            name failed to load, why.
    """
    ENV_PLUGINS.load_plugins()
    spec = registry.get(env_id)
    found = as_forkyard_spec(spec) if spec is not None else None
    if found is None:
        raise KeyError(f"unknown env id {env_id!r}; registered: {sorted(forkyard_specs())}"
                       f"{ENV_PLUGINS.explain(env_id)}")
    return found


def register_env(env_id: str, entry_point: str, **kwargs: object) -> None:
    """Register a TextEnv under ``env_id`` in Gymnasium's registry: the one registration a new env needs.

    Afterwards ``gymnasium.make(env_id, **kw)`` builds it in-process, ``gymnasium.make(env_id,
    server_url=...)`` builds a :class:`~envs.remote.RemoteEnv` for it, every forkyard server serves it under
    ``/v1/envs`` and ``/openenv``, and ``forkyard envs`` lists it. ``entry_point`` is ``"module:Class"`` (imported
    only when the env is made); ``kwargs`` are defaults, JSON values. Registering the same id again with the same
    entry point and defaults is a no-op.

    Raises:
        ValueError: ``env_id`` is already registered with another entry point or other defaults, or by another
            package as a Gymnasium env that is not forkyard's.
    """
    existing = registry.get(env_id)
    if existing is not None:
        known = as_forkyard_spec(existing)
        if known is None:
            raise ValueError(f"env id {env_id!r} is already registered with Gymnasium as another package's env "
                             f"(entry point {existing.entry_point!r})")
        if (known.entry_point, known.kwargs) != (entry_point, kwargs):
            raise ValueError(f"env id {env_id!r} is already registered as {known.entry_point} with {known.kwargs}")
        return
    register(id=env_id, entry_point=env_factory(entry_point, env_id), kwargs=dict(kwargs))


def _add_env_plugin(name: str, obj: Any) -> None:
    """A ``forkyard.envs`` entry point: a TextEnv class registered as ``name``, or a callable that registers."""
    if isinstance(obj, type):
        if not issubclass(obj, TextEnv):
            raise TypeError(f"{obj.__module__}:{obj.__qualname__} is not an envs.core.TextEnv subclass")
        register_env(name, f"{obj.__module__}:{obj.__qualname__}")
    elif callable(obj):
        obj()
    else:
        raise TypeError(f"names a {type(obj).__name__}, neither a TextEnv class nor a callable that registers")


def register_builtin_envs() -> None:
    """Register forkyard's own envs: ClueProbe, FileQA and the suite (:data:`envs.suite.SUITE`). Idempotent."""
    register_env("forkyard/ClueProbe-v0", "envs.clueprobe:ClueProbeEnv", max_turns=5, bits=3)
    register_env("forkyard/FileQA-v0", "envs.fileqa:FileQAEnv", max_turns=6)
    for suite_id, suite_entry, suite_kwargs in SUITE:  # the field's benchmarks (envs/suite/)
        register_env(suite_id, suite_entry, **suite_kwargs)


def load_env_plugins() -> None:
    """Load the ``forkyard.envs`` plugins now (once). :mod:`envs` calls it last when imported: Gymnasium's
    registry, which ``gymnasium.make`` reads, cannot load on lookup, and a plugin's module imports :mod:`envs`."""
    if ENV_PLUGINS.group is None:
        ENV_PLUGINS.load_from(ENV_PLUGIN_GROUP, _add_env_plugin, registry)  # its ids: built-ins, kept (S52)
    ENV_PLUGINS.load_plugins()


__all__ = ["ENV_PLUGINS", "ENV_PLUGIN_GROUP", "ForkyardSpec", "as_forkyard_spec", "env_spec", "forkyard_specs",
           "load_env_plugins", "register_builtin_envs", "register_env"]
