"""Command lines generated from dataclass configs: each setting is declared once, as a dataclass field.

A config is a plain dataclass whose fields are declared with :func:`setting` (a
:func:`dataclasses.field` whose metadata holds the help text and, where needed, the flag name, aliases,
choices and command-line groups). :func:`add_arguments` turns the fields into ``argparse`` options and
:func:`from_args` builds the config back from the parsed namespace. The parser's defaults are
``argparse.SUPPRESS``, so an option that is not given never reaches the config: every default lives in
the dataclass and nowhere else, and every option the parser accepts is a field of the config it builds.

Why not ``tyro``: the ``forkyard`` command line is an ``argparse`` tree of subcommands (``serve`` and
``bench`` pass their arguments through untouched), its flag names are public (``--env``, ``--server``,
repeated ``--env-kwarg KEY=VALUE``, ``--drop-zero-variance`` as a plain switch) and must keep working,
and the configs need only ``int``, ``float``, ``str``, ``bool``, optionals, ``tuple`` and a ``dict`` of
JSON values. About a hundred lines here cover that without a new dependency (tyro would bring four)
and without re-declaring any default.

How a field becomes an option (``name`` -> ``--name`` with ``_`` written ``-`` unless ``flag`` says
otherwise):

* ``int``, ``float``, ``str`` (and ``X | None``): one value of that type (``parse`` overrides the type);
* ``bool``: ``--name`` / ``--no-name`` (``argparse.BooleanOptionalAction``);
* ``tuple[X, ...]``: one or more values;
* ``dict[str, Any]``: repeated ``KEY=VALUE``, each value parsed as JSON when it parses, else kept as text;
* ``positional=True``: a positional argument taking one or more values (a ``list``/``tuple`` field).

A subclass may redeclare a field with another default (the text policy's ``lr`` is not the tabular
one); its help and flag are taken from the nearest class in the MRO that gives them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

_META = "forkyard"
_GIVEN = "_forkyard_given"  # the attribute from_args leaves on a config: the fields given


def setting(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING,
            flag: str | None = None, aliases: tuple[str, ...] = (),
            choices: Iterable | Callable[[], Iterable] | None = None, parse: Callable[[str], Any] | None = None,
            group: str = "", positional: bool = False, cli: bool = True, metavar: str | None = None) -> Any:
    """A dataclass field with its command-line description.

    Args:
        default, default_factory: as :func:`dataclasses.field`.
        help: one line for ``--help`` (the default is appended).
        flag: the option's name (default ``--`` + the field name with ``-`` for ``_``).
        aliases: more names for the same option (old spellings kept working).
        choices: allowed values, or a callable returning them (read when the parser is built, so a
            registry filled later is seen).
        parse: converts the command-line text (default: the field's type).
        group: a label that commands select fields by (:func:`add_arguments` ``groups``).
        positional: a positional argument (one or more values) instead of an option.
        cli: False keeps the field off the command line (set by code, e.g. ``progress``).
        metavar: shown in ``--help``.

    Returns:
        A :class:`dataclasses.Field` (typed ``Any`` so it can be a field's default).
    """
    meta = {"help": help, "flag": flag, "aliases": tuple(aliases), "choices": choices, "parse": parse,
            "group": group, "positional": positional, "cli": cli, "metavar": metavar}
    return dataclasses.field(default=default, default_factory=default_factory, metadata={_META: meta})


def _meta(cls: type, name: str) -> dict[str, Any]:
    """The :func:`setting` metadata of field ``name``: the nearest class of the MRO that declares it wins,
    key by key (a redeclared field without metadata keeps the base's help and flag)."""
    out: dict[str, Any] = {}
    for klass in cls.__mro__:
        f = getattr(klass, "__dataclass_fields__", {}).get(name)
        meta = f.metadata.get(_META) if f is not None else None
        if meta:
            for key, value in meta.items():
                out.setdefault(key, value)
    return out


def _key_value(text: str) -> tuple[str, Any]:
    """``"max_turns=5"`` -> ``("max_turns", 5)``: the value parsed as JSON when it parses, else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"needs KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _unwrap(tp: Any) -> tuple[Any, tuple]:
    """``X | None`` -> ``(X, args of X)``; otherwise ``(origin or type, args)``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _unwrap(rest[0])
    return typing.get_origin(tp) or tp, args


def cli_fields(
    cls: type, groups: Iterable[str] | None = None, names: Iterable[str] | None = None
) -> list[dataclasses.Field]:
    """The fields of dataclass ``cls`` that are on the command line, in declaration order: all of them, or
    those whose :func:`setting` ``group`` is in ``groups``, or those named in ``names``.

    Raises:
        ValueError: if ``names`` holds a name that is not a command-line field of ``cls``.
    """
    by_group = None if groups is None else set(groups)
    by_name = None if names is None else set(names)
    out = []
    for f in dataclasses.fields(cls):
        meta = _meta(cls, f.name)
        if not f.init or not meta.get("cli", True):
            continue
        if by_group is not None and meta.get("group", "") not in by_group:
            continue
        if by_name is not None and f.name not in by_name:
            continue
        out.append(f)
    if by_name is not None and by_name - {f.name for f in out}:
        raise ValueError(f"{cls.__name__} has no command-line fields {sorted(by_name - {f.name for f in out})}")
    return out


def add_arguments(parser: argparse.ArgumentParser, cls: type, groups: Iterable[str] | None = None,
                  names: Iterable[str] | None = None) -> None:
    """Add one option per command-line field of dataclass ``cls`` (see the module docstring), all of them or
    those selected by ``groups`` / ``names`` (:func:`cli_fields`).

    Every option's ``dest`` is its field name and its default ``argparse.SUPPRESS``, so
    :func:`from_args` sees exactly the options given.

    Raises:
        TypeError: for a field type this generator does not handle.
    """
    hints = typing.get_type_hints(cls)
    for f in cli_fields(cls, groups, names):
        meta = _meta(cls, f.name)
        origin, args = _unwrap(hints[f.name])
        choices = meta.get("choices")
        if callable(choices):
            choices = choices()
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        help_text = meta.get("help", "")
        if default not in (None, (), [], {}) and not meta.get("positional"):
            help_text += f" (default: {default})"
        kw: dict[str, Any] = {"help": help_text.replace("%", "%%"), "default": argparse.SUPPRESS}
        if meta.get("metavar"):
            kw["metavar"] = meta["metavar"]
        if choices is not None:
            kw["choices"] = list(choices)
        if origin is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif origin is dict:
            kw.update(action="append", type=_key_value, metavar=meta.get("metavar") or "KEY=VALUE")
        elif origin in (tuple, list):
            kw.update(nargs="+", type=meta.get("parse") or (args[0] if args else str))
        elif origin in (int, float, str):
            kw["type"] = meta.get("parse") or origin
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no command-line form for type {hints[f.name]!r}")
        if meta.get("positional"):
            kw.pop("default")
            parser.add_argument(f.name, **{k: v for k, v in kw.items() if k != "dest"})
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        parser.add_argument(flag, *meta.get("aliases", ()), dest=f.name, **kw)


def from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """An instance of dataclass ``cls`` from the options of :func:`add_arguments` that were given (plus
    ``overrides``); every other field keeps its declared default. Repeated ``KEY=VALUE`` options become a
    dict (the last value of a key wins), several values of a ``tuple`` field a tuple. The names given are
    kept on the instance (:func:`given_fields`)."""
    hints = typing.get_type_hints(cls)
    given: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init or not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        origin, _ = _unwrap(hints[f.name])
        if origin is dict:
            value = dict(value)
        elif origin is tuple:
            value = tuple(value)
        given[f.name] = value
    names = frozenset(given)
    given.update(overrides)
    cfg = cls(**given)
    object.__setattr__(cfg, _GIVEN, names)
    return cfg


def given_fields(cfg: Any) -> frozenset[str] | None:
    """The fields of ``cfg`` that its command line gave (:func:`from_args`; the ``overrides`` not counted), or
    None for a config built otherwise."""
    return getattr(cfg, _GIVEN, None)
