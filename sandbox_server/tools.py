"""The tool whitelist: every tool a sandbox may run, declared once as data.

A :class:`Tool` has a name, a description, JSON-schema'd arguments (in order: the env layer binds text
calls such as ``grep("x", path=".")`` with ``envs.actions.bind_arguments(call, tool.param_names)``)
and a builder that maps validated arguments to an argv. No shell ever runs: argv only.

Validation (:func:`validate_call`) happens once, before any backend sees the call, and refuses with
:class:`ToolRefused` (HTTP 422, nothing executed):

* unknown tools and unknown / missing / mistyped arguments;
* strings with a NUL byte, longer than :data:`MAX_ARG_CHARS`, or a path with a control character;
* paths that are absolute outside the readable roots (``/data``, ``/scratch``), or contain ``..``;
* option injection: paths and patterns never reach a tool where it would read them as an option
  (patterns go after ``-e``, paths after ``--``; a relative path that starts with anything but a letter,
  digit, ``_`` or ``.`` gets ``./`` in front, so ``find``'s start path ``!``, ``(`` or ``-name`` is a path,
  never an expression: field case S45);
* ``find`` takes only ``name`` / ``type`` / ``maxdepth``: there is no way to pass ``-exec`` & co.

Session environments (:func:`validate_session_env`) are an allow-list of locale, time-zone and display
variables: nothing that changes how programs load or run (``LD_*``, ``PATH``, ``PYTHON*``, ...).

The agent in the sandbox checks each path once more *on the sandbox's filesystem* (symlinks resolved,
component-wise containment) before it runs anything.

Tool families (:attr:`Tool.family`, shown by ``GET /v1/tools``; an env offers its own only): ``files`` (the tools
above: FileQA's) and ``sql`` (``list_tables``, ``describe``, ``query``, ``rows`` over ``/scratch/db.sqlite``:
Text-to-SQL's), whose argv runs the sandbox's ``python3 -I`` on the fixed runner :mod:`sandbox_server.sql_runner`
(source passed with ``-c``, the SQL one argv item; read-only, budgeted and capped: its docstring lists how).

The ``workspace`` family (opt-in per sandbox: :data:`OPT_IN_FAMILIES`; a sandbox created without it refuses its
tools) changes files inside the sandbox's workspace, ``/scratch``, and runs code there: ``write_file``,
``replace_in_file``, ``make_dir`` and ``remove`` run the fixed editor :mod:`sandbox_server.workspace_runner` (paths
must lie under the workspace: :func:`check_workspace_path`); ``run_python`` runs a script and ``run_tests`` the
standard library's ``unittest`` discovery, with the sandbox's ``python3`` (argv only, never a shell). Those two are
:attr:`Tool.runs_code`: the agent runs them only in a sandbox whose process count is bounded from outside (a pids
control group, Docker's ``pids_limit``), and every call's processes get the agent's resource limits (memory, CPU
time, file size, open files: :func:`sandbox_server.agent.capped.process_limits`). Effects stay inside the
sandbox (no network, read-only ``/data``), so a fork copies them with the workspace.

Why one file: the whitelist is one table (every tool, its arguments, the argv it builds) with the one validation
each call passes before a backend sees it; what may run in a sandbox is read in one place.
"""

from __future__ import annotations

import math
import posixpath
import shlex
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field

from envs.sandbox import SandboxRefusal

from sandbox_server.agent import (AREA_BYTES, MAX_AREA_ENTRIES, MAX_ENV_VALUE_CHARS, MAX_ENV_VARS, MAX_WRITE_FILES,
                                  PAGE_BYTES, SESSION_ENV_NAMES, env_problems)

