"""The one reader of a run's JSONL logs (``metrics.jsonl``, ``sft_metrics.jsonl``), and the reader
(:func:`read_json`) and atomic writer (:func:`write_atomic`) of its small JSON files (``config.json``): every
resume path reads its log through :func:`read_log`.

A log is written a row per line, appended as the run goes (``json.dumps(row) + "\\n"``, flushed). A process
killed mid-write leaves a torn last line (half a row, no newline); a power loss can leave NUL bytes where the
last rows should be, or bytes that are not UTF-8. That damage is at the end of the file, after the last whole
row: :func:`read_log` finds it (field case S57) and, asked to ``repair``, cuts it off (the bytes cut are
appended to ``<name>.torn`` beside the log, never lost) with a warning naming the file and the bytes. A whole
row whose newline was lost is kept (its newline written). A damaged line with whole rows after it is another
thing, corruption in the middle of the log: :class:`DamagedLogError`, naming the file and the line, and nothing
is changed.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

#: Bytes a line may hold besides its row (a torn tail's NUL padding counts as damage, not as these).
_BLANK = b" \t\r\n"


class DamagedLogError(ValueError):
    """A JSONL log damaged before its last whole row (corruption in the middle, not a torn tail).

    Attributes:
        path: the log.
        line: the 1-based number of the first damaged line.
    """

    def __init__(self, path: Path, line: int, reason: str, after: int):
        super().__init__(f"{path}: line {line} is damaged ({reason}) and {after} whole rows follow it; the log is "
                         "corrupt in the middle, not torn at its end, so nothing was dropped or changed (repair or "
                         "remove that line by hand)")
        self.path, self.line = path, line


@dataclass
class LogRead:
    """What :func:`read_log` found: ``rows`` (the whole rows, in order), ``lines`` (each row's line as written,
    without its newline), ``dropped`` (bytes of torn tail after them; cut off when repaired) and ``reason``
    (what the tail held, empty when ``dropped`` is 0)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    dropped: int = 0
    reason: str = ""


def _row(chunk: bytes) -> tuple[dict[str, Any] | None, str]:
    """``(row, "")`` when ``chunk`` (one line) holds a JSON object, else ``(None, why not)``."""
    if b"\0" in chunk:
        return None, "NUL bytes"
    try:
        value = json.loads(chunk.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "bytes that are not UTF-8"
    except ValueError:
        return None, "not a whole JSON row"
    return (value, "") if isinstance(value, dict) else (None, "not a JSON object")


def read_log(path: str | Path, *, repair: bool = False) -> LogRead:
    """Read the JSONL log ``path`` (none when it does not exist), tolerating a torn tail.

    Args:
        path: the log.
        repair: cut the torn tail off the file (appended to ``<name>.torn`` first) and end a whole last row
            that lost its newline with one, so appending to the log goes on after its last whole row; without
            it the file is left as it is (the tail is only ignored).

    Returns:
        A :class:`LogRead`; a torn tail is logged as a warning naming the file and the bytes dropped.

    Raises:
        DamagedLogError: a damaged line (half a row, NULs, not UTF-8, not an object) with whole rows after it.
        OSError: the file cannot be read (or, repairing, written).
    """
    path = Path(path)
    if not path.is_file():
        return LogRead()
    data = path.read_bytes()
    got = LogRead()
    end = 0  # the length of the good prefix: up to the last whole row's newline (or a blank line after it)
    bad: tuple[int, str] | None = None  # the first damaged line after `end`: (1-based number, reason)
    unended = b""  # a whole last row that lost its newline (kept, its newline written on repair)
    pos = number = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        stop = len(data) if nl < 0 else nl + 1
        number += 1
        chunk = data[pos:stop]
        if not chunk.strip(_BLANK):
            end = stop if bad is None else end
        else:
            text = chunk.rstrip(b"\0" + _BLANK) if nl < 0 else chunk  # a last line's NUL padding cut off
            row, reason = _row(text) if text else (None, "NUL bytes")
            if row is None:
                bad = bad or (number, reason)
            elif bad is not None:
                raise DamagedLogError(path, bad[0], bad[1], sum(1 for rest in data[pos:].split(b"\n")
                                                                if _row(rest)[0] is not None))
            else:
                got.rows.append(row)
                got.lines.append(text.decode("utf-8").rstrip("\r\n"))
                if nl < 0:
                    unended = text
                    end = pos
                else:
                    end = stop
        pos = stop
    tail = data[end + len(unended):]
    if not tail and not unended:
        return got
    got.dropped = len(tail)
    got.reason = bad[1] if bad else "NUL bytes" if b"\0" in tail else "blanks" if tail else ""
    if unended:
        got.reason = ", ".join(filter(None, ["a last row without its newline", got.reason]))
    kept = bool(tail.strip(b"\0" + _BLANK))  # bytes worth keeping: more than padding
    aside = path.with_name(path.name + ".torn")
    if repair:
        if kept:
            with aside.open("ab") as f:
                f.write(tail)
                f.flush()
                os.fsync(f.fileno())
        with path.open("r+b") as f:
            f.truncate(end)
            f.seek(end)
            if unended:
                f.write(unended + b"\n")
    log.warning("%s: torn tail (%s) after its %d whole rows: %d bytes %s", path, got.reason, len(got.rows),
                got.dropped, ("ignored" if not repair else f"cut off and kept in {aside}" if kept else "cut off")
                + ("" if not unended else ", the last row kept" + (" and ended" if repair else "")))
    return got


def write_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: a kill mid-write leaves the previous
    file whole (or none). Raises OSError as writing does."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_json(path: str | Path, *, fallback: Callable[[], Any] | None = None,
              fallback_name: str = "") -> dict[str, Any]:
    """The JSON object in the file ``path`` (a run's ``config.json``). One that cannot be read (torn by a kill
    or a power loss; field case S57) is rewritten from ``fallback()`` when that gives a dict (the copy in the
    run's resume state, named ``fallback_name`` in the warning), its bytes appended to ``<name>.torn`` first.

    Raises:
        ValueError: the file is not a JSON object and there is no fallback copy (the file unchanged).
        OSError: the file cannot be read (missing included) or rewritten.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        value = json.loads(data.decode("utf-8"))
        why = "" if isinstance(value, dict) else "not a JSON object"
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        value, why = None, f"{type(exc).__name__}: {exc}"
    if not why:
        return value
    copy = fallback() if fallback is not None else None
    if not isinstance(copy, dict):
        raise ValueError(f"{path} cannot be read ({why}) and no copy of it was saved elsewhere")
    with path.with_name(path.name + ".torn").open("ab") as f:
        f.write(data)
    write_atomic(path, json.dumps(copy, indent=2))
    log.warning("%s cannot be read (%s): rewritten from the copy in %s (its %d bytes kept in %s.torn)", path, why,
                fallback_name or "the fallback", len(data), path.name)
    return dict(copy)
