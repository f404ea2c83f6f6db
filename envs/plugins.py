"""Plugins from installed packages: the entry-point groups of forkyard, loaded once, their failures named.

Every registry of forkyard takes plugins from one entry-point group (``forkyard.envs``, ``forkyard.backends``,
``forkyard.estimators``, ``forkyard.policies``, ``forkyard.collectors``): :class:`PluginGroup` loads a group once
and keeps why a plugin failed; :class:`PluginRegistry` is a registry by name (a dict) that loads its group on
first read. The env registry is Gymnasium's own (:mod:`envs.registry`), so its group is a bare
:class:`PluginGroup` loaded when :mod:`envs` is imported. :func:`load_entry_point` loads one named entry point
(the sandbox provider factories of ``forkyard.sandbox_providers``) under the same rules.

The rules (field cases S52, S53):

* Built-ins win. A name registered before the group loads (forkyard's built-ins), or declared by forkyard's own
  distribution in the group, is never taken by another package: that package's entry point is refused (never
  imported) and the warning names the entry point, its package and the registration that stays. A name two
  other packages declare is refused for both. forkyard's own entry points load first and the others in order of
  name, so the outcome never depends on ``sys.path`` order or on the order entry points are found in.
* A plugin that replaces or removes an entry while it loads (a module that registers over a built-in when
  imported) is reported and the entry restored.
* Any failure of a plugin's import or registration is reported by plugin and distribution name and never stops
  forkyard: ``BaseException`` s included (``SystemExit``, ``GeneratorExit``, a plugin's own), except a real
  interrupt (exactly ``KeyboardInterrupt``, as Ctrl-C raises it), which is re-raised.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points, packages_distributions
from typing import Any

_plugin_log = logging.getLogger("forkyard.plugins")

#: The distribution whose entry points are built-ins.
OWN_DISTRIBUTION = "forkyard"
_MISSING = object()


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_of(ep: EntryPoint) -> str:
    """The name of the distribution that declares ``ep`` (``"an unknown package"`` when it has none)."""
    return getattr(getattr(ep, "dist", None), "name", None) or "an unknown package"


def is_own(ep: EntryPoint) -> bool:
    """Whether ``ep`` is declared by forkyard's own distribution (:data:`OWN_DISTRIBUTION`)."""
    return _normal(distribution_of(ep)) == OWN_DISTRIBUTION


@functools.cache
def _distribution_of_package(top: str) -> str:
    found = packages_distributions().get(top) or ([OWN_DISTRIBUTION] if top == __name__.partition(".")[0] else [])
    return " or ".join(sorted(set(found))) or "an unknown package"


def _origin(obj: Any, depth: int = 0) -> str | None:
    if isinstance(obj, str):
        return obj if ":" in obj else None
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}:{qualname}"
    for attr in ("fn", "setup", "entry_point") if depth < 2 else ():
        found = _origin(getattr(obj, attr, None), depth + 1)
        if found:
            return found
    return None


def describe(obj: Any) -> str:
    """``"module:name, from distribution"``: where a registered object comes from (a class, a function, or a
    record holding one as ``fn``, ``setup`` or ``entry_point``: a policy, an estimator, a Gymnasium spec), for
    the message of a refused plugin. Never raises."""
    origin = _origin(obj) or f"a {type(obj).__name__} of {type(obj).__module__}"
    top = origin.removeprefix(f"a {type(obj).__name__} of ").partition(":")[0].partition(".")[0]
    return f"{origin}, from {_distribution_of_package(top)}"


def _failure(exc: BaseException) -> str:
    """``"Type: message"`` of a plugin's failure; a real Ctrl-C (exactly ``KeyboardInterrupt``) is re-raised."""
    if type(exc) is KeyboardInterrupt:
        raise exc
    return f"{type(exc).__name__}: {exc}"