#: Longest string argument, in characters.
MAX_ARG_CHARS = 1024
#: Sandbox roots tools may read: the read-only corpus and the per-episode scratch area.
READABLE_ROOTS = ("/data", "/scratch")
#: Writable areas captured by snapshots.
WRITABLE_AREAS = ("/scratch", "/tmp")
#: Output format of the ``stat`` tool: name (with a link's target), type, size (bytes), permission bits
#: and modification time (UTC unless the session sets TZ). Nothing host-dependent (inode, device, owner,
#: links, blocks, access or change time), so forks and restored sandboxes answer alike.
STAT_FORMAT = "  File: %N\n  Type: %F\n  Size: %s\n  Mode: %04a (%A)\nModify: %y\n"
#: The tool families: ``files`` (coreutils over /data and /scratch), ``sql`` (read-only SQLite queries) and
#: ``workspace`` (edits of /scratch and code run there).
TOOL_FAMILIES = ("files", "sql", "workspace", "interpreter")
#: Families a sandbox has only when created with them (``create(families=[...])``): the others are always there.
OPT_IN_FAMILIES = ("workspace", "interpreter")
#: The workspace: where the ``workspace`` tools write (the first writable area, the one snapshots and forks carry).
WORKSPACE = "/scratch"
#: Longest file text ``write_file`` / ``replace_in_file`` take in one argument, in characters.
MAX_TEXT_CHARS = 65536
#: Most UTF-8 bytes of one string argument: the kernel takes 128 KiB per argv item, its NUL included.
MAX_ARG_BYTES = (128 << 10) - 1
#: The database the ``sql`` tools read (an env writes it into /scratch when it creates the sandbox).
SQL_DB_PATH = "/scratch/db.sqlite"
#: The ``sql`` tools' runner: the sandbox's python3, isolated (``-I``), without ``site`` or bytecode (``-S -B``).
_SQL_RUNNER = ["python3", "-I", "-S", "-B", "-c", (Path(__file__).with_name("sql_runner.py")).read_text("utf-8")]
#: The ``workspace`` editor: the same, on :mod:`sandbox_server.workspace_runner`.
_EDITOR = ["python3", "-I", "-S", "-B", "-c", (Path(__file__).with_name("workspace_runner.py")).read_text("utf-8")]
#: The ``interpreter`` family's live session: the sandbox's python3 on :mod:`sandbox_server.interpreter_runner`, without
#: ``-E``: the agent makes its whole environment (no ``PYTHON*`` variable but ``PYTHONHASHSEED=0``, so that string
#: hashes, and the order of a set of strings, are the same in every session, a copy's and a replay's alike).
_SESSION = ["python3", "-s", "-B", "-c",
            (Path(__file__).with_name("interpreter_runner.py")).read_text("utf-8")]
#: How ``run_python`` / ``run_tests`` start the interpreter: no ``PYTHON*`` variables, no user site, no bytecode
#: written (the working directory stays importable, as a test suite needs).
_PYTHON = ["python3", "-E", "-s", "-B"]

__all__ = ["AREA_BYTES", "MAX_AREA_ENTRIES", "MAX_ARG_CHARS", "MAX_ENV_VALUE_CHARS", "MAX_ENV_VARS", "MAX_WRITE_FILES",
           "MAX_ARG_BYTES", "MAX_TEXT_CHARS", "OPT_IN_FAMILIES", "PAGE_BYTES", "READABLE_ROOTS", "SESSION_ENV_NAMES",
           "STAT_FORMAT",
           "TOOLS", "WORKSPACE", "WRITABLE_AREAS", "Param", "PreparedCall", "SQL_DB_PATH", "TOOL_FAMILIES", "Tool",
           "ToolRefused", "ToolResult", "ToolSpec", "check_path", "check_workspace_path", "clamp_timeout",
           "tool_specs", "validate_call", "validate_session_env"]


class ToolRefused(SandboxRefusal):
    """A tool call was refused before execution; ``str(exc)`` names the problem (HTTP 422). A ``ValueError``;
    envs see it as the :class:`envs.sandbox.SandboxRefusal` of their provider protocol."""


