"""The catalog: what every registered forkyard env is, read from the registry (:mod:`envs.registry`) and the env
classes themselves, never from a second list.

:func:`catalog` describes each id as an :class:`EnvCard`: its entry point and default kwargs, the constructor's
settings (names, defaults and descriptions, from the signature and the Google-style ``Args:`` section of the class
docstring), its tools (the names of ``tool_schemas()`` of an env built with the defaults, when it can be built
without infrastructure), fork method (:attr:`envs.core.TextEnv.fork_method`), whether it runs in a sandbox
(:attr:`~envs.core.TextEnv.uses_sandbox`) and which optional features (:mod:`envs.features`) its class offers.
``forkyard envs`` prints it (a table, or ``--json``); a server lists the ids it serves from it
(``GET /v1/envs``, and OpenEnv's ``GET /openenv/list_environments``).

Never raises for an env that cannot be described: an env whose class needs a package that is not installed, or a
sandbox, or that fails to build, says so in :attr:`EnvCard.note`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium as gym

from envs.core import TextEnv
from envs.features import Demonstrator, EvaluationResets
from envs.registry import ForkyardSpec, env_spec, forkyard_specs

#: Constructor parameters that are no setting of the task: Gymnasium's rendering, and the sandbox service a
#: server passes in (an object, never JSON).
NOT_SETTINGS = frozenset({"render_mode", "sandbox_provider"})
#: Words of :attr:`EnvCard.note` for an env whose tools run in a sandbox (its tools are listed per session).
NEEDS_SANDBOX = "needs a sandbox"


@dataclass(frozen=True)
class Setting:
    """One constructor setting of an env.

    Attributes:
        name: the keyword.
        default: the registered default (the id's kwargs) or else the signature's default; None when there is
            neither (``required`` then says so). JSON-safe: a value JSON cannot hold is given as its ``repr``.
        required: the constructor has no default and the id registers none.
        doc: the description from the class docstring's ``Args:`` section ("" when it has none).
    """

    name: str
    default: Any
    required: bool
    doc: str


@dataclass(frozen=True)
class EnvCard:
    """What one registered env is (:func:`catalog`). Every field is JSON (:meth:`to_dict`).

    Attributes:
        env_id: the registered id.
        entry_point: the env class, ``"module:Class"``.
        kwargs: the registered default kwargs.
        summary: the first line of the env module's docstring (else the class's).
        settings: the constructor's settings (:class:`Setting`), in signature order, less :data:`NOT_SETTINGS`.
        max_turns: the turn budget of an env built with the defaults (else the ``max_turns`` setting's default; None
            when neither says).
        tools: the tool names of an env built with the defaults (None when unknown: see ``note``).
        fork_method: one of :data:`envs.core.FORK_METHODS` (the built env's, else the class's); None when the class
            cannot be imported.
        sandboxed: the env runs its tools in a sandbox (``uses_sandbox``).
        finite_actions: the class declares a finite ``action_vocabulary`` (:class:`envs.features.FiniteActions`);
            every env offers ``info["legal_actions"]``, a finite menu per turn, besides.
        demonstrator: the class offers ``demo_action`` (:class:`envs.features.Demonstrator`).
        evaluation_resets: the class declares its evaluation resets (:class:`envs.features.EvaluationResets`).
        note: "" or why something is unknown: ``"needs a sandbox"``, ``"needs package X"`` (an optional package,
            ``pip install 'forkyard[suite]'``), or the error that building the env raised.
    """

    env_id: str
    entry_point: str
    kwargs: dict[str, Any]
    summary: str = ""
    settings: list[Setting] = field(default_factory=list)
    max_turns: int | None = None
    tools: list[str] | None = None
    fork_method: str | None = None
    sandboxed: bool = False
    finite_actions: bool = False
    demonstrator: bool = False
    evaluation_resets: bool = False
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The card as plain JSON data (settings as dicts)."""
        return asdict(self)


