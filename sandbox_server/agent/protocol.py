"""The agent's protocol vocabulary: the documented limits, the session-environment allow-list, error
answers (:class:`Fail`, :func:`refused`), text helpers for capped output, and :class:`PathRewriter`
(host paths written back as sandbox paths). Standard library only.
"""

from __future__ import annotations

import os
import re

MARKER = "\n[... output cut at {cap} bytes]"

#: Bytes each writable area (/scratch, /tmp) may hold, counted per file in :data:`PAGE_BYTES` pages.
AREA_BYTES = 16 << 20
#: Allocation unit of the writable areas (tmpfs pages), in bytes: a 1-byte file takes 4096.
PAGE_BYTES = 4096
#: Most files one ``write`` may carry.
MAX_WRITE_FILES = 1000
#: Most entries (files, directories, links) one writable area may hold.
MAX_AREA_ENTRIES = 4096
#: Address space of each process a call starts (``RLIMIT_AS``), bytes: a memory bomb fails its allocation.
PROC_MEMORY_BYTES = 512 << 20
#: Files each process a call starts may hold open (``RLIMIT_NOFILE``).
PROC_OPEN_FILES = 256
#: Most bytes of a live interpreter's state carried by value in a snapshot (the runner fits its values in what the
#: rest of the state leaves; a larger state is not carried, and the snapshot says why).
INTERPRETER_STATE_BYTES = 8 << 20

#: Session environment variables a tool call may set: locale, time zone and display only. Everything
#: else (``LD_*``, ``PATH``, ``HOME``, ``PYTHON*``, ``GCONV_PATH``, ``LOCPATH``, ``MALLOC_*``,
#: ``GLIBC_TUNABLES``, ``IFS``, ``BASH_ENV``, ``ENV``, ``PERL5*``, ``POSIXLY_CORRECT``, ...) is refused.
SESSION_ENV_NAMES = frozenset({
    "LANG", "LANGUAGE", "LC_ALL", "LC_ADDRESS", "LC_COLLATE", "LC_CTYPE", "LC_IDENTIFICATION",
    "LC_MEASUREMENT", "LC_MESSAGES", "LC_MONETARY", "LC_NAME", "LC_NUMERIC", "LC_PAPER", "LC_TELEPHONE",
    "LC_TIME", "TZ", "TERM", "COLUMNS", "LINES", "NO_COLOR",
})
#: Most variables in a session environment.
MAX_ENV_VARS = 32
#: Longest value of a session environment variable, in characters.
MAX_ENV_VALUE_CHARS = 256

_LOCALE_RX = re.compile(r"[A-Za-z0-9_.@-]*\Z")  # a locale *name*: with a '/', glibc would load a path
_ENV_VALUE_RX = {
    "LANGUAGE": re.compile(r"[A-Za-z0-9_.@:-]*\Z"),
    "TZ": re.compile(r"[A-Za-z0-9_+:,./<>-]*\Z"),
    "TERM": re.compile(r"[A-Za-z0-9_.+-]*\Z"),
    "COLUMNS": re.compile(r"[0-9]{1,5}\Z"),
    "LINES": re.compile(r"[0-9]{1,5}\Z"),
    "NO_COLOR": re.compile(r"[\x20-\x7e]*\Z"),
}


def env_problems(env: object) -> list[str]:
    """Everything wrong with a session environment, one line per variable (empty when it is allowed).

    Allowed: at most :data:`MAX_ENV_VARS` variables named in :data:`SESSION_ENV_NAMES`, each a ``str``
    of at most :data:`MAX_ENV_VALUE_CHARS` characters without NUL, and of the form its name takes: locale
    names (``LANG``, ``LC_*``) without ``/``; ``TZ`` a zone name or POSIX rule, never a path outside the
    zone database (``/`` or ``:/`` first, or ``..``); ``TERM`` a plain name; ``COLUMNS`` / ``LINES`` digits.
    """
    if not isinstance(env, dict):
        return [f"the session environment must be an object of name: value, got {type(env).__name__}"]
    out: list[str] = []
    if len(env) > MAX_ENV_VARS:
        out.append(f"{len(env)} variables; the limit is {MAX_ENV_VARS}")
    names = [k for k in env if not (isinstance(k, str) and k in SESSION_ENV_NAMES)]
    if names:
        shown = sorted(k if isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) else repr(k)
                       for k in names)
        out.append(f"variable{'s' if len(names) > 1 else ''} not allowed: {', '.join(shown)} (allowed: locale, "
                   f"time zone and display variables only: {', '.join(sorted(SESSION_ENV_NAMES))})")
    for k, v in env.items():
        if not isinstance(k, str) or k not in SESSION_ENV_NAMES:
            continue
        if not isinstance(v, str):
            out.append(f"{k}: the value must be a string, got {type(v).__name__}")
        elif "\x00" in v:
            out.append(f"{k}: the value contains a NUL byte")
        elif len(v) > MAX_ENV_VALUE_CHARS:
            out.append(f"{k}: the value is {len(v)} characters long; the limit is {MAX_ENV_VALUE_CHARS}")
        elif not _ENV_VALUE_RX.get(k, _LOCALE_RX).match(v):
            out.append(f"{k}: the value {v[:64]!r} has characters this variable does not take")
        elif k == "TZ" and (v.lstrip(":").startswith("/") or ".." in v):
            out.append(f"{k}: the value {v[:64]!r} names a file outside the time zone database")
    return out


