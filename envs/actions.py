"""The one action format of every forkyard env: a tool call written as a function call.

Grammar (a subset of Python call syntax, parsed with :mod:`ast`, never evaluated)::

    action    := NAME "(" [argument ("," argument)*] ")"
    argument  := literal | NAME "=" literal
    literal   := string ('..' or "..", with Python escapes) | integer | float | True | False | None

Examples: ``probe(2)``, ``answer(5)``, ``cat("Lib/os.py")``, ``grep(pattern="def main", path=".")``.
Whitespace around tokens is ignored; the canonical spelling produced by :func:`format_action`
(``name(arg, key=value)`` with ``repr`` literals) is what ``info["legal_actions"]`` lists.
:func:`canonical_text` gives any spelling's canonical text, and :func:`is_legal_action` compares an action
with ``legal_actions`` through it (field case S43): every component that asks whether an action is legal
asks the env's parser, never string equality.
"""

from __future__ import annotations

import ast
import threading
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, cast, overload

#: Longest action text accepted, in characters.
MAX_ACTION_CHARS = 4096
_PARSE_LOCK = threading.Lock()


@overload
def parse_python(text: str, mode: Literal["exec"] = "exec") -> ast.Module: ...
@overload
def parse_python(text: str, mode: Literal["eval"]) -> ast.Expression: ...
def parse_python(text: str, mode: str = "exec") -> ast.AST:
    """:func:`ast.parse` of ``text`` (``mode`` ``"exec"`` or ``"eval"``) under one process-wide lock.

    CPython 3.11 keeps the AST constructor's recursion depth in interpreter state shared by every thread; two
    threads parsing at once can end one parse with ``SystemError: AST constructor recursion depth mismatch``
    (CPython gh-106905; seen here when a Ray collector's FileQA envs read the corpus at once). Every parse
    forkyard does (actions, corpus facts, puzzle expressions) goes through this function. Raises what
    :func:`ast.parse` raises: ``SyntaxError``, ``ValueError`` (NUL bytes), ``RecursionError``, ``MemoryError``.
    """
    with _PARSE_LOCK:
        return ast.parse(text, mode=mode)

Scalar = str | int | float | bool | None


class ActionParseError(ValueError):
    """The action text is not a tool call in forkyard's format; the message says why and how to fix it."""


@dataclass(frozen=True)
class ToolCall:
    """A parsed action: tool ``name`` with positional ``args`` and keyword ``kwargs`` (name, value) pairs."""

    name: str
    args: tuple[Scalar, ...] = ()
    kwargs: tuple[tuple[str, Scalar], ...] = field(default=())

    @property
    def kwargs_dict(self) -> dict[str, Scalar]:
        return dict(self.kwargs)

    def text(self) -> str:
        """The canonical action text of this call (see :func:`format_action`)."""
        return format_action(self.name, *self.args, **dict(self.kwargs))


def format_action(name: str, /, *args: Scalar, **kwargs: Scalar) -> str:
    """Canonical action text: ``format_action("grep", "x", path=".")`` -> ``grep('x', path='.')``.

    ``name`` is positional-only, so a keyword argument may itself be called ``name`` (``find(name="*.py")``).
    """
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


FORMAT_HELP = (
    "Write one tool call as name(arguments), for example probe(0) or cat(\"notes.txt\") or "
    "grep(pattern=\"x\", path=\".\"); arguments are literals: quoted strings, numbers, True, False, None."
)


def _literal(node: ast.expr, where: str) -> Scalar:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.UAdd))
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) in (int, float)
    ):
        number = cast(int | float, node.operand.value)  # its type was checked just above
        return -number if isinstance(node.op, ast.USub) else number
    raise ActionParseError(f"{where} must be a literal (a quoted string, a number, True, False or None). {FORMAT_HELP}")


def parse_action(text: str) -> ToolCall:
    """Parse an action text into a :class:`ToolCall`. Results are cached (the same text parses once).

    Raises:
        ActionParseError: if ``text`` is not a ``str``, is longer than :data:`MAX_ACTION_CHARS`, or is not
            exactly one call of a bare tool name with literal arguments.
    """
    if not isinstance(text, str):
        raise ActionParseError(f"the action must be text, got {type(text).__name__}. {FORMAT_HELP}")
    return _parse_text(text)