class ToolResult(BaseModel):
    """The outcome of one tool call.

    ``status``: ``ok`` (ran to the end; see ``exit_code``), ``timeout`` (killed at its deadline; output
    is what was captured until then), ``refused`` (never ran), ``error`` (could not run, or the sandbox
    failed). ``truncated``: the output passed the cap and was cut (a marker line ends ``stdout``).
    ``duration_s``: wall time in the sandbox, in seconds. ``sandbox_replaced``: the sandbox itself failed
    (its agent hung or died: an infrastructure failure, not the tool's) and the session now runs on a
    new sandbox restored from its last snapshot; envs end such an episode as ``infra_error``.

    ``run_cell`` only (None / empty for every other tool): ``session`` says whether the sandbox's live interpreter
    was ``kept`` from the call before, ``started`` for this cell, or ``ended`` by it; ``carried`` (a session
    started in a copy of a sandbox: a fork, a clone, a rollback that could not resume its own copy) the names it took
    by value from the snapshot, and ``not_carried`` those it could not, each with the reason.
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    status: Literal["ok", "timeout", "refused", "error"] = "ok"
    truncated: bool = False
    duration_s: float = 0.0
    message: str = ""
    sandbox_replaced: bool = False  # the sandbox failed during the call and was rebuilt from its last snapshot
    session: Literal["kept", "started", "ended"] | None = None
    carried: list[str] | None = None
    not_carried: dict[str, str] = Field(default_factory=dict)


@dataclass(frozen=True)
class Param:
    """One tool argument: JSON type (``string`` | ``integer`` | ``boolean``), default, kind."""

    name: str
    type: str
    description: str
    required: bool = False
    default: Any = None
    is_path: bool = False
    enum: tuple[str, ...] | None = None
    minimum: int | None = None
    maximum: int | None = None
    #: Longest string value, in characters.
    max_chars: int = MAX_ARG_CHARS
    #: A path the tool writes: it must lie under :data:`WORKSPACE` (:func:`check_workspace_path`).
    in_workspace: bool = False


@dataclass(frozen=True)
class Tool:
    """A whitelisted tool: ``build(args) -> (argv, path_arg_indices)`` over validated args."""

    name: str
    description: str
    params: tuple[Param, ...]
    build: Callable[[dict[str, Any]], tuple[list[str], list[int]]] = field(repr=False)
    #: The tool family (one of :data:`TOOL_FAMILIES`): an env offers the tools of its own family only.
    family: str = "files"
    #: Runs code the caller chose (a script, a test suite): only in a sandbox whose process count is bounded.
    runs_code: bool = False
    #: Runs its ``code`` argument as a cell of the sandbox's live interpreter (``argv`` starts one when none runs).
    cell: bool = False

    @property
    def param_names(self) -> list[str]:
        """Ordered parameter names (for positional binding of text calls)."""
        return [p.name for p in self.params]

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of this tool's arguments object."""
        props: dict[str, Any] = {}
        for p in self.params:
            s: dict[str, Any] = {"type": p.type, "description": p.description}
            if p.default is not None:
                s["default"] = p.default
            if p.enum:
                s["enum"] = list(p.enum)
            if p.minimum is not None:
                s["minimum"] = p.minimum
            if p.maximum is not None:
                s["maximum"] = p.maximum
            if p.type == "string":
                s["maxLength"] = p.max_chars
            props[p.name] = s
        return {"type": "object", "properties": props, "required": [p.name for p in self.params if p.required],
                "additionalProperties": False}


class ToolSpec(BaseModel):
    """A tool as listed by ``GET /v1/tools``."""

    name: str
    description: str
    params: list[str]
    schema_: dict[str, Any] = Field(alias="schema")
    #: The tool's family (:data:`TOOL_FAMILIES`); a listing without one (an older server) means ``files``.
    family: str = "files"

    model_config = {"populate_by_name": True}


@dataclass(frozen=True)
class PreparedCall:
    """A validated call: the argv to run, which argv items are paths (checked again in the sandbox), and whether it
    runs code (:attr:`Tool.runs_code`: the agent refuses it in a sandbox without a process bound)."""

    tool: str
    argv: list[str]
    path_args: list[int]
    runs_code: bool = False
    #: The cell of an ``interpreter`` tool (``argv`` then starts the session when the sandbox has none), or None.
    code: str | None = None


def _path_arg(value: str) -> str:
    """Normalise a path argument so that every tool reads it as a path, whatever it looks like (field case S45).

    A relative path whose first character is not a letter, digit, ``_`` or ``.`` gets ``./`` in front: no
    tool then reads it as an option (``-x``, ``--help``), as stdin (``-``) or, at ``find``'s start path
    (where ``--`` cannot help), as an expression (``!``, ``(``, ``)``, ``,``, ``-name``). ``./`` names the
    same file, so nothing is refused; ordinary names (``notes.txt``, ``Lib``, ``café``) are passed unchanged,
    and absolute paths (under :data:`READABLE_ROOTS`) start with ``/``. Type: ``str -> str``.
    """
    first = value[:1]
    if first == "/" or first == "." or first == "_" or first.isalnum():
        return value
    return "./" + value