def utf8_cut(data: bytes) -> bytes:
    """Drop an incomplete UTF-8 sequence at the end of ``data`` (so a cut never splits a character)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if b & 0x80 == 0:  # ASCII: nothing incomplete
            return data
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return data if back >= need else data[: n - back]
    return data


def decode(data: bytes) -> str:
    """Decode bytes as UTF-8 with U+FFFD for invalid sequences."""
    return data.decode("utf-8", errors="replace")


def within(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies beneath it, component-wise (never a string-prefix test)."""
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


def pages(size: int) -> int:
    """Bytes a file of ``size`` bytes takes in a writable area (whole :data:`PAGE_BYTES` pages)."""
    return -(-size // PAGE_BYTES) * PAGE_BYTES


# -- host paths back to sandbox paths ---------------------------------------------------------------

class PathRewriter:
    """Streaming replacement of host roots by their sandbox paths (``/root/.cache/.../scratch`` -> ``/scratch``).

    ``pairs``: (host bytes, sandbox bytes). A host root is replaced only where the next byte cannot
    continue a file name (so ``/x/data2`` is not taken for ``/x/data`` + ``2``). :meth:`feed` holds back
    the last ``len(longest root)`` bytes until more data or the end shows whether they start a root.
    """

    _NAME = rb"[A-Za-z0-9_.+@~\x80-\xff-]"

    def __init__(self, pairs: list[tuple[bytes, bytes]]):
        pairs = sorted({h: s for h, s in pairs if h and h != s}.items(), key=lambda p: -len(p[0]))
        self.map = dict(pairs)
        self.rx = re.compile(b"(" + b"|".join(re.escape(h) for h, _ in pairs) + b")(?!" + self._NAME + b")") \
            if pairs else None
        self.hold = max((len(h) for h, _ in pairs), default=0) + 1
        self.buf = bytearray()

    def feed(self, data: bytes, final: bool = False) -> bytes:
        """Add ``data``; return the rewritten bytes that are now certain (everything when ``final``)."""
        if self.rx is None:
            return bytes(data)
        self.buf += data
        limit = len(self.buf) if final else len(self.buf) - self.hold
        if limit <= 0:
            return b""
        out = bytearray()
        pos = 0
        for m in self.rx.finditer(self.buf):
            if m.start() >= limit:
                break
            out += self.buf[pos:m.start()]
            out += self.map[m.group(1)]
            pos = m.end()
        end = max(pos, limit)
        out += self.buf[pos:end]
        del self.buf[:end]
        return bytes(out)

    def text(self, s: str) -> str:
        """Rewrite a whole string (messages)."""
        if self.rx is None or not s:
            return s
        b = s.encode("utf-8", "surrogateescape")
        return PathRewriter(list(self.map.items())).feed(b, final=True).decode("utf-8", "surrogateescape")


# -- answers ---------------------------------------------------------------------------------------------

class Fail(Exception):
    """An error answer: ``kind`` is the ``error_kind`` (limit | refused | unsupported | error)."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind


def mib(n: int) -> str:
    """``n`` bytes in MiB, as text (``"16 MiB"``)."""
    return f"{n / (1 << 20):g} MiB"


def refused(message: str) -> dict:
    """The ``exec`` answer of a call refused before anything ran (``status: "refused"``, ``message``)."""
    return {"stdout": "", "stderr": "", "exit_code": None, "status": "refused", "truncated": False,
            "duration_s": 0.0, "message": message}

