"""The interpreter family's live Python session: a fixed, standard-library-only program that runs **in the sandbox**.

The agent starts it once per sandbox, at the first ``run_cell`` call, with the sandbox's own ``python3`` (``-E -s -B
-c SOURCE``, working directory the workspace ``/scratch``) and the limits of every call that runs code (memory, file
size, open files; a Landlock domain of its own, so it can signal nothing outside it). It then keeps its variables
from cell to cell, as the code interpreters of data-analysis and coding agents do (a Jupyter kernel without Jupyter).
Python >= 3.9; imports nothing outside the standard library and nothing of forkyard.

Channels (file descriptors the agent opens and passes, named by the last two arguments):

* requests, one JSON line each, numbered (``n``, echoed by the answer): ``{"code": str}`` runs a cell;
  ``{"op": "fork"}`` answers with the pid of a
  copy of this process made by ``os.fork`` that waits until the agent resumes it (SIGUSR1, from the agent only) in
  place of the session then running: the session's variables as they were (a rollback of the interpreter);
  ``{"op": "reap"}`` reaps the session's ended children (after the agent killed what a cell left);
  ``{"op": "export"}`` answers with ``data``, the session's state by value (:func:`export_state`, run in a
  throwaway child: :func:`_export_in_child`), for a copy of the sandbox elsewhere (a fork, a clone): a cell
  request's ``carry`` (that ``data``) is imported before the cell runs, in a session that has run nothing yet.
* answers, one JSON line each: ``{"n": int, "ok": bool, "error": str | null, "lost_output": bool}`` (``lost_output``:
  file descriptor 1 or 2 is no longer the agent's pipe), written after the cell's output is flushed; with
  ``carried`` (names) and ``dropped`` ({name: why}) after an import. A process the
  cell itself forked never answers: it exits when the cell ends in it.
* ``1`` / ``2``: the cell's standard output and error (the agent captures and caps them); stdin is ``/dev/null``.

A cell runs as IPython runs one: its statements in the session's ``__main__`` namespace, and when its last statement
is an expression, that value's ``repr`` printed (unless None). An exception prints its traceback (without this
runner's frames) to stderr and the session goes on; ``SystemExit`` (``exit()``, ``sys.exit``) is reported the same
way and does not end the session; SIGINT (the agent's first step at a cell's deadline or its output cap) raises
``KeyboardInterrupt`` in the cell's code only (one that arrives as the cell ends is dropped: :func:`_on_sigint`). A
cell that ends the process (``os._exit``, a crash, the memory bound) ends the session: the agent
says so, and the next cell starts a new one with no variables.

The session's namespace is the ``__dict__`` of the module ``sys.modules["__main__"]``, as in a script or IPython, so
that ``pickle`` finds the classes and functions cells define (``__main__.Name``).

**State by value** (:func:`export_state` / :func:`import_state`): a process cannot move into another sandbox (their
namespaces are not its to enter), so a fork into other sandboxes carries the session's *variables*, not its process:
modules by name (imported again in the copy, from the copy's own workspace; one whose file changed since the session
imported it, from the source as imported: :data:`IMPORTED_SOURCES`), the functions and classes cells defined by
their source (defined again, output kept out of the cell's) with their defaults and attributes as they are now, every
other value by ``pickle`` from one pickler (shared references between names kept; one that will not load costs only
itself), and the ``random`` generator's state, the working directory, ``sys.path`` and ``os.environ``. What
``pickle`` refuses (open files, sockets, generators, threads, lambdas, closures, instances of a class redefined
since) is not carried: each
such name comes back with the reason, and the copy's first cell says so, as for a function or class a cell defined
other than by a top-level statement (inside an ``if``, by ``exec``: a copy could not find it by name). A state is at
most the request's ``max_bytes`` (the agent's ``INTERPRETER_STATE_BYTES``): values past what the rest leaves are
dropped, the largest first. Module attributes a cell changed are not carried (the module is imported afresh).

Why one file: the agent runs it as ``python3 -c SOURCE`` inside the sandbox, where nothing of forkyard can be
imported; every part of the session (cells, copies, the export and import of its state) must travel in that source.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import pickle
import signal
import sys
import traceback
import types

#: The signal that resumes a waiting copy, taken from the agent only.
RESUME_SIGNAL = signal.SIGUSR1
#: The agent: the process that started this session (every copy keeps the value).
AGENT_PID = os.getppid()
#: The top-level ``def`` and ``class`` statements cells ran: {name: (order, source)}, the latest of each name.
DEFINITIONS: dict = {}


def _streams() -> list[tuple[int, int] | None]:
    """What file descriptors 1 and 2 are now: ``(device, inode)`` each, None when closed."""
    out: list[tuple[int, int] | None] = []
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
            out.append((st.st_dev, st.st_ino))
        except OSError:
            out.append(None)
    return out


def _reap_forked() -> None:
    """Reap the children a cell forked that have ended and that no live ``subprocess.Popen`` holds: a fork bomb's
    exited copies would otherwise stay zombies of this session, each one counted against the sandbox's process bound
    until the session ends. (A child a cell forked with ``os.fork`` and meant to ``os.waitpid`` later is reaped here
    too; a ``Popen``'s child is left to its object.)"""
    zombies = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                for child in f.read().split():
                    with open(f"/proc/{child}/stat", "rb") as st:
                        if st.read().rpartition(b")")[2].split()[0] == b"Z":
                            zombies.append(int(child))
    except (OSError, ValueError, IndexError):
        pass
    if not zombies:
        return
    held: set = set()
    if "subprocess" in sys.modules:
        import gc

        popen = sys.modules["subprocess"].Popen
        held = {o.pid for o in gc.get_objects() if isinstance(o, popen) and o.returncode is None}
    for pid in zombies:
        if pid not in held:
            try:
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass


def _compile(code: str):
    """``(statements code object or None, last-expression code object or None)`` of one cell; its top-level
    ``def`` and ``class`` statements' source recorded in :data:`DEFINITIONS` (for :func:`export_state`)."""
    tree = ast.parse(code, "<cell>", "exec")
    lines = code.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.end_lineno:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            DEFINITIONS[node.name] = (len(DEFINITIONS), "".join(lines[first - 1:node.end_lineno]))
    last = None
    tail = tree.body[-1] if tree.body else None
    if isinstance(tail, ast.Expr):
        tree.body.pop()
        last = ast.Expression(tail.value)
    body = compile(tree, "<cell>", "exec") if tree.body else None
    return body, (compile(last, "<cell>", "eval") if last is not None else None)


def _print_exception(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
        tb = tb.tb_next  # this runner's frames are not the cell's
    sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))


