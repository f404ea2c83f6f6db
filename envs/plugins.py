"""Plugins from installed packages: the entry-point groups of forkyard, loaded once, their failures named.

Every registry of forkyard takes plugins from one entry-point group (``forkyard.envs``, ``forkyard.backends``,
``forkyard.estimators``, ``forkyard.policies``, ``forkyard.collectors``): :class:`PluginGroup` loads a group once
and keeps why a plugin failed; :class:`PluginRegistry` is a registry by name (a dict) that loads its group on
first read. The env registry is Gymnasium's own (:mod:`envs.registry`), so its group is a bare
:class:`PluginGroup` loaded when :mod:`envs` is imported.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

_plugin_log = logging.getLogger("forkyard.plugins")


class PluginGroup:
    """The plugins of one entry-point group, loaded once, on the first :meth:`load_plugins` after
    :meth:`load_from`.

    A plugin that fails to load or to register (an import error, a name taken, a wrong kind of object) is
    never raised: it is logged (logger ``forkyard.plugins``, WARNING) and kept in :attr:`plugin_errors`
    (plugin name -> message), whose text names the plugin, its group, entry point and package; :meth:`explain`
    adds it to the message of a failed lookup. Loading is thread-safe; registrations made while loading do not
    load again.
    """

    def __init__(self) -> None:
        self.group: str | None = None
        self.plugin_errors: dict[str, str] = {}
        self._add: Callable[[str, Any], None] | None = None
        self._state = "off"  # off (no group yet) -> armed -> loading -> loaded
        self._lock = threading.RLock()

    def load_from(self, group: str, add: Callable[[str, Any], None]) -> None:
        """Arm the group: on the next :meth:`load_plugins`, ``add(name, obj)`` is called for every entry point of
        ``group`` (``obj``: what the entry point names, loaded). ``add`` raises to refuse a plugin."""
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
                if self.group is not None and self._add is not None:
                    self._load(self.group, self._add)
            finally:
                self._state = "loaded"

    def _load(self, group: str, add: Callable[[str, Any], None]) -> None:
        for ep in entry_points(group=group):
            try:
                add(ep.name, ep.load())
            except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, never fatal
                dist = getattr(getattr(ep, "dist", None), "name", None) or "an unknown package"
                self.plugin_errors[ep.name] = (f"the plugin {ep.name!r} of {group} ({ep.value}, from {dist}) "
                                               f"failed to load: {type(exc).__name__}: {exc}")
                _plugin_log.warning("%s", self.plugin_errors[ep.name])

    def explain(self, name: str) -> str:
        """``""``, or ``"; "`` and why the plugin ``name`` failed to load: for the message of a failed lookup."""
        self.load_plugins()
        return f"; {self.plugin_errors[name]}" if name in self.plugin_errors else ""


class PluginRegistry(dict, PluginGroup):  # type: ignore[type-arg]
    """A registry by name (a dict) that also holds the plugins of one entry-point group (a :class:`PluginGroup`),
    loaded on the first read after :meth:`load_from` (``[]``, ``in``, ``get``, iteration, ``len``, ``keys``,
    ``values``, ``items``), so entries registered by code and by installed packages are one list. The backends,
    estimators, policies and collectors are such registries."""

    def __init__(self) -> None:
        dict.__init__(self)
        PluginGroup.__init__(self)

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


__all__ = ["PluginGroup", "PluginRegistry"]