def _ls(a: dict) -> tuple[list[str], list[int]]:
    argv = ["ls", "-1"] + (["-a"] if a["all"] else []) + (["-l"] if a["long"] else []) + ["--", a["path"]]
    return argv, [len(argv) - 1]


def _cat(a: dict) -> tuple[list[str], list[int]]:
    return ["cat", "--", a["path"]], [2]


def _head(a: dict) -> tuple[list[str], list[int]]:
    if a.get("bytes") is not None:
        return ["head", "-c", str(a["bytes"]), "--", a["path"]], [4]
    return ["head", "-n", str(a["lines"]), "--", a["path"]], [4]


def _tail(a: dict) -> tuple[list[str], list[int]]:
    return ["tail", "-n", str(a["lines"]), "--", a["path"]], [4]


def _wc(a: dict) -> tuple[list[str], list[int]]:
    return ["wc", "--", a["path"]], [2]


def _stat(a: dict) -> tuple[list[str], list[int]]:
    return ["stat", "--printf", STAT_FORMAT, "--", a["path"]], [4]


def _grep(a: dict) -> tuple[list[str], list[int]]:
    argv = ["grep", "-n", "-I", "-F" if a["fixed"] else "-E"]
    if a["recursive"]:
        argv.append("-r")  # -r (not -R): symbolic links met while recursing are not followed
    if a["ignore_case"]:
        argv.append("-i")
    if a.get("max_count") is not None:
        argv += ["-m", str(a["max_count"])]
    argv += ["-e", a["pattern"], "--", a["path"]]
    return argv, [len(argv) - 1]


def _find(a: dict) -> tuple[list[str], list[int]]:
    # `find` takes its start path before any option, so `--` cannot protect it: `-x`, `!`, `(` became
    # `./-x`, `./!`, `./(` in check_path (field case S45).
    argv = ["find", "-P", a["path"]]
    if a.get("maxdepth") is not None:
        argv += ["-maxdepth", str(a["maxdepth"])]
    if a.get("name") is not None:
        argv += ["-name", a["name"]]
    if a.get("type") is not None:
        argv += ["-type", a["type"]]
    return argv, [2]


def _sql(op: str, arg: str | None = None) -> Callable[[dict[str, Any]], tuple[list[str], list[int]]]:
    """The argv builder of the runner's operation ``op`` (with argument ``arg``); the database path is a path
    argument (checked again in the sandbox, symlinks resolved)."""
    return lambda a: ([*_SQL_RUNNER, SQL_DB_PATH, op, str(a["budget_ms"])] + ([a[arg]] if arg else []),
                      [len(_SQL_RUNNER)])


def _edit(op: str, *args: str) -> Callable[[dict[str, Any]], tuple[list[str], list[int]]]:
    """The argv builder of the editor's operation ``op`` on the call's ``path`` and then its arguments ``args``."""
    return lambda a: ([*_EDITOR, op, a["path"], *(a[x] for x in args)], [len(_EDITOR) + 1])


def _run_python(a: dict) -> tuple[list[str], list[int]]:
    try:
        extra = shlex.split(a["args"] or "")
    except ValueError as exc:
        raise ToolRefused(f"run_python() argument 'args' cannot be split into arguments: {exc}") from None
    return [*_PYTHON, a["path"], *extra], [len(_PYTHON)]


def _run_tests(a: dict) -> tuple[list[str], list[int]]:
    head = [*_PYTHON, "-m", "unittest", "discover", "-v", "-s"]
    return [*head, a["path"], "-t", WORKSPACE, "-p", a["pattern"]], [len(head)]


_WPATH = Param("path", "string", "a path in the workspace (/scratch), relative to the working directory or absolute",
               required=True, is_path=True, in_workspace=True)