#: Whether a cell's own code runs now: SIGINT (the agent's, at a deadline or the output cap) interrupts only then.
IN_CELL = [False]


def _on_sigint(signum, frame) -> None:
    """SIGINT's handler: ``KeyboardInterrupt`` in a cell's code; dropped anywhere else (an interrupt sent as the cell
    ended, which would otherwise land in this runner's answer or its wait for the next request and end the
    session)."""
    if IN_CELL[0]:
        raise KeyboardInterrupt


def run_cell(code: str, namespace: dict) -> tuple[bool, str | None]:
    """Run one cell in ``namespace``; ``(ok, error name or None)``. Never raises (but for a process exit)."""
    try:
        body, last = _compile(code)
        IN_CELL[0] = True
        try:
            if body is not None:
                exec(body, namespace)
            if last is not None:
                value = eval(last, namespace)
                if value is not None:
                    namespace["_"] = value
                    print(repr(value))
        finally:
            IN_CELL[0] = False
        return True, None
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the session goes on
        _restore_streams()
        _print_exception(exc)
        return False, type(exc).__name__
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 -- a cell may have put anything there (None, a closed file)
                pass
        _restore_streams()


def _restore_streams() -> None:
    """Put ``sys.stdout`` / ``sys.stderr`` back on file descriptors 1 / 2 when a cell set them to None, to something
    without ``write``, or closed them: the session's output goes on reaching the caller (a cell that closed the
    descriptors themselves is told by the agent instead)."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name, None)
        if stream is not None and callable(getattr(stream, "write", None)) and not getattr(stream, "closed", False):
            continue
        try:
            fresh = open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
        except OSError:
            continue
        setattr(sys, name, fresh)
        setattr(sys, f"__{name}__", fresh)


def _defined_here(name: str, value) -> bool:
    """Whether ``value`` is the function or class a cell's top-level statement ``name`` defined (carried by source)."""
    if not (isinstance(value, (type, types.FunctionType)) or hasattr(value, "__wrapped__")):
        return False
    return (getattr(value, "__module__", None) == "__main__" and getattr(value, "__qualname__", None) == name
            and name in DEFINITIONS)