def _label(ep: EntryPoint, group: str) -> str:
    return f"the plugin {ep.name!r} of {group} ({ep.value}, from {distribution_of(ep)})"


def choose(group: str, name: str, eps: list[EntryPoint], holder: str | None = None,
           ) -> tuple[list[EntryPoint], list[str]]:
    """Which of ``eps`` (the entry points named ``name`` in ``group``) to load, and why each other one is refused.

    Args:
        group: the entry-point group. name: the entry points' name.
        eps: every entry point of that name, in any order.
        holder: what already holds ``name`` (:func:`describe`), or None when it is free.

    Returns:
        (the entry points to load: forkyard's own, or the only other one when the name is free and neither
        forkyard nor a second package declares it; the messages of the refused ones). Independent of the
        order of ``eps``. Never raises.
    """
    own = [ep for ep in eps if is_own(ep)]
    others = sorted((ep for ep in eps if not is_own(ep)), key=lambda ep: (_normal(distribution_of(ep)), ep.value))
    if holder is not None:
        why = f"{name!r} is already registered ({holder}), which stays"
    elif own:
        why = f"{name!r} is forkyard's own ({', '.join(ep.value for ep in own)}, from {OWN_DISTRIBUTION}), which stays"
    elif len(others) > 1:
        declared = "; ".join(f"{ep.value}, from {distribution_of(ep)}" for ep in others)
        why = f"{name!r} is declared by {len(others)} packages ({declared}): none is loaded, uninstall all but one"
    else:
        return others, []
    return own, [f"{_label(ep, group)} is refused: {why}" for ep in others]


def load_entry_point(group: str, eps: list[EntryPoint]) -> Any:
    """The object one of ``eps`` (the entry points of one name in ``group``, as found, in any order) names,
    loaded: the one :func:`choose` keeps (forkyard's own first); refused ones are logged (logger
    ``forkyard.plugins``, WARNING).

    Raises:
        ImportError: ``eps`` is empty, every one is refused, or the chosen one fails to load (any exception but
            a real Ctrl-C: the message names the plugin, its entry point and distribution).
    """
    if not eps:
        raise ImportError(f"no entry point to load in {group}")
    chosen, refused = choose(group, eps[0].name, eps)
    for message in refused:
        _plugin_log.warning("%s", message)
    if not chosen:
        raise ImportError("; ".join(refused))
    try:
        return chosen[0].load()
    except BaseException as exc:  # noqa: BLE001 - a broken plugin is reported, never fatal (Ctrl-C re-raised)
        raise ImportError(f"{_label(chosen[0], group)} failed to load: {_failure(exc)}") from exc