_BUDGET = Param("budget_ms", "integer", "time budget of the query in milliseconds (the call's deadline still "
                "applies)", default=2000, minimum=10, maximum=20000)
_SQL = Param("sql", "string", "one read-only SQLite statement (SELECT / WITH / VALUES)", required=True)

_PATH = Param("path", "string", "file or directory, relative to the working directory (/data) or absolute "
              "under /data or /scratch", is_path=True)

TOOLS: dict[str, Tool] = {
    t.name: t
    for t in [
        Tool("ls", "list a directory (one name per line)",
             (Param("path", "string", _PATH.description, default=".", is_path=True),
              Param("all", "boolean", "include names starting with a dot", default=False),
              Param("long", "boolean", "long format (mode, size, date)", default=False)), _ls),
        Tool("cat", "print a file", (Param("path", "string", _PATH.description, required=True, is_path=True),), _cat),
        Tool("head", "print the first lines (or bytes) of a file",
             (Param("path", "string", _PATH.description, required=True, is_path=True),
              Param("lines", "integer", "number of lines", default=10, minimum=0, maximum=100000),
              Param("bytes", "integer", "number of bytes instead of lines", minimum=0, maximum=10_000_000)), _head),
        Tool("tail", "print the last lines of a file",
             (Param("path", "string", _PATH.description, required=True, is_path=True),
              Param("lines", "integer", "number of lines", default=10, minimum=0, maximum=100000)), _tail),
        Tool("wc", "count lines, words and bytes of a file",
             (Param("path", "string", _PATH.description, required=True, is_path=True),), _wc),
        Tool("grep", "search files for a pattern (extended regex, or a fixed string), recursively by default; "
             "prints file:line:text",
             (Param("pattern", "string", "the pattern (a regex unless fixed=True)", required=True),
              Param("path", "string", _PATH.description, default=".", is_path=True),
              Param("fixed", "boolean", "match the pattern as a fixed string", default=False),
              Param("recursive", "boolean", "search directories recursively", default=True),
              Param("ignore_case", "boolean", "ignore case", default=False),
              Param("max_count", "integer", "stop after this many matches per file", minimum=1, maximum=100000)),
             _grep),
        Tool("find", "list files under a directory, filtered by name glob, type and depth",
             (Param("path", "string", _PATH.description, default=".", is_path=True),
              Param("name", "string", "shell glob the file name must match, e.g. '*.py'"),
              Param("type", "string", "f (file), d (directory) or l (symbolic link)", enum=("f", "d", "l")),
              Param("maxdepth", "integer", "descend at most this many levels", minimum=0, maximum=32)), _find),
        Tool("stat", "show a file's metadata: name, type, size in bytes, permissions and modification time",
             (Param("path", "string", _PATH.description, required=True, is_path=True),), _stat),
        Tool("list_tables", "list the tables of the database, with their column and row counts", (_BUDGET,),
             _sql("tables"), family="sql"),
        Tool("describe", "show a table's CREATE TABLE statement, its row count and its first rows",
             (Param("table", "string", "the table's name", required=True), _BUDGET), _sql("describe", "table"),
             family="sql"),
        Tool("query", "run one read-only SQL query on the database and print the result as a text table (at most "
             "50 rows)", (_SQL, _BUDGET), _sql("query", "sql"), family="sql"),
        Tool("rows", "run one read-only SQL query and print its whole result set as JSON (at most 1000 rows): "
             "what an answer is scored on", (_SQL, _BUDGET), _sql("rows", "sql"), family="sql"),
        Tool("write_file", "write a text file in the workspace (replacing it; missing directories are made)",
             (_WPATH, Param("text", "string", "the file's whole new text", required=True, max_chars=MAX_TEXT_CHARS)),
             _edit("write", "text"), family="workspace"),
        Tool("replace_in_file", "replace the one occurrence of a text in a workspace file (refused when it occurs "
             "zero or several times); prints the changed lines",
             (_WPATH, Param("old", "string", "the exact text to replace, with enough lines around it to be unique",
                            required=True, max_chars=MAX_TEXT_CHARS),
              Param("new", "string", "the text to put in its place", required=True, max_chars=MAX_TEXT_CHARS)),
             _edit("replace", "old", "new"), family="workspace"),
        Tool("make_dir", "make a directory in the workspace (and its missing parents)", (_WPATH,), _edit("mkdir"),
             family="workspace"),
        Tool("remove", "remove a file or a directory (with its contents) from the workspace", (_WPATH,),
             _edit("remove"), family="workspace"),
        Tool("run_python", "run a Python script with the sandbox's python3 (no network; memory, time and output "
             "bounded)",
             (Param("path", "string", _PATH.description, required=True, is_path=True),
              Param("args", "string", "the script's arguments, split as a POSIX shell would (never run by one)",
                    default="")), _run_python, family="workspace", runs_code=True),
        Tool("run_tests", "run the unit tests under a directory (python3 -m unittest discover, verbose; the "
             "workspace is the top-level directory: its packages import by name)",
             (Param("path", "string", "the directory the tests are found under", default=".", is_path=True),
              Param("pattern", "string", "file name glob of the test modules", default="test*.py")),
             _run_tests, family="workspace", runs_code=True),
        Tool("run_cell", "run Python code in the sandbox's live interpreter: variables persist from cell to cell; "
             "the value of a last expression is printed (working directory /scratch; no network; memory, time and "
             "output bounded)",
             (Param("code", "string", "the cell's Python source", required=True, max_chars=MAX_TEXT_CHARS),),
             lambda a: (list(_SESSION), []), family="interpreter", runs_code=True, cell=True),
    ]
}