def _why(exc: BaseException) -> str:
    """An exception as a short reason, without memory addresses (the same state gives the same text every time)."""
    text = f"{type(exc).__name__}: {exc}"
    while " at 0x" in text:
        head, _, tail = text.partition(" at 0x")
        text = head + tail.lstrip("0123456789abcdef")
    return text[:200]


class _TooLarge(Exception):
    """A pickle passed its byte budget (raised by :class:`_Budget` while it is written: never materialized whole)."""


class _Budget:
    """A write-only byte sink that raises :class:`_TooLarge` past ``limit`` bytes."""

    def __init__(self, limit: int):
        self.parts: list = []
        self.size = 0
        self.limit = limit

    def write(self, data) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise _TooLarge(self.size)
        self.parts.append(bytes(data))
        return len(data)


class _Pickler(pickle.Pickler):
    """``pickle`` that refuses the functions and classes cells defined other than by a top-level ``def`` / ``class``
    statement (inside an ``if``, a loop, an ``exec``): a copy could not find them by name (``__main__.f``), and one
    such reference would make the whole unpickling fail there. The value that holds one is not carried, named."""

    def reducer_override(self, obj):
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            name = getattr(obj, "__qualname__", "")
            if name in DEFINITIONS and sys.modules["__main__"].__dict__.get(name) is not obj:
                raise pickle.PicklingError(f"it holds an older {name} (redefined since)")
            if name not in DEFINITIONS:
                raise pickle.PicklingError(f"{name} is defined in a cell but not by a top-level def or class "
                                           "statement: a copy cannot find it by name")
        return NotImplemented


def _dump_values(values: dict, limit: int) -> tuple[bytes, list]:
    """``values`` pickled one after another by one pickler (its memo shared: two names for one object stay one),
    within ``limit`` bytes in all: ``(bytes, [(name, start, end)])``, each name's pickle at ``bytes[start:end]``.
    Raises like :func:`_dumps`."""
    sink = _Budget(limit)
    pickler = _Pickler(sink, protocol=4)
    entries = []
    for name, value in values.items():
        start = sink.size
        pickler.dump(value)
        entries.append((name, start, sink.size))
    return b"".join(sink.parts), entries


def _load_values(blob: bytes, entries: list) -> tuple[dict, dict]:
    """The values of :func:`_dump_values`: ``({name: value}, {name: why it did not load})``. One unpickler reads
    them in order; when one fails (a name it refers to that the copy lacks), each is read again on its own, the
    shared memo carried from one to the next, so that one failure costs that name (and those that share its
    objects) only."""
    out: dict = {}
    try:
        unpickler = pickle.Unpickler(io.BytesIO(blob))
        for name, _, _ in entries:
            out[name] = unpickler.load()
        return out, {}
    except BaseException:  # noqa: BLE001 -- a value's own code may raise anything
        pass
    out, failed = {}, {}
    memo: dict = {}
    for name, start, end in entries:  # pickle's own Python unpickler: its memo is a plain dict, safe to hand on
        slow = pickle._Unpickler(io.BytesIO(blob[start:end]))  # noqa: SLF001
        slow.memo = memo  # type: ignore[attr-defined]  # set in its load(); typeshed lists only the C one's
        try:
            out[name] = slow.load()
        except BaseException as exc:  # noqa: BLE001
            failed[name] = _why(exc)
        memo = slow.memo  # type: ignore[attr-defined]
    return out, failed


def _dumps(value, limit: int) -> bytes:
    """``value`` pickled (protocol 4, :class:`_Pickler`) within ``limit`` bytes. Raises :class:`_TooLarge` past it, or
    what pickling raises."""
    sink = _Budget(limit)
    _Pickler(sink, protocol=4).dump(value)
    return b"".join(sink.parts)


#: The source of each module the session imported from a writable area, as it was read then: {name: (path, bytes)}.
IMPORTED_SOURCES: dict = {}
#: Where the session's own modules live (the writable areas).
WRITABLE_ROOTS = ("/scratch/", "/tmp/")


