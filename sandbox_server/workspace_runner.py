"""The workspace tool family's file editor: a fixed, standard-library-only program that runs **in the sandbox**.

The ``workspace`` tools of :data:`sandbox_server.tools.TOOLS` that change files (``write_file``, ``replace_in_file``,
``make_dir``, ``remove``) run the sandbox image's own ``python3`` in isolated mode on this module's source, passed
with ``-c`` (``python3 -I -S -B -c SOURCE OP PATH [ARG ...]``), as the ``sql`` family runs
:mod:`sandbox_server.sql_runner`: nothing is installed in the image for it, and the caller's text is argv items,
never code. Python >= 3.9; imports nothing outside the standard library and nothing of forkyard.

What keeps the writes inside the workspace (``/scratch``), each enough on its own:

* the server refuses a path that is not under the workspace before anything runs (:mod:`sandbox_server.tools`),
  and the agent resolves it on the sandbox's file system (symbolic links included) inside the readable roots;
* every other place a process could write is read-only or private (``/data`` is a read-only bind, ``/tmp`` a tmpfs
  of the sandbox's own), and the file-size limit (``RLIMIT_FSIZE``) and the area's tmpfs size bound what one write
  can take;
* this program never follows a symbolic link at the last component of what it writes, removes or replaces
  (``O_NOFOLLOW``; a link itself is removed, never its target), and refuses to remove the workspace itself.

Operations (``OP``), each printing one line that says what was done (exit status 0), or why nothing was (status 1,
the reason on stderr):

``write PATH TEXT``
    Write ``TEXT`` (UTF-8) to ``PATH``, replacing it; missing parent directories are made.
``replace PATH OLD NEW``
    Replace the one occurrence of ``OLD`` in the text file ``PATH`` by ``NEW``; refused when ``OLD`` occurs zero
    times or more than once (the count is said), as the string-replace editors of coding agents do. Prints the
    changed lines with their numbers.
``mkdir PATH``
    Make the directory ``PATH`` and its missing parents.
``remove PATH``
    Remove the file, link or directory (with everything in it) ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys

#: Lines of context printed around a replacement.
CONTEXT_LINES = 3


class _Refused(Exception):
    pass


def _write(path: str, text: str) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    data = text.encode("utf-8", "surrogateescape")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return f"wrote {len(data)} bytes to {path}"


def _read_text(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise _Refused(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise _Refused(f"{path} is not a regular file")
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Refused(f"{path} is not UTF-8 text") from None


def _replace(path: str, old: str, new: str) -> str:
    if not old:
        raise _Refused("the text to replace is empty")
    text = _read_text(path)
    count = text.count(old)
    if count != 1:
        where = "does not occur" if count == 0 else f"occurs {count} times (give more of the lines around it)"
        raise _Refused(f"the text to replace {where} in {path}; nothing was changed")
    start = text.index(old)
    out = text[:start] + new + text[start + len(old):]
    _write(path, out)
    first = text.count("\n", 0, start)
    lines = out.split("\n")
    lo, hi = max(0, first - CONTEXT_LINES), min(len(lines), first + new.count("\n") + 1 + CONTEXT_LINES)
    shown = "\n".join(f"{i + 1:6d}\t{lines[i]}" for i in range(lo, hi))
    return f"replaced 1 occurrence in {path}; lines {lo + 1}-{hi} now read:\n{shown}"


def _mkdir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    if not os.path.isdir(path) or os.path.islink(path):
        raise _Refused(f"{path} exists and is not a directory")
    return f"made directory {path}"


def _remove(path: str, workspace: str) -> str:
    if os.path.realpath(path) == os.path.realpath(workspace):
        raise _Refused("the workspace itself cannot be removed")
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise _Refused(f"cannot remove {path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        stack = [path]  # folders the episode made unreadable or unwritable: their owner opens them first
        while stack:
            d = stack.pop()
            os.chmod(d, 0o700)
            with os.scandir(d) as it:
                stack += [e.path for e in it if e.is_dir(follow_symlinks=False)]
        shutil.rmtree(path)
        return f"removed directory {path}"
    os.unlink(path)
    return f"removed {path}"


def main(argv: list[str]) -> int:
    """Run one operation (module docstring) on ``argv`` = ``[OP, PATH, ARG...]``. Returns the exit status."""
    ops = {"write": 2, "replace": 3, "mkdir": 1, "remove": 1}
    if not argv or argv[0] not in ops or len(argv) != ops[argv[0]] + 1:
        print(f"usage: OP PATH [ARG ...], OP one of {', '.join(ops)}", file=sys.stderr)
        return 2
    op, path, *args = argv
    try:
        if op == "write":
            msg = _write(path, args[0])
        elif op == "replace":
            msg = _replace(path, args[0], args[1])
        elif op == "mkdir":
            msg = _mkdir(path)
        else:
            msg = _remove(path, os.environ.get("HOME", "/scratch"))
    except _Refused as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{op} {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(msg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