def catalog(*, tools: bool = True) -> list[EnvCard]:
    """Every registered forkyard env (:func:`envs.registry.forkyard_specs`), described, in registration order.

    Args:
        tools: build each env that needs no infrastructure with its defaults to read its tool names (cached per
            entry point and kwargs for the life of the process); False reads the classes alone (no env is built:
            ``tools`` stays None), as a server's listing does.
    """
    return [describe(spec, tools=tools) for spec in forkyard_specs().values()]


def describe(spec: ForkyardSpec | str, *, tools: bool = True) -> EnvCard:
    """The :class:`EnvCard` of one registered env (a :class:`~envs.registry.ForkyardSpec` or an id).

    Raises:
        KeyError: an id that is not registered (:func:`envs.registry.env_spec`).
    """
    if isinstance(spec, str):
        spec = env_spec(spec)
    base = {"env_id": spec.env_id, "entry_point": spec.entry_point, "kwargs": _json_safe(spec.kwargs)}
    try:
        cls = _load_class(spec.entry_point)
    except ImportError as exc:
        return EnvCard(**base, note=_import_note(exc))
    except Exception as exc:  # noqa: BLE001 - a catalog describes, it never fails on one env
        return EnvCard(**base, note=f"cannot be imported: {type(exc).__name__}: {exc}")
    settings = _settings(cls, spec.kwargs)
    turns = next((s.default for s in settings if s.name == "max_turns"), None)
    card = EnvCard(
        **base, summary=_summary(cls), settings=settings, max_turns=turns if isinstance(turns, int) else None,
        fork_method=getattr(cls, "fork_method", None), sandboxed=bool(getattr(cls, "uses_sandbox", False)),
        finite_actions=hasattr(cls, "action_vocabulary"), demonstrator=issubclass(cls, Demonstrator),
        evaluation_resets=issubclass(cls, EvaluationResets),
        note=NEEDS_SANDBOX if getattr(cls, "uses_sandbox", False) else "")
    if not tools or card.sandboxed:
        return card
    names, fork_method, max_turns, note = _built(spec)
    return EnvCard(**{**asdict(card), "settings": settings, "tools": names, "note": note,
                      "fork_method": fork_method or card.fork_method,
                      "max_turns": max_turns if max_turns is not None else card.max_turns})


# ------------------------------------------------------------------------------------------ helpers
def _load_class(entry_point: str) -> type:
    module, _, name = entry_point.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, TextEnv)):
        raise TypeError(f"{entry_point} is not an envs.core.TextEnv subclass")
    return obj


def _import_note(exc: ImportError) -> str:
    missing = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and missing:
        return f"needs package {missing.split('.')[0]} (pip install 'forkyard[suite]')"
    return f"cannot be imported: {type(exc).__name__}: {exc}"


def _summary(cls: type) -> str:
    """The first sentence of the env module's docstring (else the class's), markup removed."""
    module = inspect.getmodule(cls)
    for doc in (getattr(module, "__doc__", None), cls.__doc__):
        paragraph = " ".join(inspect.cleandoc(doc or "").split("\n\n", 1)[0].split())
        end = re.search(r"\.(\s|$)", paragraph)
        if paragraph:
            return plain(paragraph[: end.end()].strip() if end else paragraph)
    return ""


_ARG = re.compile(r"^(\s*)(\*{0,2}\w+)(?:\s*\([^)]*\))?:\s*(.*)$")
_ROLE = re.compile(r":\w+:`~?([^`]+)`")


def plain(text: str) -> str:
    """Docstring markup as plain text: ``:class:`~a.b.C``` -> ``C`` (a role's last dotted part when ``~``, else
    its target), double backquotes dropped."""
    text = _ROLE.sub(lambda m: m[1].rsplit(".", 1)[-1] if m[0].split("`")[1].startswith("~") else m[1], text)
    return text.replace("``", "")