class _RecordingLoader(importlib.machinery.SourceFileLoader):
    """Loads a module of the writable areas from its source (never a bytecode cache) and records that source in
    :data:`IMPORTED_SOURCES`, or, given ``source``, loads that text in place of the file's (a copy of a session
    whose file was edited since it imported it)."""

    def __init__(self, fullname: str, path: str, source: bytes | None = None):
        super().__init__(fullname, path)
        self.source = source

    def get_code(self, fullname):
        data = self.source if self.source is not None else self.get_data(self.path)
        IMPORTED_SOURCES[self.name] = (self.path, data)
        return self.source_to_code(data, self.path)


class _RecordingFinder:
    """First on ``sys.meta_path``: the standard path finder's spec, with a :class:`_RecordingLoader` for a source file
    under :data:`WRITABLE_ROOTS`."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader) \
                and str(spec.origin).startswith(WRITABLE_ROOTS):
            spec.loader = _RecordingLoader(name, str(spec.origin))
        return spec


def _stale_modules() -> dict:
    """{name: (path, source as imported, package?)} of the modules the session imported from the writable areas whose
    file has changed (or gone) since: a copy loads that source, not the file (as the session still runs it)."""
    out = {}
    for name, (path, data) in list(IMPORTED_SOURCES.items()):
        module = sys.modules.get(name)
        if module is None or getattr(module, "__file__", None) != path or len(data) > MAX_SOURCE_BYTES:
            continue
        try:
            with open(path, "rb") as f:
                now = f.read()
        except OSError:
            now = None
        if now != data:
            out[name] = (path, data, hasattr(module, "__path__"))
    return out


def _load_stale(name: str, path: str, data: bytes, package: bool) -> None:
    """Make module ``name`` from ``data`` (its source as the exporting session imported it), at ``path``."""
    parent, _, child = name.rpartition(".")
    if parent and parent not in sys.modules:
        importlib.import_module(parent)
    loader = _RecordingLoader(name, path, data)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader, submodule_search_locations=(
        [os.path.dirname(path)] if package else None))
    if spec is None:
        raise ImportError(f"no module spec for {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    if parent:
        setattr(sys.modules[parent], child, module)


#: Key prefix, among the carried values, of a definition's state (:func:`_definition_state`).
DEFINITION_STATE = "\x00definition:"
#: Class attributes never carried as state (the class statement makes them).
_CLASS_OWN = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__", "__doc__", "__slots__",
                        "__firstlineno__", "__static_attributes__"})


def _definition_state(value) -> dict:
    """What a function or class a cell defined holds beyond its source: a function's ``__defaults__``,
    ``__kwdefaults__`` and attributes (``f.calls = 5``; a mutable default that calls changed), a class's attributes
    that are not functions or descriptors (``K.n += 1``). Put back by :func:`import_state` over the definition the
    source makes again."""
    if isinstance(value, types.FunctionType):
        out = {"defaults": value.__defaults__, "kwdefaults": value.__kwdefaults__}
        attrs = {k: v for k, v in vars(value).items() if k != "__wrapped__"}
        if attrs:
            out["attrs"] = attrs
        return out if any(v is not None for v in out.values()) else {}
    if isinstance(value, type):
        attrs = {k: v for k, v in vars(value).items() if k not in _CLASS_OWN
                 and not (callable(v) or hasattr(v, "__get__") or isinstance(v, (staticmethod, classmethod)))}
        return {"attrs": attrs} if attrs else {}
    return {}


def _put_definition_state(target, state: dict) -> None:
    if "defaults" in state:
        target.__defaults__ = state["defaults"]
    if "kwdefaults" in state:
        target.__kwdefaults__ = state["kwdefaults"]
    for k, v in (state.get("attrs") or {}).items():
        setattr(target, k, v)


#: Most names listed with the reason they were not carried (the rest are counted).
MAX_REASONS = 50
#: Most bytes of one definition's source carried.
MAX_SOURCE_BYTES = 256 << 10


def export_state(namespace: dict, max_bytes: int) -> tuple[bytes, list, dict]:
    """The session's state by value (see the module docstring), at most about ``max_bytes`` bytes in all: ``(bytes,
    names carried, {name: why not carried})``. The bytes are a pickle of plain data, read by :func:`import_state`
    only. Values go in one pickle (shared references kept); when that fails or passes the budget, one by one, the
    largest dropped first. Raises only what a value's own code raises past every guard (the caller answers it)."""
    modules, sources, values, dropped = {}, [], {}, {}
    for name, value in list(namespace.items()):
        if name.startswith("__") and name.endswith("__"):  # the module's own (__builtins__, __warningregistry__)
            continue
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
        elif _defined_here(name, value):
            if len(DEFINITIONS[name][1]) > MAX_SOURCE_BYTES:
                dropped[name] = f"its source is longer than {MAX_SOURCE_BYTES} bytes"
            else:
                sources.append(DEFINITIONS[name] + (name,))
                extra = _definition_state(value)
                if extra:  # its defaults and attributes as they are now, not as the source makes them
                    values[DEFINITION_STATE + name] = extra
        else:
            try:
                size = sys.getsizeof(value)  # a buffer past the budget is not pickled at all (its copy alone could
            except BaseException:  # noqa: BLE001 -- take the sandbox's memory bound)
                size = 0
            if size > max_bytes:
                dropped[name] = f"too large to carry ({size} bytes in memory; a state is at most {max_bytes})"
            else:
                values[name] = value
    try:
        cwd = os.getcwd()
    except OSError as exc:
        cwd, dropped["(working directory)"] = None, f"not carried: {_why(exc)}"
    rng = sys.modules.get("random")
    rest = {"version": 1, "modules": modules, "sources": sorted(sources), "random": rng.getstate() if rng else None,
            "cwd": cwd, "path": list(sys.path), "environ": dict(os.environ), "stale": _stale_modules()}
    budget = max_bytes - len(pickle.dumps(rest, protocol=4)) - 64 * (MAX_REASONS + 1) - 256 * MAX_REASONS
    try:
        blob, entries = _dump_values(values, max(budget, 0))
    except BaseException:  # noqa: BLE001 -- too large, or a value refused (SystemExit too): one by one
        sizes = {}
        for name, value in list(values.items()):
            try:
                sizes[name] = len(_dumps(value, max(budget, 0)))
            except _TooLarge:
                dropped[name] = f"too large to carry (more than {max(budget, 0)} bytes pickled)"
                values.pop(name)
            except BaseException as exc:  # noqa: BLE001 -- whatever a value's own code raises
                dropped[name] = _why(exc)
                values.pop(name)
        total = sum(sizes.values())
        for name in sorted(sizes, key=sizes.__getitem__, reverse=True):
            if total <= budget:
                break
            total -= sizes[name]
            values.pop(name)
            dropped[name] = f"too large to carry ({sizes[name]} bytes pickled; at most {budget} in all)"
        try:
            blob, entries = _dump_values(values, max(budget, 0))
        except BaseException as exc:  # noqa: BLE001 -- each pickled alone; in one stream they still may not
            dropped.update({n: _why(exc) for n in values})
            values, blob, entries = {}, b"", []
    if len(dropped) > MAX_REASONS:
        kept = dict(list(dropped.items())[:MAX_REASONS])
        kept["..."] = f"{len(dropped) - MAX_REASONS} more names not carried"
        dropped = kept
    dropped = {(f"{k[len(DEFINITION_STATE):]} (its defaults and attributes)" if k.startswith(DEFINITION_STATE)
                else k): v for k, v in dropped.items()}
    state = dict(rest, values=blob, entries=entries, dropped=dropped)
    names = sorted(modules) + [n for _, _, n in sorted(sources)] + sorted(n for n in values
                                                                          if not n.startswith(DEFINITION_STATE))
    return pickle.dumps(state, protocol=4), names, dropped


