"""forkyard environments: multi-turn text envs with fork, snapshot and restore, registered with Gymnasium.

After ``import envs``, ``gymnasium.make("forkyard/ClueProbe-v0", max_turns=5)`` works; the form
``gymnasium.make("envs:forkyard/ClueProbe-v0")`` imports this package itself.

Envs from installed packages (plugins) join through the entry-point group ``forkyard.envs``: an entry
``"ns/Name-v0" = "module:Class"`` registers that TextEnv class under the entry's name; an entry naming any
other callable calls it once, to register what it will (:func:`register_env`). They are loaded when this
package is imported (Gymnasium's registry, which ``gymnasium.make`` reads, has no hook for a later load), so
an env plugin's module imports ``envs`` only. :class:`PluginRegistry` is the same mechanism for every
registry of forkyard (backends, estimators, policies), which load their groups on first lookup.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from gymnasium.envs.registration import register, registry

from envs.actions import ActionParseError, ToolCall, format_action, parse_action
from envs.checks import check_fork_contract
from envs.core import (
    INFRA_FAILURE_REASONS,
    TERMINATION_REASONS,
    EnvInfraError,
    EpisodeFinishedError,
    IllegalActionError,
    Snapshot,
    TextEnv,
)
from envs.features import Demonstrator, EvaluationResets, FiniteActions
from envs.remote import RemoteEnv, env_factory
from envs.remote_vector import RemoteVectorEnv
from envs.text_space import TextSpace, fit_text

_plugin_log = logging.getLogger("forkyard.plugins")


class PluginRegistry(dict):
    """A registry by name (a dict) that also holds the plugins of one entry-point group, loaded once, on
    the first read after :meth:`load_from` (``[]``, ``in``, ``get``, iteration, ``len``, ``keys``,
    ``values``, ``items``), so entries registered by code and by installed packages are one list.

    A plugin that fails to load or to register (an import error, a name taken, a wrong kind of object) is
    never raised: it is logged (logger ``forkyard.plugins``, WARNING) and kept in :attr:`plugin_errors`,
    whose text names the plugin, its group, entry point and package; :meth:`explain` adds it to the
    message of a failed lookup. Loading is thread-safe; registrations made while loading read the
    registry without loading again.
    """

    def __init__(self) -> None:
        super().__init__()
        self.group: str | None = None
        self.plugin_errors: dict[str, str] = {}
        self._add: Callable[[str, Any], None] | None = None
        self._state = "off"  # off (no group yet) -> armed -> loading -> loaded
        self._lock = threading.RLock()

    def load_from(self, group: str, add: Callable[[str, Any], None]) -> None:
        """Arm the registry: on first read, ``add(name, obj)`` is called for every entry point of ``group``
        (``obj``: what the entry point names, loaded). ``add`` raises to refuse a plugin."""
        self.group, self._add, self._state = group, add, "armed"

    def load_plugins(self) -> None:
        """Load the group's plugins now (once; a no-op afterwards, while loading and before :meth:`load_from`)."""
        if self._state != "armed":
            return
        with self._lock:
            if self._state != "armed":
                return
            self._state = "loading"
            try:
                for ep in entry_points(group=self.group):
                    try:
                        self._add(ep.name, ep.load())
                    except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, never fatal
                        dist = getattr(getattr(ep, "dist", None), "name", None) or "an unknown package"
                        self.plugin_errors[ep.name] = (f"the plugin {ep.name!r} of {self.group} ({ep.value}, from "
                                                       f"{dist}) failed to load: {type(exc).__name__}: {exc}")
                        _plugin_log.warning("%s", self.plugin_errors[ep.name])
            finally:
                self._state = "loaded"

    def explain(self, name: str) -> str:
        """``""``, or ``"; "`` and why the plugin ``name`` failed to load: for the message of a failed lookup."""
        self.load_plugins()
        return f"; {self.plugin_errors[name]}" if name in self.plugin_errors else ""

    def __getitem__(self, key: Any) -> Any:
        self.load_plugins()
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.load_plugins()
        return super().__contains__(key)

    def __iter__(self):
        self.load_plugins()
        return super().__iter__()

    def __len__(self) -> int:
        self.load_plugins()
        return super().__len__()

    def get(self, key: Any, default: Any = None) -> Any:
        self.load_plugins()
        return super().get(key, default)

    def keys(self):
        self.load_plugins()
        return super().keys()

    def values(self):
        self.load_plugins()
        return super().values()

    def items(self):
        self.load_plugins()
        return super().items()


#: Every env id forkyard serves, with the entry point (``"module:Class"``, a TextEnv) and its default kwargs.
#: Filled by :func:`register_env` only (plugins of ``forkyard.envs`` included).
ENV_SPECS: PluginRegistry = PluginRegistry()


def register_env(env_id: str, entry_point: str, **kwargs: object) -> None:
    """Register a TextEnv under ``env_id``: the one registration a new env needs.

    Afterwards ``gymnasium.make(env_id, **kw)`` builds it in-process, ``gymnasium.make(env_id,
    server_url=...)`` builds a :class:`RemoteEnv` for it, and every forkyard server started in this
    process serves it under ``/v1/envs``. ``entry_point`` is ``"module:Class"``; ``kwargs`` are defaults.

    Raises:
        ValueError: ``env_id`` is already registered with another entry point or other defaults.
    """
    if env_id in ENV_SPECS and ENV_SPECS[env_id] != (entry_point, kwargs):
        raise ValueError(f"env id {env_id!r} is already registered as {ENV_SPECS[env_id]}")
    if env_id not in registry:
        # The entry point builds the local env, or a RemoteEnv when given server_url=...
        register(id=env_id, entry_point=env_factory(entry_point, env_id), kwargs=dict(kwargs))
    ENV_SPECS[env_id] = (entry_point, dict(kwargs))


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


register_env("forkyard/ClueProbe-v0", "envs.clueprobe:ClueProbeEnv", max_turns=5, bits=3)
register_env("forkyard/FileQA-v0", "envs.fileqa:FileQAEnv", max_turns=6)
ENV_SPECS.load_from("forkyard.envs", _add_env_plugin)
ENV_SPECS.load_plugins()  # now: gymnasium.make reads Gymnasium's registry, which cannot load on lookup

__all__ = [
    "ENV_SPECS",
    "INFRA_FAILURE_REASONS",
    "TERMINATION_REASONS",
    "ActionParseError",
    "Demonstrator",
    "EnvInfraError",
    "EpisodeFinishedError",
    "EvaluationResets",
    "FiniteActions",
    "IllegalActionError",
    "PluginRegistry",
    "RemoteEnv",
    "RemoteVectorEnv",
    "Snapshot",
    "TextEnv",
    "TextSpace",
    "ToolCall",
    "check_fork_contract",
    "fit_text",
    "format_action",
    "parse_action",
    "register_env",
]