def arg_docs(doc: str | None) -> dict[str, str]:
    """``{name: description}`` from the ``Args:`` section of a Google-style docstring (continuation lines
    joined; an empty dict when there is none)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    out: dict[str, str] = {}
    inside, indent, current = False, None, None
    for line in lines:
        if not inside:
            inside = line.strip() in ("Args:", "Arguments:", "Parameters:")
            continue
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:  # the next section (Raises:, Returns:, prose)
            break
        match = _ARG.match(line)
        if match and (indent is None or depth == indent):
            indent, current = depth, match[2].lstrip("*")
            out[current] = match[3].strip()
        elif current is not None:
            out[current] = f"{out[current]} {line.strip()}".strip()
    return out


def _settings(cls: type, registered: dict[str, Any]) -> list[Setting]:
    docs = {**arg_docs(getattr(getattr(cls, "__init__", None), "__doc__", None)), **arg_docs(cls.__doc__)}
    out = []
    for name, param in inspect.signature(cls).parameters.items():
        if name in NOT_SETTINGS or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in registered:
            default, required = registered[name], False
        elif param.default is param.empty:
            default, required = None, True
        else:
            default, required = param.default, False
        out.append(Setting(name, _json_safe(default), required, plain(docs.get(name, ""))))
    return out


def _json_safe(value: Any) -> Any:
    """``value`` if JSON holds it as it is (tuples as lists), else its ``repr``."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


_built_cache: dict[str, tuple[list[str] | None, str | None, int | None, str]] = {}
_built_lock = threading.Lock()


def _built(spec: ForkyardSpec) -> tuple[list[str] | None, str | None, int | None, str]:
    """(tool names, fork method, turn budget, note) of ``spec``'s env built with its defaults (cached): what the
    instance says, which may differ from its class (an adapter picks its fork method per wrapped env)."""
    key = f"{spec.entry_point} {json.dumps(_json_safe(spec.kwargs), sort_keys=True)}"
    with _built_lock:
        if key in _built_cache:
            return _built_cache[key]
    names: list[str] | None = None
    fork_method: str | None = None
    max_turns: int | None = None
    note = ""
    env: Any = None
    try:
        env = _load_class(spec.entry_point)(**spec.kwargs)
        fork_method, max_turns = getattr(env, "fork_method", None), getattr(env, "max_turns", None)
        if not callable(getattr(env, "tool_schemas", None)):  # the ToolSchemas feature, or a class that unset it
            names, note = [], "declares no tool schemas"
        else:
            try:
                schemas = env.tool_schemas()
            except gym.error.ResetNeeded:  # tools that depend on the episode: those of the seed-0 episode
                env.reset(seed=0)
                schemas = env.tool_schemas()
            names = [t["function"]["name"] for t in schemas]
    except ImportError as exc:
        note = _import_note(exc)
    except Exception as exc:  # noqa: BLE001 - a catalog describes, it never fails on one env
        note = f"cannot be built with its defaults: {type(exc).__name__}: {exc}"
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass
    with _built_lock:
        _built_cache[key] = (names, fork_method, max_turns, note)
    return names, fork_method, max_turns, note


def catalog_table(cards: list[EnvCard]) -> str:
    """``cards`` as a Markdown table: id, tools, settings (defaults), turn budget, fork method, sandboxed, and the
    features (finite action vocabulary, demonstrator, evaluation resets); notes below the table."""
    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    rows = ["| id | tools | settings (defaults) | turns | fork | sandboxed | vocabulary | demonstrator | eval resets |",
            "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for c in cards:
        tools = ", ".join(c.tools) if c.tools is not None else f"({c.note})" if c.note else "(not built)"
        settings = ", ".join(f"{s.name}=REQUIRED" if s.required else f"{s.name}={json.dumps(s.default)}"
                             for s in c.settings if s.name != "max_turns")
        rows.append(f"| {c.env_id} | {tools} | {settings} | {c.max_turns if c.max_turns is not None else ''} | "
                    f"{c.fork_method or '?'} | {yes(c.sandboxed)} | {yes(c.finite_actions)} | {yes(c.demonstrator)} | "
                    f"{yes(c.evaluation_resets)} |")
        if c.note and c.tools is not None or c.note and c.fork_method is None:
            notes.append(f"{c.env_id}: {c.note}")
    return "\n".join(rows + ([""] + notes if notes else []))


__all__ = ["NEEDS_SANDBOX", "NOT_SETTINGS", "EnvCard", "Setting", "arg_docs", "catalog", "catalog_table",
           "describe", "plain"]