def _put_back(key: str, value) -> None:
    """Put one process-wide part of a carried state back (``environ``, ``path``, ``cwd``, ``random``); None: left."""
    if value is None:
        return
    if key == "environ":
        os.environ.clear()
        os.environ.update(value)
    elif key == "path":
        sys.path[:] = list(value)
    elif key == "cwd":
        os.chdir(value)
    elif key == "random":
        import random

        random.setstate(value)


def import_state(data: bytes, namespace: dict) -> tuple[list, dict]:
    """Put a state of :func:`export_state` into ``namespace`` (a session that has run nothing yet); ``(names
    carried, {name: why not})``. Each part is put back on its own (a working directory gone, a module that no
    longer imports cost only that part). Never raises."""
    carried: list = []
    try:
        state = pickle.loads(data)
        dropped = dict(state["dropped"])  # what the export already left out
    except BaseException as exc:  # noqa: BLE001 -- a crafted member's code may raise anything
        return [], {"*": f"the carried state cannot be read: {_why(exc)}"}
    for part, key in (("(environment)", "environ"), ("(sys.path)", "path"), ("(working directory)", "cwd"),
                      ("(random)", "random")):
        try:
            _put_back(key, state.get(key))
        except BaseException as exc:  # noqa: BLE001
            dropped[part] = _why(exc)
    for name, (path, source, package) in sorted(dict(state.get("stale") or {}).items()):  # parents first
        try:
            _load_stale(name, path, source, package)
        except BaseException as exc:  # noqa: BLE001 -- the module's own code may raise anything
            dropped[f"(module {name} as imported)"] = _why(exc)
    for name, module in dict(state.get("modules") or {}).items():
        try:
            namespace[name] = __import__(module, fromlist=["_"])
            carried.append(name)
        except BaseException as exc:  # noqa: BLE001 -- an import may raise anything, SystemExit included
            dropped[name] = f"import {module}: {_why(exc)}"
    later = []
    for _, source, name in list(state.get("sources") or []):
        try:
            exec(compile(source, "<cell>", "exec"), namespace)
            carried.append(name)
            DEFINITIONS[name] = (len(DEFINITIONS), source)  # this copy's own forks carry it again
        except BaseException:  # noqa: BLE001 -- e.g. a default value naming a variable not carried yet
            later.append((source, name))
    try:
        values, failed = _load_values(state["values"], list(state["entries"]))
    except BaseException as exc:  # noqa: BLE001 -- a crafted state
        values, failed = {}, {"*values": _why(exc)}
    extras = {k[len(DEFINITION_STATE):]: values.pop(k) for k in list(values) if k.startswith(DEFINITION_STATE)}
    namespace.update(values)
    carried += list(values)
    for source, name in later:
        try:
            exec(compile(source, "<cell>", "exec"), namespace)
            carried.append(name)
            DEFINITIONS[name] = (len(DEFINITIONS), source)
        except BaseException as exc:  # noqa: BLE001
            dropped[name] = _why(exc)
    dropped.update({(f"{k[len(DEFINITION_STATE):]} (its defaults and attributes)" if k.startswith(DEFINITION_STATE)
                     else k): v for k, v in failed.items()})
    for name, extra in extras.items():
        try:
            _put_definition_state(namespace[name], extra)
        except BaseException as exc:  # noqa: BLE001
            dropped[f"{name} (its defaults and attributes)"] = _why(exc)
    return carried, dropped