@lru_cache(maxsize=8192)
def _parse_text(text: str) -> ToolCall:
    if len(text) > MAX_ACTION_CHARS:
        raise ActionParseError(f"the action is {len(text)} characters long; the limit is {MAX_ACTION_CHARS}.")
    if "\x00" in text:
        raise ActionParseError("the action contains a NUL character.")
    stripped = text.strip()
    if not stripped:
        raise ActionParseError(f"the action is empty. {FORMAT_HELP}")
    try:
        with warnings.catch_warnings():  # e.g. "1if" warns "invalid imaginary literal": the action is the
            warnings.simplefilter("ignore", SyntaxWarning)  # agent's text, not our code; errors still raise
            tree = parse_python(stripped, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        msg = getattr(exc, "msg", None) or type(exc).__name__
        raise ActionParseError(f"could not parse the action ({msg}). {FORMAT_HELP}") from None
    call = tree.body
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        raise ActionParseError(f"the action must be a single tool call such as name(...). {FORMAT_HELP}")
    args = tuple(_literal(a, f"argument {i + 1}") for i, a in enumerate(call.args))
    kwargs = []
    for kw in call.keywords:
        if kw.arg is None:
            raise ActionParseError(f"**arguments are not allowed. {FORMAT_HELP}")
        kwargs.append((kw.arg, _literal(kw.value, f"argument {kw.arg!r}")))
    return ToolCall(call.func.id, args, tuple(kwargs))


def canonical_text(text: str) -> str:
    """What an action text means to an env, in its one spelling: ``parse_action(text).text()``.

    ``ｐｒｏｂｅ(0)``, ``probe( 0 )``, ``probe(0x0)`` and ``probe((0))`` all give ``probe(0)`` (Python's reading of
    identifiers and literals), while ``probe(True)``, ``probe(0.0)`` and ``probe(k=0)`` stay distinct
    (``repr`` keeps the type and the keyword). An env's ``step`` binds a keyword of a declared tool to its
    parameter first (:func:`envs.action_input.read_action`: ``probe(k=0)`` runs as ``probe(0)``).

    Raises:
        ActionParseError: ``text`` is not an action (:func:`parse_action`).
    """
    return parse_action(text).text()


def is_legal_action(action: str, legal_actions: list[str] | tuple[str, ...]) -> bool:
    """Whether the action text ``action`` means one of ``legal_actions`` (``info["legal_actions"]``) to the env:
    their :func:`canonical_text` forms are compared, never the strings (field case S43). Text that is no action
    is not legal; an entry of ``legal_actions`` that is no action matches nothing. A model's reply or a keyword
    call is read first as the env's ``step`` reads it by :func:`envs.action_input.is_legal` (field case S62)."""
    try:
        key = canonical_text(action)
    except ActionParseError:
        return False
    return key in _canonical_menu(tuple(legal_actions))


@lru_cache(maxsize=1024)
def _canonical_menu(legal_actions: tuple[str, ...]) -> frozenset[str]:
    menu = set()
    for a in legal_actions:
        try:
            menu.add(canonical_text(a))
        except ActionParseError:
            pass
    return frozenset(menu)


def bind_arguments(call: ToolCall, params: list[str]) -> dict[str, Any]:
    """Map a call's positional and keyword arguments onto the parameter names ``params`` (in order).

    Raises:
        ActionParseError: on too many positional arguments, an unknown keyword, or one given twice.
    """
    if len(call.args) > len(params):
        raise ActionParseError(
            f"{call.name}() takes at most {len(params)} argument(s) ({', '.join(params) or 'none'}), "
            f"got {len(call.args)}."
        )
    # Fewer positional arguments than parameters is fine: the rest come by keyword or default.
    bound: dict[str, Any] = dict(zip(params, call.args, strict=False))
    for key, value in call.kwargs:
        if key not in params:
            raise ActionParseError(
                f"{call.name}() has no argument {key!r}; its arguments are: {', '.join(params) or 'none'}."
            )
        if key in bound:
            raise ActionParseError(f"{call.name}() got argument {key!r} twice.")
        bound[key] = value
    return bound