class PluginGroup:
    """The plugins of one entry-point group, loaded once, on the first :meth:`load_plugins` after
    :meth:`load_from`, by the rules of the module docstring (built-ins win; no failure is fatal).

    A plugin that fails to load or to register (an import error, any exception but a real Ctrl-C, a name taken,
    a wrong kind of object) is never raised: it is logged (logger ``forkyard.plugins``, WARNING) and kept in
    :attr:`plugin_errors` (plugin name -> message), whose text names the plugin, its group, entry point and
    package; :meth:`explain` adds it to the message of a failed lookup. Loading is thread-safe; registrations
    made while loading do not load again.
    """

    def __init__(self) -> None:
        self.group: str | None = None
        self.plugin_errors: dict[str, str] = {}
        self._add: Callable[[str, Any], None] | None = None
        self._entries: dict[str, Any] | None = None
        self._state = "off"  # off (no group yet) -> armed -> loading -> loaded
        self._lock = threading.RLock()

    def load_from(self, group: str, add: Callable[[str, Any], None],
                  entries: dict[str, Any] | None = None) -> None:
        """Arm the group: on the next :meth:`load_plugins`, ``add(name, obj)`` is called for every entry point of
        ``group`` that :func:`choose` keeps (``obj``: what the entry point names, loaded). ``add`` raises to refuse
        a plugin. ``entries``: the registry the plugins join (a dict of name -> registered object, e.g.
        Gymnasium's); its names at load time are the built-ins no plugin takes, and an entry a plugin replaces
        or removes is restored. Never raises."""
        self.group, self._add, self._state = group, add, "armed"
        if entries is not None:
            self._entries = entries

    def load_plugins(self) -> None:
        """Load the group's plugins now (once; a no-op afterwards, while loading and before :meth:`load_from`).
        Never raises but a real Ctrl-C."""
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

    def _report(self, name: str, message: str) -> None:
        old = self.plugin_errors.get(name)
        self.plugin_errors[name] = f"{old}; {message}" if old else message
        _plugin_log.warning("%s", message)

    def _holder(self, name: str) -> str | None:
        if self._entries is None:
            return None
        obj = dict.get(self._entries, name, _MISSING)  # never loads: no recursion
        return None if obj is _MISSING else describe(obj)

    def _load(self, group: str, add: Callable[[str, Any], None]) -> None:
        by_name: dict[str, list[EntryPoint]] = {}
        for ep in entry_points(group=group):
            by_name.setdefault(ep.name, []).append(ep)
        plan = []
        for name, eps in by_name.items():  # every choice made before any plugin is imported
            chosen, refused = choose(group, name, eps, self._holder(name))
            plan += [(not is_own(ep), name, distribution_of(ep), ep) for ep in chosen]
            for message in refused:
                self._report(name, message)
        for _, name, _, ep in sorted(plan, key=lambda p: p[:3]):  # forkyard's own first, then by name
            before = dict.copy(self._entries) if self._entries is not None else {}
            try:
                add(name, ep.load())
            except BaseException as exc:  # noqa: BLE001 - a broken plugin is reported, never fatal (Ctrl-C: raised)
                self._report(name, f"{_label(ep, group)} failed to load: {_failure(exc)}")
            self._restore(group, ep, before)

    def _restore(self, group: str, ep: EntryPoint, before: dict[str, Any]) -> None:
        """Put back what loading ``ep`` replaced or removed in the entries, and report it."""
        entries = self._entries
        if entries is None:
            return
        changed = [k for k, v in before.items() if dict.get(entries, k, _MISSING) is not v]
        if changed:
            dict.update(entries, {k: before[k] for k in changed})
            held = "; ".join(f"{k!r} ({describe(before[k])})" for k in changed)
            self._report(ep.name, f"{_label(ep, group)} replaced or removed {held} while loading: "
                                  "restored, the registration that was there stays")

    def explain(self, name: str) -> str:
        """``""``, or ``"; "`` and why the plugin ``name`` failed to load: for the message of a failed lookup."""
        self.load_plugins()
        return f"; {self.plugin_errors[name]}" if name in self.plugin_errors else ""


class PluginRegistry(dict, PluginGroup):  # type: ignore[type-arg]
    """A registry by name (a dict) that also holds the plugins of one entry-point group (a :class:`PluginGroup`),
    loaded on the first read after :meth:`load_from` (``[]``, ``in``, ``get``, iteration, ``len``, ``keys``,
    ``values``, ``items``), so entries registered by code and by installed packages are one list: the names
    registered before the group loads are built-ins, which no plugin takes. The backends, estimators, policies
    and collectors are such registries."""

    def __init__(self) -> None:
        dict.__init__(self)
        PluginGroup.__init__(self)

    def load_from(self, group: str, add: Callable[[str, Any], None],
                  entries: dict[str, Any] | None = None) -> None:
        """:meth:`PluginGroup.load_from`, whose ``entries`` are this registry's own. Never raises."""
        PluginGroup.load_from(self, group, add, self if entries is None else entries)

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


__all__ = ["OWN_DISTRIBUTION", "PluginGroup", "PluginRegistry", "choose", "describe", "distribution_of", "is_own",
           "load_entry_point"]