#: ``oom_score_adj`` of the session (the agent starts it at the most, 1000, as every call; an unprivileged process
#: may lower its own back to 0) and of an export child: at the sandbox's memory bound the kernel takes the export
#: child (a copy whose pickling broke copy-on-write) before the session.
SESSION_OOM_SCORE_ADJ = 900
EXPORT_OOM_SCORE_ADJ = 1000


def _oom_score_adj(value: int) -> None:
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(value))
    except OSError:
        pass


#: Exit status of an export child that wrote its answer (any other: the runner answers for it).
EXPORTED = 77


def _export_in_child(namespace: dict, answers, n, max_bytes: int) -> None:
    """Answer an ``export`` request from a throwaway ``os.fork`` child: pickling walks every object (their reference
    counts change), which in this process would write to every page it shares with its waiting copies (each copy
    would then cost its whole heap); in a child that exits those writes cost nothing after. The child's output goes
    to /dev/null (a value's ``__reduce__`` that prints cannot fill the session's pipes), and ``random``, which
    reseeds itself in a forked child, is put back to the session's state first. Waits for the child; when it ended
    without answering (killed at the memory bound, ``os._exit`` in a value's code), answers that for it."""
    rng = sys.modules.get("random")
    state = rng.getstate() if rng is not None else None
    pid = os.fork()
    if pid == 0:
        try:
            _oom_score_adj(EXPORT_OOM_SCORE_ADJ)  # at the memory bound, this child goes before the session
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            if rng is not None:
                rng.setstate(state)
            try:  # a value's own __reduce__ runs here: it may raise anything
                data = export_state(namespace, max_bytes)[0]
                ans = {"ok": True, "data": base64.b64encode(data).decode("ascii")}
            except BaseException as exc:  # noqa: BLE001
                ans = {"ok": False, "error": _why(exc)}
            answers.write(json.dumps({"n": n, **ans}).encode() + b"\n")
            os._exit(EXPORTED)
        finally:
            os._exit(1)
    status = None
    while status is None:
        try:
            status = os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue
        except ChildProcessError:
            status = 0
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXPORTED):
        why = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
               else f"exit status {os.WEXITSTATUS(status)}")
        answers.write(json.dumps({"n": n, "ok": False, "error": f"the export ended before it answered ({why}; "
                                  "the memory bound, or a value's own code)"}).encode() + b"\n")