def tool_specs(registry: dict[str, Tool] | None = None) -> list[ToolSpec]:
    """Every tool of ``registry`` (default :data:`TOOLS`) with its ordered params and JSON schema."""
    reg = TOOLS if registry is None else registry
    return [ToolSpec(name=t.name, description=t.description, params=t.param_names, schema=t.json_schema(),
                     family=t.family) for t in reg.values()]


def check_path(value: str, cwd: str = "/data") -> str:
    """Lexically validate a path argument against :data:`READABLE_ROOTS`; return the form passed to the tool.

    Raises:
        ToolRefused: ``..`` components, an absolute path outside the roots, control characters, empty.
    """
    if value == "":
        raise ToolRefused("the path is empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ToolRefused("the path contains a control character")
    if ".." in value.split("/"):
        raise ToolRefused(f"the path {value!r} contains '..'; paths must stay inside {', '.join(READABLE_ROOTS)}")
    resolved = posixpath.normpath(posixpath.join(cwd, value))
    if not any(resolved == r or resolved.startswith(r + "/") for r in READABLE_ROOTS):
        raise ToolRefused(f"the path {value!r} is outside the readable roots {', '.join(READABLE_ROOTS)}")
    return _path_arg(value)


def check_workspace_path(value: str, cwd: str = "/data") -> str:
    """:func:`check_path`, and the path must lie under :data:`WORKSPACE` (not be the workspace itself): where the
    ``workspace`` tools write. Raises ToolRefused."""
    out = check_path(value, cwd)
    resolved = posixpath.normpath(posixpath.join(cwd, value))
    if not resolved.startswith(WORKSPACE + "/"):
        raise ToolRefused(f"the path {value!r} is not in the workspace {WORKSPACE}; only files there can be changed")
    return out


def _check_value(tool: Tool, p: Param, value: Any) -> Any:
    where = f"{tool.name}() argument {p.name!r}"
    if p.type == "string":
        if not isinstance(value, str):
            raise ToolRefused(f"{where} must be a string, got {type(value).__name__}")
        if "\x00" in value:
            raise ToolRefused(f"{where} contains a NUL byte")
        if len(value) > p.max_chars:
            raise ToolRefused(f"{where} is {len(value)} characters long; the limit is {p.max_chars}")
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise ToolRefused(f"{where} holds a lone surrogate: it is not text that UTF-8 can carry") from None
        if size > MAX_ARG_BYTES:
            raise ToolRefused(f"{where} takes {size} bytes in UTF-8; the limit is {MAX_ARG_BYTES} bytes (one "
                              "argument of a program)")
        if p.enum and value not in p.enum:
            raise ToolRefused(f"{where} must be one of {', '.join(p.enum)}, got {value!r}")
    elif p.type == "integer":
        if not isinstance(value, int) or isinstance(value, bool):  # strict, like every request field: 2.0 is refused
            raise ToolRefused(f"{where} must be an integer, got {type(value).__name__}")
        if (p.minimum is not None and value < p.minimum) or (p.maximum is not None and value > p.maximum):
            raise ToolRefused(f"{where} must be between {p.minimum} and {p.maximum}, got {value}")
    elif p.type == "boolean":
        if not isinstance(value, bool):
            raise ToolRefused(f"{where} must be true or false, got {value!r}")
    return value


def validate_call(name: Any, args: Any, cwd: str = "/data", registry: dict[str, Tool] | None = None,
                  families: tuple[str, ...] | list[str] = ()) -> PreparedCall:
    """Validate a JSON tool call ``{"tool": name, "args": {...}}`` and build its argv.

    ``cwd`` is the sandbox working directory that relative paths resolve against; ``families`` the opt-in families
    (:data:`OPT_IN_FAMILIES`) the sandbox was created with.

    Raises:
        ToolRefused: with a message naming the problem; nothing must be executed then.
    """
    reg = TOOLS if registry is None else registry
    if not isinstance(name, str) or name not in reg:
        raise ToolRefused(f"unknown tool {name!r}; the tools are: {', '.join(reg)}")
    tool = reg[name]
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ToolRefused(f"{name}() arguments must be an object of name: value")
    known = {p.name: p for p in tool.params}
    extra = [k for k in args if k not in known]
    if extra:
        raise ToolRefused(f"{name}() has no argument {extra[0]!r}; its arguments are: {', '.join(known)}")
    bound: dict[str, Any] = {}
    for p in tool.params:
        if p.name not in args or args[p.name] is None:
            if p.required:
                raise ToolRefused(f"{name}() needs the argument {p.name!r}")
            bound[p.name] = p.default
            continue
        value = _check_value(tool, p, args[p.name])
        bound[p.name] = (check_workspace_path(value, cwd) if p.in_workspace else check_path(value, cwd)) \
            if p.is_path else value
    if tool.family in OPT_IN_FAMILIES and tool.family not in families:
        raise ToolRefused(f"{name}() is a {tool.family} tool, and this sandbox was created without the "
                          f"{tool.family} family (create it with families=[{tool.family!r}])")
    argv, path_args = tool.build(bound)
    return PreparedCall(tool=name, argv=argv, path_args=path_args, runs_code=tool.runs_code,
                        code=bound["code"] if tool.cell else None)


def validate_session_env(env: Any) -> dict[str, str]:
    """Check a session environment (``create`` / ``update_state``) against the allow-list; return a copy.

    Allowed: at most :data:`MAX_ENV_VARS` variables, each named in :data:`SESSION_ENV_NAMES` (``LANG``,
    ``LANGUAGE``, ``LC_*``, ``TZ``, ``TERM``, ``COLUMNS``, ``LINES``, ``NO_COLOR``), with a ``str`` value of at
    most :data:`MAX_ENV_VALUE_CHARS` characters, no NUL, and the form the variable takes (locale names
    without ``/``, ``TZ`` never a path outside the zone database, ``COLUMNS`` / ``LINES`` digits). ``None``
    is the empty environment. The agent in every sandbox enforces the same rules on each call.

    Raises:
        ToolRefused: with a message naming every refused variable (HTTP 422); nothing is stored then.
    """
    if env is None:
        return {}
    problems = env_problems(env)
    if problems:
        raise ToolRefused("session environment refused: " + "; ".join(problems))
    return {str(k): str(v) for k, v in env.items()}


def clamp_timeout(value: Any, default_s: float, max_s: float) -> float:
    """Resolve a per-call timeout in seconds: ``None`` -> ``default_s``; above ``max_s`` -> ``max_s``.

    Raises:
        ToolRefused: if the value is not a number, is NaN, or is zero or negative.
    """
    if value is None:
        return default_s
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ToolRefused(f"timeout_s must be a number of seconds, got {value!r}")
    if math.isnan(value) or value <= 0:
        raise ToolRefused(f"timeout_s must be positive (seconds), got {value!r}; the maximum is {max_s:g}")
    return float(min(value, max_s))