def _fork_template() -> int:
    """Make a waiting copy of this session (``os.fork``); returns its pid here. The copy waits until the agent sends it
    :data:`RESUME_SIGNAL` (the same signal from any other process is ignored), then goes on serving the request
    channel as the live session. The ``random`` module's generator, which reseeds itself in a forked child, is put
    back to the session's state in the copy."""
    rng = sys.modules.get("random")
    state = rng.getstate() if rng is not None else None
    signal.pthread_sigmask(signal.SIG_BLOCK, {RESUME_SIGNAL})  # the copy's resume stays pending until it waits
    pid = os.fork()
    if pid == 0:
        if rng is not None:  # the random module reseeds itself in a forked child: a copy keeps the session's state
            rng.setstate(state)
        os.setsid()  # its own process group: killing the live session's group never reaches a waiting copy
        while signal.sigwaitinfo({RESUME_SIGNAL}).si_pid != AGENT_PID:
            pass  # sent by anyone but the agent (a cell): ignored
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {RESUME_SIGNAL})
        return 0
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {RESUME_SIGNAL})
    return pid


def main() -> int:
    """Serve cells until the request channel closes."""
    _oom_score_adj(SESSION_OOM_SCORE_ADJ)
    main_module = types.ModuleType("__main__")  # the cells' module: pickle finds what they define there
    main_module.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main_module
    namespace = main_module.__dict__
    session = [os.getpid()]  # the process that serves requests (a resumed copy, after a rollback)
    streams = _streams()  # the agent's output pipes
    requests = os.fdopen(int(sys.argv[-2]), "rb")
    answers = os.fdopen(int(sys.argv[-1]), "wb", buffering=0)
    signal.signal(signal.SIGINT, _on_sigint)
    sys.path.insert(0, os.getcwd())  # the workspace's modules import, as in a script run from there
    sys.meta_path.insert(0, _RecordingFinder)  # a copy must run a module as this session imported it
    line = b""
    while True:
        chunk = requests.readline()
        if not chunk:
            return 0
        line += chunk
        if not line.endswith(b"\n"):
            continue
        try:
            req = json.loads(line)
        except ValueError:
            req = {}
        line = b""
        if req.get("op") == "reap":  # the agent killed what the cell left: its ended children
            _reap_forked()
            answers.write(json.dumps({"n": req.get("n"), "ok": True}).encode() + b"\n")
            continue
        if req.get("op") == "export":
            _export_in_child(namespace, answers, req.get("n"), int(req.get("max_bytes") or 0))
            continue
        if req.get("op") == "fork":
            pid = _fork_template()
            if pid == 0:
                session[0] = os.getpid()
                continue  # resumed: this copy is now the session
            answers.write(json.dumps({"n": req.get("n"), "ok": True, "pid": pid}).encode() + b"\n")
            continue
        extra: dict = {}
        if isinstance(req.get("carry"), str):  # a copy's first cell: the state it carries first
            try:  # what re-running definitions and imports prints is not the cell's output
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    extra["carried"], extra["dropped"] = import_state(base64.b64decode(req["carry"]), namespace)
            except ValueError as exc:
                extra["carried"], extra["dropped"] = [], {"*": f"the carried state is not base64: {exc}"}
        ok, error = run_cell(str(req.get("code", "")), namespace)
        if os.getpid() != session[0]:
            os._exit(0)  # a copy the cell's own os.fork made: it never answers nor reads the next request
        lost = _streams() != streams  # a cell closed or replaced fd 1 or 2: later output never reaches the agent
        answers.write(json.dumps({"n": req.get("n"), "ok": ok, "error": error, "lost_output": lost,
                                  **extra}).encode() + b"\n")


if __name__ == "__main__":
    sys.exit(main())
