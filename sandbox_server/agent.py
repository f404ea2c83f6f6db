"""The in-sandbox agent: the main process of every sandbox. Standard library only (Python >= 3.9).

Why one file: it is copied alone into every sandbox image (``/opt/forkyard/agent.py``) and bind-mounted
alone into every local sandbox, then run as ``python3 -I``: no package, no sibling module, nothing from
the host's site-packages is there to import. Its sections (protocol, confinement, exec, pack / unpack,
writes) follow the operations below.

It reads one JSON request per line on stdin and writes one JSON answer per line on stdout; every
request carries an ``id`` that the answer echoes. The server talks to a Docker container through its
attached stdio (so the container keeps ``network_mode=none``) and to a local sandbox through pipes.

Operations (``op``):

``ping``
    ``{"pong": true, "pid": ..., "confinement": {...}, "limits": {...}}``: how this agent is confined
    (``noexec``: the writable areas are mounted ``noexec`` by this agent; ``landlock_abi``: > 0 when
    only system directories may be executed; ``caps_dropped``) and the limits below.
``exec``
    ``argv`` (list of str, run directly, never through a shell), ``cwd`` (sandbox path under a readable
    root), ``env`` (dict; only the names in :data:`SESSION_ENV_NAMES` with plain values, see
    :func:`env_problems`; anything else refuses the call), ``timeout_s`` (seconds), ``cap_bytes`` (output
    cap, bytes), ``path_args`` (indices of ``argv`` items that are paths; each must resolve, symlinks
    included, inside one of the agent's readable roots, or the call is refused and nothing runs). The
    child runs in its own process group (new session) with an empty stdin; its output is read while it
    runs and the child is stopped at the cap; at the deadline the whole group is killed. Answer:
    ``stdout``, ``stderr``, ``exit_code``, ``status`` (ok|timeout|refused|error), ``truncated``,
    ``duration_s``, ``message``.
``pack`` / ``unpack``
    Pack the writable areas into a base64 PAX tar (``data``), or replace their contents with one.
    Carried: regular files, directories, symbolic links and hard links within the writable areas, with
    their permission bits (setuid/setgid dropped) and modification times to the nanosecond. Anything else
    (FIFOs, sockets, devices) makes ``pack`` refuse (``error_kind: "unsupported"``) naming the path:
    nothing is ever dropped silently.
``write``
    ``files``: {relative path: base64 bytes} written under the first writable area (``/scratch``); at
    most :data:`MAX_WRITE_FILES` files per write, and the area's limits hold (below). A write that
    fails keeps none of its files (files it was replacing are removed too).
``ps``
    Command lines of the processes visible to the agent (tests use it to prove nothing was left).
``recycle``
    Reset the sandbox for another session, then check it (the pool hands a sandbox out again only when
    the answer's ``clean`` is true): SIGKILL every other process (``--isolated``: every process of the
    namespace but the agent and its ancestors, i.e. the container's or bubblewrap's init; otherwise only
    the agent's descendants), empty the writable areas and put back their modes and times as they were
    at start, and with ``--isolated`` remove whatever appeared in any other place the agent may write
    (``/dev/shm``, ``/dev/mqueue``, bubblewrap's root) and every System V IPC object. Answer: ``clean``,
    ``killed`` (processes), ``problems`` (one line per thing that could not be reset), ``duration_s``.

Errors are answered as ``{"error": message, "error_kind": kind}`` with ``kind`` one of ``limit`` (a
documented limit would be passed: nothing was written), ``refused`` (a bad request: nothing was done),
``unsupported`` (the writable areas hold something a snapshot cannot carry), ``isolation`` (the
confinement asked for could not be set up: the agent serves nothing) or ``error``.

Limits of each writable area (``/scratch`` and ``/tmp`` each): :data:`AREA_BYTES` bytes (16 MiB; set by
``--area-bytes``) counted as tmpfs counts them, each regular file taking its size rounded up to
:data:`PAGE_BYTES` (4 KiB); at most :data:`MAX_AREA_ENTRIES` entries (files, directories, links).

Paths are *sandbox paths* (``/data/x``); ``--root SANDBOX=HOST`` maps them onto host directories when
the agent runs without a mount namespace (the local backend's unsafe unisolated mode). In Docker and
under bubblewrap every mapping is the identity. Whatever the mapping, no host path reaches an answer:
the host roots are written back as sandbox paths in ``stdout``, ``stderr``, ``message`` and ``error``
(in the output streams *before* the cap is applied, so the cap counts the bytes the caller sees).

Confinement set up at start: ``--confine`` (the local backend under bubblewrap) remounts the writable
areas ``noexec,nosuid,nodev`` (in a nested user namespace when the agent has no capability of its own)
and drops every capability; failure is fatal. Always, where the kernel offers Landlock, execution is
restricted to the system directories (``/usr``, ``/bin``, ``/sbin``, ``/lib*``), so nothing uploaded
can be executed even without a mount namespace.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import errno
import io
import json
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time

MARKER = "\n[... output cut at {cap} bytes]"

#: Bytes each writable area (/scratch, /tmp) may hold, counted per file in :data:`PAGE_BYTES` pages.
AREA_BYTES = 16 << 20
#: Allocation unit of the writable areas (tmpfs pages), in bytes: a 1-byte file takes 4096.
PAGE_BYTES = 4096
#: Most files one ``write`` may carry.
MAX_WRITE_FILES = 1000
#: Most entries (files, directories, links) one writable area may hold.
MAX_AREA_ENTRIES = 4096

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
        shown = sorted(k if isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) else repr(k) for k in names)
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


def _within(path: str, root: str) -> bool:
    """Component-wise containment (never a string-prefix test)."""
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:
        return False


def _pages(size: int) -> int:
    """Bytes a file of ``size`` bytes takes in a writable area (whole :data:`PAGE_BYTES` pages)."""
    return -(-size // PAGE_BYTES) * PAGE_BYTES


# -- host paths back to sandbox paths -------------------------------------------------------------------

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


# -- confinement ------------------------------------------------------------------------------------------

_MS = {"ro": 0x1, "nosuid": 0x2, "nodev": 0x4, "noexec": 0x8, "noatime": 0x400, "nodiratime": 0x800,
       "relatime": 0x200000}
_MS_REMOUNT, _MS_BIND = 0x20, 0x1000
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_ACCESS_FS_EXECUTE = 1
#: Directories whose programs may be executed (Landlock), where they exist.
EXEC_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def mount_options(path: str) -> set[str] | None:
    """Per-mount options of the topmost mount at ``path`` (``/proc/self/mountinfo``), or None if none."""
    found = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])
                if point == path:
                    found = set(parts[5].split(","))
    except OSError:
        return None
    return found


def _remount_noexec(libc, ctypes, path: str) -> None:
    opts = mount_options(path)
    if opts is None:
        raise OSError(errno.EINVAL, f"{path} is not a mount point")
    flags = _MS_REMOUNT | _MS_BIND | _MS["noexec"] | _MS["nosuid"] | _MS["nodev"]
    for name in ("ro", "noatime", "nodiratime", "relatime"):
        if name in opts:
            flags |= _MS[name]
    if libc.mount(None, path.encode(), None, ctypes.c_ulong(flags), None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"remounting {path} noexec: {os.strerror(e)}")


def confine(areas: list[str]) -> dict:
    """Remount each writable area ``noexec,nosuid,nodev`` and drop every capability (``--confine``).

    Tries the remount directly (the agent owns its mount namespace's capabilities when bubblewrap runs as
    root), else in a nested user + mount namespace (bubblewrap as an ordinary user). Then empties the
    capability sets (bounding set included) and sets ``no_new_privs``. Returns what was done; raises
    ``OSError`` with the reason when any step fails (the sandbox must then not serve).
    """
    ctypes, libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    try:
        for a in areas:
            _remount_noexec(libc, ctypes, a)
        how = "direct"
    except OSError:
        if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"unshare(user, mount namespace): {os.strerror(e)}") from None
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            try:
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
            except FileNotFoundError:
                if name != "setgroups":
                    raise
        for a in areas:
            _remount_noexec(libc, ctypes, a)
        how = "nested user namespace"
    for a in areas:
        if "noexec" not in (mount_options(a) or set()):
            raise OSError(errno.EPERM, f"{a} is still executable after the remount")
    # Drop every capability: bounding set (so an exec as uid 0 gains none), then the process's own sets.
    for cap in range(64):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"capset: {os.strerror(e)}")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(no_new_privs) failed")
    caps = _capabilities()
    if caps.get("CapEff", 1) or caps.get("CapPrm", 1) or (os.getuid() == 0 and caps.get("CapBnd", 1)):
        raise OSError(errno.EPERM, f"capabilities left after dropping them: {caps}")
    return {"noexec": list(areas), "remount": how, "caps_dropped": True}


def _capabilities() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Cap"):
                    k, v = line.split(":", 1)
                    out[k] = int(v.strip(), 16)
    except OSError:
        pass
    return out


def restrict_exec(roots: list[str]) -> int:
    """Allow execution only beneath ``roots`` (Landlock, inherited by every child). Returns the Landlock
    ABI version in force, or 0 when the kernel offers none (then nothing changed)."""
    try:
        ctypes, libc = _libc()
        sc = libc.syscall
        sc.restype = ctypes.c_long
        abi = sc(ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
        if abi < 1:
            return 0
        attr = ctypes.c_uint64(_LANDLOCK_ACCESS_FS_EXECUTE)
        rfd = sc(ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
        if rfd < 0:
            return 0
        try:
            for r in roots:
                try:
                    pfd = os.open(r, os.O_PATH | os.O_CLOEXEC | os.O_DIRECTORY)
                except OSError:
                    continue
                try:
                    rule = ctypes.create_string_buffer(
                        _LANDLOCK_ACCESS_FS_EXECUTE.to_bytes(8, sys.byteorder) + pfd.to_bytes(4, sys.byteorder, signed=True), 12)
                    sc(ctypes.c_long(_SYS_LANDLOCK_ADD_RULE), ctypes.c_int(rfd), ctypes.c_int(1), rule, ctypes.c_uint32(0))
                finally:
                    os.close(pfd)
            libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            if sc(ctypes.c_long(_SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(rfd), ctypes.c_uint32(0)) != 0:
                return 0
        finally:
            os.close(rfd)
        return int(abi)
    except Exception:
        return 0


# -- the agent ------------------------------------------------------------------------------------------

class _Fail(Exception):
    """An error answer: ``kind`` is the ``error_kind`` (limit | refused | unsupported | error)."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


class Agent:
    """State of one agent process: the root mapping, the writable areas and their limits.

    Args:
        roots: {sandbox path: host path}; identity where absent.
        readable: sandbox roots tools may read.
        writable: writable areas (packed by snapshots; the first takes ``write``).
        area_bytes / max_write_files / max_area_entries: the limits (bytes; files; entries).
    """

    def __init__(self, roots: dict[str, str], readable: list[str], writable: list[str], *,
                 area_bytes: int = AREA_BYTES, max_write_files: int = MAX_WRITE_FILES,
                 max_area_entries: int = MAX_AREA_ENTRIES):
        self.roots = {os.path.normpath(k): os.path.normpath(v) for k, v in roots.items()}
        self.readable = [os.path.normpath(r) for r in readable]
        self.writable = [os.path.normpath(w) for w in writable]
        self.area_bytes = area_bytes
        self.max_write_files = max_write_files
        self.max_area_entries = max_area_entries
        self.confinement: dict = {}
        self.fatal: str | None = None
        #: What :meth:`op_recycle` resets to (set by :meth:`record_baseline`): the areas' stat at start,
        #: other writable places {dir: (stat, entries)}, the kill scope (``namespace``, ``descendants`` or
        #: None: recycling refused, ``scope_problem`` says why).
        self.areas0: dict[str, os.stat_result] | None = None
        self.places0: dict[str, tuple[os.stat_result, dict]] = {}
        self.scope: str | None = None
        self.scope_problem = "the agent recorded no baseline to reset to"
        pairs = []
        for s, h in self.roots.items():
            for hv in {h, os.path.realpath(h)}:
                if hv != s:
                    pairs.append((os.fsencode(hv), os.fsencode(s)))
        self._pairs = pairs

    # -- path mapping ---------------------------------------------------------------------------
    def host(self, sandbox_path: str) -> str:
        """Map a sandbox path to a host path (identity where no root maps it)."""
        p = os.path.normpath(sandbox_path)
        best = None
        for s in self.roots:
            if _within(p, s) and (best is None or len(s) > len(best)):
                best = s
        if best is None:
            return p
        rel = os.path.relpath(p, best)
        return self.roots[best] if rel == "." else os.path.join(self.roots[best], rel)

    def rewriter(self) -> PathRewriter | None:
        """A fresh stream rewriter of host roots to sandbox paths (None when every mapping is the identity)."""
        return PathRewriter(self._pairs) if self._pairs else None

    def to_sandbox(self, text: str) -> str:
        """``text`` with every host root written as its sandbox path."""
        rw = self.rewriter()
        return rw.text(text) if rw else text

    def check_path(self, cwd: str, arg: str) -> str | None:
        """Return an error message if ``arg`` (relative to sandbox ``cwd``) escapes the readable roots."""
        virt = os.path.normpath(os.path.join(cwd, arg))
        if not any(_within(virt, r) for r in self.readable):
            return f"path {arg!r} resolves to {virt}, outside {', '.join(self.readable)}"
        real = os.path.realpath(self.host(virt))
        real_roots = [os.path.realpath(self.host(r)) for r in self.readable]
        if not any(_within(real, r) for r in real_roots):
            return f"path {arg!r} leaves {', '.join(self.readable)} through a symbolic link"
        return None

    def _area_of(self, virt: str) -> str | None:
        for w in self.writable:
            if _within(virt, w):
                return w
        return None

    # -- operations -----------------------------------------------------------------------------
    def op_exec(self, req: dict) -> dict:
        argv = req.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            return _refused("argv must be a non-empty list of strings")
        if any("\x00" in a for a in argv):
            return _refused("argv contains a NUL byte")
        problems = env_problems(req.get("env") or {})
        if problems:
            return _refused("session environment refused: " + "; ".join(problems))
        cwd = req.get("cwd") or (self.readable[0] if self.readable else "/")
        if not isinstance(cwd, str) or not cwd.startswith("/") or "\x00" in cwd \
                or not any(_within(os.path.normpath(cwd), r) for r in self.readable):
            return _refused(f"cwd {cwd!r} is outside {', '.join(self.readable)}")
        argv = list(argv)
        for i in req.get("path_args") or []:
            if not (isinstance(i, int) and 0 <= i < len(argv)):
                return _refused(f"path_args index {i} out of range")
            err = self.check_path(cwd, argv[i])
            if err:
                return _refused(err)
            if os.path.isabs(argv[i]):
                argv[i] = self.host(argv[i])  # identity in Docker / bubblewrap
        timeout = float(req.get("timeout_s", 10.0))
        cap = int(req.get("cap_bytes", 65536))
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "TZ": "UTC",
               "HOME": self.writable[0] if self.writable else "/tmp"}
        env.update(req.get("env") or {})
        return run_capped(argv, self.host(cwd), env, timeout, cap, self.rewriter if self._pairs else None)

    # pack / unpack ---------------------------------------------------------------------------------
    def op_pack(self, req: dict) -> dict:
        buf = io.BytesIO()
        seen: dict[tuple[int, int], str] = {}
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for w in self.writable:
                h = self.host(w)
                if os.path.isdir(h):
                    self._pack_tree(tar, h, w, seen)
        return {"data": base64.b64encode(buf.getvalue()).decode("ascii"), "size_bytes": buf.tell()}

    def _pack_tree(self, tar: tarfile.TarFile, host_root: str, virt_root: str, seen: dict) -> None:
        stack = [(host_root, virt_root)]
        while stack:
            hpath, vpath = stack.pop()
            st = os.lstat(hpath)
            ti = tarfile.TarInfo(vpath.lstrip("/"))
            ti.mode = stat.S_IMODE(st.st_mode) & ~0o6000
            ti.mtime = st.st_mtime_ns // 1_000_000_000
            ti.pax_headers = {"FORKYARD.mtime_ns": str(st.st_mtime_ns)}
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            if stat.S_ISDIR(st.st_mode):
                ti.type = tarfile.DIRTYPE
                tar.addfile(ti)
                with _readable(hpath, st, 0o500):
                    names = os.listdir(hpath)
                for name in sorted(names, reverse=True):
                    stack.append((os.path.join(hpath, name), f"{vpath}/{name}"))
            elif stat.S_ISREG(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if st.st_nlink > 1 and key in seen:
                    ti.type = tarfile.LNKTYPE
                    ti.linkname = seen[key]
                    tar.addfile(ti)
                else:
                    seen[key] = ti.name
                    ti.size = st.st_size
                    with _readable(hpath, st, 0o400), open(hpath, "rb") as f:
                        tar.addfile(ti, f)
            elif stat.S_ISLNK(st.st_mode):
                ti.type = tarfile.SYMTYPE
                ti.linkname = os.readlink(hpath)
                tar.addfile(ti)
            else:
                kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                        else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a special file")
                raise _Fail(f"cannot snapshot {vpath}: it is {kind}; snapshots carry regular files, directories, "
                            "symbolic links and hard links only (remove it first)", "unsupported")

    def op_unpack(self, req: dict) -> dict:
        try:
            raw = base64.b64decode(req.get("data") or "", validate=True)
        except (binascii.Error, ValueError) as exc:
            raise _Fail(f"the archive is not base64: {exc}", "refused") from None
        members: list[tarfile.TarInfo] = []
        tar = None
        if raw:
            try:
                tar = tarfile.open(fileobj=io.BytesIO(raw), mode="r")
                members = tar.getmembers()
            except tarfile.TarError as exc:
                raise _Fail(f"the archive cannot be read: {exc}", "refused") from None
        files_seen: set[str] = set()
        usage = {w: [0, 0] for w in self.writable}  # bytes, entries
        for m in members:
            virt = os.path.normpath("/" + m.name)
            area = self._area_of(virt)
            if area is None or (virt == area and not m.isdir()):
                raise _Fail(f"archive member {m.name!r} outside the writable areas", "refused")
            if not (m.isdir() or m.isreg() or m.issym() or m.islnk()):
                raise _Fail(f"archive member {virt} is not a file, directory or link", "unsupported")
            if virt != area:
                usage[area][1] += 1
            if m.isreg():
                usage[area][0] += _pages(m.size)
                files_seen.add(virt)
            if m.islnk():
                target = os.path.normpath("/" + m.linkname)
                if target not in files_seen:
                    raise _Fail(f"hard link {virt} -> {target}: the target is not an earlier file of the archive",
                                "refused")
        for w, (nbytes, entries) in usage.items():
            self._check_limits(w, nbytes, entries, what="the snapshot")
        for w in self.writable:
            _clear(self.host(w))
        dirs: list[tuple[str, int, int]] = []
        try:
            for m in members:
                self._extract(tar, m, dirs)
            for dest, mode, mtime_ns in sorted(dirs, key=lambda d: -d[0].count("/")):
                try:
                    os.chmod(dest, mode)
                    os.utime(dest, ns=(mtime_ns, mtime_ns))
                except OSError:
                    if dest not in {self.host(w) for w in self.writable}:
                        raise
        except (OSError, _Fail) as exc:
            for w in self.writable:
                _clear(self.host(w))
            if isinstance(exc, _Fail):
                raise
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _Fail(f"restoring the snapshot filled a writable area: {self._limit_text()}", "limit") from None
            raise _Fail(f"restoring the snapshot failed: {exc}") from None
        return {"ok": True}

    def _extract(self, tar: tarfile.TarFile, m: tarfile.TarInfo, dirs: list) -> None:
        virt = os.path.normpath("/" + m.name)
        area = self._area_of(virt)
        dest = self.host(virt)
        mtime_ns = int(m.pax_headers.get("FORKYARD.mtime_ns") or int(m.mtime * 1_000_000_000))
        mode = m.mode & 0o1777
        if virt != area:
            self._make_parents(area, virt)
        if m.isdir():
            if not os.path.isdir(dest) or os.path.islink(dest):
                os.mkdir(dest, 0o700)
            dirs.append((dest, mode, mtime_ns))
            return
        if os.path.lexists(dest):
            if os.path.isdir(dest) and not os.path.islink(dest):
                raise OSError(errno.EISDIR, f"{virt} is a directory")
            os.unlink(dest)
        if m.isreg():
            src = tar.extractfile(m)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                shutil.copyfileobj(src, f)
                os.fchmod(f.fileno(), mode)
            os.utime(dest, ns=(mtime_ns, mtime_ns))
        elif m.issym():
            os.symlink(m.linkname, dest)
            try:
                os.utime(dest, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
            except (OSError, NotImplementedError):
                pass
        elif m.islnk():
            target = self.host(os.path.normpath("/" + m.linkname))
            try:
                os.link(target, dest, follow_symlinks=False)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                shutil.copyfile(target, dest, follow_symlinks=False)  # another area on another mount
                shutil.copystat(target, dest, follow_symlinks=False)

    def _make_parents(self, area: str, virt: str) -> list[str]:
        """Create the missing directories between ``area`` and ``virt`` (host side); refuse a symbolic link
        or a non-directory on the way. Returns the host directories created."""
        created = []
        rel = os.path.relpath(os.path.dirname(virt), area)
        cur = self.host(area)
        cur_virt = area
        for part in ([] if rel == "." else rel.split("/")):
            cur = os.path.join(cur, part)
            cur_virt = f"{cur_virt}/{part}"
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                os.mkdir(cur)
                os.chmod(cur, 0o755)
                created.append(cur)
                continue
            if stat.S_ISLNK(st.st_mode):
                raise _Fail(f"{cur_virt} is a symbolic link; files are never written through one", "refused")
            if not stat.S_ISDIR(st.st_mode):
                raise _Fail(f"{cur_virt} is a file, not a directory", "refused")
        return created

    # write -----------------------------------------------------------------------------------------
    def usage(self, area: str) -> tuple[int, int]:
        """(bytes in whole pages, entries) the writable ``area`` holds; hard-linked files count once."""
        nbytes, entries = 0, 0
        seen = set()
        stack = [self.host(area)]
        while stack:
            try:
                it = os.scandir(stack.pop())
            except OSError:
                continue
            with it:
                for e in it:
                    entries += 1
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(e.path)
                    elif stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        nbytes += _pages(st.st_size)
        return nbytes, entries

    def _limit_text(self) -> str:
        return (f"each writable area holds at most {self.area_bytes} bytes ({_mib(self.area_bytes)}, every file "
                f"counted in whole {PAGE_BYTES}-byte pages) and {self.max_area_entries} entries")

    def _check_limits(self, area: str, nbytes: int, entries: int, what: str) -> None:
        if nbytes > self.area_bytes:
            raise _Fail(f"{what} needs {nbytes} bytes in {area} ({_mib(nbytes)} in {PAGE_BYTES}-byte pages); "
                        f"{self._limit_text()}; nothing was written", "limit")
        if entries > self.max_area_entries:
            raise _Fail(f"{what} needs {entries} entries in {area}; {self._limit_text()}; nothing was written", "limit")

    def op_write(self, req: dict) -> dict:
        if not self.writable:
            raise _Fail("no writable area", "refused")
        base = self.writable[0]
        files = req.get("files") or {}
        if not isinstance(files, dict):
            raise _Fail("files must be an object of relative path: base64 bytes", "refused")
        if len(files) > self.max_write_files:
            raise _Fail(f"{len(files)} files in one write; the limit is {self.max_write_files} files per write; "
                        "nothing was written", "limit")
        plan: list[tuple[str, bytes]] = []
        for rel, b64 in files.items():
            if not isinstance(rel, str) or not rel or "\x00" in rel or os.path.isabs(rel):
                raise _Fail(f"file path {rel!r} must be relative and stay inside {base}", "refused")
            virt = os.path.normpath(os.path.join(base, rel))
            if not _within(virt, base) or virt == base:
                raise _Fail(f"file path {rel!r} must be relative and stay inside {base}", "refused")
            try:
                if not isinstance(b64, str):
                    raise ValueError
                data = base64.b64decode(b64, validate=True)
            except (binascii.Error, ValueError):
                raise _Fail(f"the content of {rel!r} is not base64", "refused") from None
            plan.append((virt, data))
        # Written in path order, the order in which a restore (a fork, a clone) recreates them from the
        # tar: a directory then lists its entries the same way in the copy as in the original.
        plan.sort(key=lambda item: item[0])
        virts = [v for v, _ in plan]
        if len(set(virts)) != len(virts):
            raise _Fail("two file paths of this write name the same file", "refused")
        vset = set(virts)
        new_entries, freed, need = 0, 0, 0
        new_dirs: set[str] = set()
        for virt, data in plan:
            parent = os.path.dirname(virt)
            while parent != base:
                if parent in vset:
                    raise _Fail(f"{parent} would be both a file and a directory", "refused")
                hp = self.host(parent)
                if os.path.islink(hp):
                    raise _Fail(f"{parent} is a symbolic link; files are never written through one", "refused")
                if os.path.lexists(hp) and not os.path.isdir(hp):
                    raise _Fail(f"{parent} is a file, not a directory", "refused")
                if not os.path.lexists(hp):
                    new_dirs.add(parent)
                parent = os.path.dirname(parent)
            dest = self.host(virt)
            try:
                st = os.lstat(dest)
            except FileNotFoundError:
                new_entries += 1
            else:
                if stat.S_ISDIR(st.st_mode):
                    raise _Fail(f"{virt} is a directory", "refused")
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    freed += _pages(st.st_size)
            need += _pages(len(data))
        used, entries = self.usage(base)
        total = sum(len(d) for _, d in plan)
        what = f"writing {len(plan)} file{'s' if len(plan) != 1 else ''} ({total} bytes)"
        self._check_limits(base, used - freed + need, entries + new_entries + len(new_dirs), what)
        try:
            vfs = os.statvfs(self.host(base))
            free = vfs.f_bavail * vfs.f_frsize
        except OSError:
            free = None
        if free is not None and need - freed > free:
            raise _Fail(f"{what} needs {need - freed} more bytes in {base} but only {free} are free; "
                        f"{self._limit_text()}; nothing was written", "limit")
        created_dirs: list[str] = []
        touched: list[str] = []
        try:
            for virt, data in plan:
                created_dirs += self._make_parents(base, virt)
                dest = self.host(virt)
                if os.path.lexists(dest):
                    os.unlink(dest)
                touched.append(dest)
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as f:
                    os.fchmod(f.fileno(), 0o644)
                    f.write(data)
        except (OSError, _Fail) as exc:
            for dest in touched:
                try:
                    os.unlink(dest)
                except OSError:
                    pass
            for d in reversed(created_dirs):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
            if isinstance(exc, _Fail):
                raise
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _Fail(f"{what}: {base} is full ({exc.strerror}); {self._limit_text()}; none of the files "
                            "of this write were kept", "limit") from None
            raise _Fail(f"{what} failed: {exc}; none of the files of this write were kept") from None
        return {"ok": True}

    def op_ps(self, req: dict) -> dict:
        procs = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        procs.append(f.read().replace(b"\x00", b" ").decode("utf-8", "replace").strip())
                except OSError:
                    pass
        return {"procs": procs}

    # recycle ---------------------------------------------------------------------------------------
    def record_baseline(self, isolated: bool) -> None:
        """Note what a fresh sandbox looks like, for :meth:`op_recycle` to put back and check: each writable
        area's mode, owner and times and, when ``isolated`` (the agent is the main process of its own PID,
        mount and IPC namespaces: a container or bubblewrap), every other place this agent may write and
        its entries. ``isolated`` is trusted only if every process the agent sees at this point is itself or
        one of its ancestors (a fresh sandbox's init); otherwise recycling is refused (``scope`` None)."""
        self.areas0 = {}
        for w in self.writable:
            try:
                self.areas0[w] = os.lstat(self.host(w))
            except OSError:
                pass
        self.places0 = {}
        if not isolated:
            self.scope = "descendants"
            return
        table = _proc_table()
        if set(table) - _lineage(os.getpid(), table):
            self.scope = None
            self.scope_problem = ("the agent was started as its sandbox's main process but sees processes that are "
                                  "not its own ancestors: it cannot tell which processes belong to the sandbox")
            return
        self.scope = "namespace"
        for d in _writable_places(skip=[*self.readable, *self.writable, "/proc", "/sys", "/usr", "/dev/pts"]):
            try:
                self.places0[d] = (os.lstat(d), _entries(d))
            except OSError:
                pass

    def op_recycle(self, req: dict) -> dict:
        """Reset the sandbox for another session and check it: kill every process but the agent (and its
        ancestors: the container's or bubblewrap's init) or, unisolated, every descendant of the agent; empty
        the writable areas and put their modes and times back; remove what appeared in any other writable
        place and every System V IPC object (isolated only); then look again. Answers ``clean`` (bool),
        ``killed`` (processes), ``problems`` (what could not be reset, one line each) and ``duration_s``."""
        t0 = time.monotonic()
        if self.areas0 is None:  # an agent made without main() (tests): this moment is its baseline
            self.record_baseline(False)
        scope = self.scope
        if scope is None:
            return {"clean": False, "killed": 0, "problems": [self.scope_problem], "duration_s": time.monotonic() - t0}
        limit_s = float(req.get("kill_timeout_s", 2.0))
        killed, problems = self._kill_strays(scope, limit_s)
        for w, st in self.areas0.items():
            h = self.host(w)
            _clear(h)
            _reset_dir(h, st)
        for d, (st, entries) in self.places0.items():
            for name in set(_entries(d)) - set(entries):
                _remove(os.path.join(d, name))
            _reset_dir(d, st, times=False)
        if scope == "namespace":
            _remove_sysv_ipc()
        problems += self._check_reset(scope, processes=not problems)  # processes left are named already
        return {"clean": not problems, "killed": killed, "problems": problems, "duration_s": time.monotonic() - t0}

    def _strays(self, scope: str) -> list[int]:
        """Pids of processes a reset must kill: every process of the namespace but the agent's lineage, or
        (``descendants``) the agent's descendants only."""
        table = _proc_table()
        me = os.getpid()
        if scope == "namespace":
            keep = _lineage(me, table)
            return sorted(p for p in table if p not in keep)
        kids: dict[int, list[int]] = {}
        for p, (ppid, _) in table.items():
            kids.setdefault(ppid, []).append(p)
        out, stack = [], [me]
        while stack:
            for c in kids.get(stack.pop(), []):
                out.append(c)
                stack.append(c)
        return sorted(out)

    def _kill_strays(self, scope: str, limit_s: float) -> tuple[int, list[str]]:
        """SIGKILL the strays until none is left (reaping those that are the agent's children), for at most
        ``limit_s`` seconds. Returns (pids killed, one line per process left or not killable)."""
        deadline = time.monotonic() + limit_s
        killed: set[int] = set()
        denied: dict[int, str] = {}
        while True:
            _reap()
            strays = self._strays(scope)
            if not strays:
                return len(killed), []
            for pid in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
                except PermissionError as exc:
                    denied[pid] = exc.strerror or "permission denied"
            if set(strays) <= set(denied) or time.monotonic() > deadline:
                break
            time.sleep(0.002)
        _reap()
        return len(killed), [f"process {_describe(p)} is still running"
                             + (f" (kill: {denied[p]})" if p in denied else f" {limit_s:g} s after SIGKILL")
                             for p in self._strays(scope)]

    def _check_reset(self, scope: str, processes: bool = True) -> list[str]:
        """What a fresh sandbox would not show: a process (when ``processes``), an entry in a writable area
        or another writable place, a changed mode, owner or time, a System V IPC object. One line each
        (empty: clean)."""
        problems = [f"process {_describe(p)} appeared during the reset" for p in self._strays(scope)] if processes else []
        for w, st in self.areas0.items():
            h = self.host(w)
            try:
                left = sorted(os.listdir(h))
                now = os.lstat(h)
            except OSError as exc:
                problems.append(f"{w} cannot be checked: {exc.strerror or exc}")
                continue
            if left:
                problems.append(f"{w} still holds {len(left)} entr{'ies' if len(left) > 1 else 'y'}: "
                                + ", ".join(f"{w}/{n}" for n in left[:5]))
            problems += _dir_differs(w, st, now, times=True)
        for d, (st, entries) in self.places0.items():
            try:
                cur = _entries(d)
                now = os.lstat(d)
            except OSError as exc:
                problems.append(f"{d} cannot be checked: {exc.strerror or exc}")
                continue
            extra = sorted(set(cur) - set(entries))
            if extra:
                problems.append(f"{d} holds entries a fresh sandbox does not have: "
                                + ", ".join(os.path.join(d, n) for n in extra[:5]))
            changed = sorted(n for n in entries if cur.get(n) != entries[n])
            if changed:
                problems.append(f"{d}: entries were removed or replaced: "
                                + ", ".join(os.path.join(d, n) for n in changed[:5]))
            problems += _dir_differs(d, st, now, times=False)
        if scope == "namespace":
            problems += [f"a System V IPC object is left: {x}" for x in _sysv_ipc()]
        return problems

    def handle(self, req: dict) -> dict:
        """Answer one request (never raises): errors become ``{"error", "error_kind"}``; host paths in
        ``error`` and ``message`` are written as sandbox paths."""
        if self.fatal is not None:
            return {"error": self.fatal, "error_kind": "isolation"}
        op = req.get("op")
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if op == "ping":
            return {"pong": True, "pid": os.getpid(), "confinement": self.confinement, "recycle_scope": self.scope,
                    "limits": {"area_bytes": self.area_bytes, "page_bytes": PAGE_BYTES,
                               "max_write_files": self.max_write_files, "max_area_entries": self.max_area_entries}}
        if fn is None:
            return {"error": f"unknown op {op!r}", "error_kind": "refused"}
        try:
            ans = fn(req)
        except _Fail as exc:
            ans = {"error": str(exc), "error_kind": exc.kind}
        except OSError as exc:
            ans = {"error": f"{type(exc).__name__}: {exc}", "error_kind": "error"}
        for k in ("error", "message"):
            if isinstance(ans.get(k), str):
                ans[k] = self.to_sandbox(ans[k])
        return ans


def _refused(message: str) -> dict:
    return {"stdout": "", "stderr": "", "exit_code": None, "status": "refused", "truncated": False,
            "duration_s": 0.0, "message": message}


class _readable:
    """Context: give the owner ``bits`` on ``path`` while inside when it lacks them (a 0000 file or a 0500
    directory made by the sandbox's own user), then put the mode (and times) back."""

    def __init__(self, path: str, st: os.stat_result, bits: int):
        self.path, self.st, self.bits = path, st, bits
        self.changed = False

    def __enter__(self) -> "_readable":
        mode = stat.S_IMODE(self.st.st_mode)
        if mode & self.bits != self.bits and not os.access(self.path, os.R_OK):
            try:
                os.chmod(self.path, mode | self.bits)
                self.changed = True
            except OSError:
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        if self.changed:
            try:
                os.chmod(self.path, stat.S_IMODE(self.st.st_mode))
                os.utime(self.path, ns=(self.st.st_atime_ns, self.st.st_mtime_ns))
            except OSError:
                pass


def _clear(path: str) -> None:
    """Empty the directory ``path`` (never following a link), whatever modes its subdirectories have."""
    if not os.path.isdir(path):
        return
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            p = os.path.join(root, d)
            if not os.path.islink(p):
                try:
                    os.chmod(p, 0o700)
                except OSError:
                    pass
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                os.unlink(p)
            except OSError:
                pass


# -- recycling: processes, places, IPC ------------------------------------------------------------------

def _proc_table() -> dict[int, tuple[int, str]]:
    """Every process in ``/proc``: {pid: (parent pid, state letter)}."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            rest = data[data.rindex(b")") + 2:].split()
            out[int(name)] = (int(rest[1]), rest[0].decode("ascii", "replace"))
        except (OSError, ValueError, IndexError):
            pass
    return out


def _lineage(pid: int, table: dict[int, tuple[int, str]]) -> set[int]:
    """``pid`` and its ancestors visible in ``table``."""
    out = set()
    while pid in table and pid not in out:
        out.add(pid)
        pid = table[pid][0]
    return out


def _describe(pid: int) -> str:
    """``pid (command line, uid N)`` of a process, as far as it can be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\x00", b" ").decode("utf-8", "replace").strip()
    except OSError:
        cmd = ""
    uid = "?"
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = line.split()[1]
                elif line.startswith("State:") and not cmd:
                    cmd = "state " + line.split(None, 1)[1].strip()
    except OSError:
        pass
    return f"{pid} ({cmd[:80] or '?'}, uid {uid})"


def _entries(d: str) -> dict[str, tuple[int, int]]:
    """{name: (inode, mode)} of the entries of directory ``d`` (links not followed)."""
    out = {}
    with os.scandir(d) as it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
                out[e.name] = (st.st_ino, st.st_mode)
            except OSError:
                out[e.name] = (0, 0)
    return out


def _writable_places(skip: list[str], depth: int = 3) -> list[str]:
    """Directories this process may write in, outside ``skip``: those found within ``depth`` levels of ``/``
    plus every writable mount point (``/proc/self/mountinfo``). Links are not followed."""
    skip_set = {os.path.normpath(s) for s in skip}
    found: list[str] = []
    seen: set[str] = set()

    def visit(d: str, level: int) -> None:
        if d in seen or d in skip_set:
            return
        seen.add(d)
        if os.access(d, os.W_OK):
            found.append(d)
        if level >= depth:
            return
        try:
            with os.scandir(d) as it:
                subs = [e.path for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for s in subs:
            visit(s, level + 1)

    visit("/", 0)
    try:
        with open("/proc/self/mountinfo") as f:
            points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4]) for line in f]
    except OSError:
        points = []
    for p in points:
        if not any(_within(p, s) for s in skip_set) and os.path.isdir(p) and not os.path.islink(p):
            visit(os.path.normpath(p), depth)
    return found


def _remove(path: str) -> None:
    """Remove ``path`` (a file, link or directory tree, whatever its modes); errors are left to the check."""
    if os.path.isdir(path) and not os.path.islink(path):
        _clear(path)
        try:
            os.rmdir(path)
        except OSError:
            pass
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def _reset_dir(path: str, st: os.stat_result, times: bool = True) -> None:
    """Put a directory's permission bits (and, ``times``, its access and modification times) back as ``st``
    recorded them; errors are left to the check."""
    try:
        if stat.S_IMODE(os.lstat(path).st_mode) != stat.S_IMODE(st.st_mode):
            os.chmod(path, stat.S_IMODE(st.st_mode))
        if times:
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    except OSError:
        pass


def _dir_differs(name: str, st: os.stat_result, now: os.stat_result, times: bool) -> list[str]:
    """Lines saying how directory ``name`` differs from its recorded state ``st`` (mode, owner, mtime)."""
    out = []
    if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
        out.append(f"{name} was replaced")
    if stat.S_IMODE(now.st_mode) != stat.S_IMODE(st.st_mode):
        out.append(f"{name} has mode {stat.S_IMODE(now.st_mode):04o}, not {stat.S_IMODE(st.st_mode):04o}")
    if (now.st_uid, now.st_gid) != (st.st_uid, st.st_gid):
        out.append(f"{name} is owned by {now.st_uid}:{now.st_gid}, not {st.st_uid}:{st.st_gid}")
    if times and now.st_mtime_ns != st.st_mtime_ns:
        out.append(f"{name} has another modification time than when the sandbox started")
    return out


_SYSV = (("shm", "shmctl"), ("sem", "semctl"), ("msg", "msgctl"))


def _sysv_ipc() -> list[str]:
    """System V IPC objects of this IPC namespace, ``kind id (key K, uid U)`` each (``/proc/sysvipc``)."""
    out = []
    for kind, _ in _SYSV:
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                head, *rows = f.read().splitlines()
        except (OSError, ValueError):
            continue
        cols = head.split()
        for row in rows:
            v = dict(zip(cols, row.split()))
            ident = v.get("shmid") or v.get("semid") or v.get("msqid")
            if ident is not None:
                out.append(f"{kind} {ident} (key {v.get('key')}, uid {v.get('uid')})")
    return out


def _remove_sysv_ipc() -> None:
    """Remove every System V IPC object of this IPC namespace that this process may remove (IPC_RMID)."""
    objs = _sysv_ipc()
    if not objs:
        return
    try:
        _, libc = _libc()
    except OSError:
        return
    fns = dict(_SYSV)
    for obj in objs:
        kind, ident = obj.split()[:2]
        fn = getattr(libc, fns[kind])
        try:
            fn(int(ident), 0, 0) if kind == "sem" else fn(int(ident), 0, None)  # IPC_RMID = 0
        except (ValueError, OSError):
            pass


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Stream:
    """One captured output stream: bytes kept (at most ``limit``), and its path rewriter."""

    def __init__(self, limit: int, rw: PathRewriter | None):
        self.buf = bytearray()
        self.limit = limit
        self.rw = rw
        self.done = False

    def add(self, chunk: bytes, final: bool = False) -> None:
        if self.rw is not None:
            chunk = self.rw.feed(chunk, final)
        room = self.limit - len(self.buf)
        if room > 0:
            self.buf += chunk[:room]


def run_capped(argv: list[str], cwd: str, env: dict, timeout_s: float, cap_bytes: int,
               rewriter: "object | None" = None) -> dict:
    """Run ``argv`` in a new session with empty stdin; read stdout/stderr while it runs.

    Stops the call's whole process group at ``cap_bytes`` of stdout or at ``timeout_s`` seconds. The call
    ends when the direct child has exited *and* both pipes are closed (a background child that keeps the
    pipe open keeps the call running until the deadline), after which the group is killed so nothing
    the call started survives it. ``rewriter``: a factory of :class:`PathRewriter` (or None) applied to
    both streams before the caps, and to the message. Returns the answer dict of the ``exec`` op.
    """
    t0 = time.monotonic()
    deadline = t0 + max(0.0, timeout_s)
    err_cap = min(cap_bytes, 16384)
    text = (lambda s: rewriter().text(s)) if rewriter else (lambda s: s)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=cwd, env=env, start_new_session=True, close_fds=True)
    except (OSError, ValueError) as exc:
        return {"stdout": "", "stderr": text(str(exc)), "exit_code": None, "status": "error", "truncated": False,
                "duration_s": time.monotonic() - t0, "message": text(f"could not start {argv[0]}: {exc}")}
    pgid = proc.pid
    out = _Stream(cap_bytes + 1, rewriter() if rewriter else None)
    err = _Stream(err_cap + 1, rewriter() if rewriter else None)
    truncated = False
    timed_out = False
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    open_streams = 2
    exited = False
    pidfd = -1
    try:
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ, None)
    except (AttributeError, OSError):
        pidfd = -1
    try:
        while open_streams or (pidfd >= 0 and not exited):
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(min(left, 0.5)):
                if key.data is None:  # the pidfd: the direct child exited
                    exited = True
                    sel.unregister(key.fileobj)
                    continue
                stream: _Stream = key.data
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                    stream.add(b"", final=True)
                    stream.done = True
                    continue
                stream.add(chunk)
                if len(stream.buf) >= stream.limit and stream is out:
                    truncated = True
                    break
                # stderr over its cap: keep reading (and dropping) so the child is not blocked
            if truncated:
                break
    finally:
        if timed_out or truncated:
            _killpg(pgid)
        sel.close()
        if pidfd >= 0:
            os.close(pidfd)
    for stream in (out, err):  # what a rewriter still held when the call was stopped
        if not stream.done:
            stream.add(b"", final=True)
    if len(out.buf) >= out.limit:
        truncated = True
    if not (timed_out or truncated):
        left = max(0.05, deadline - time.monotonic())
        try:
            proc.wait(left)
        except subprocess.TimeoutExpired:
            timed_out = True
    _killpg(pgid)  # nothing the call started outlives it
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    proc.stdout.close()
    proc.stderr.close()
    _wait_group_gone(pgid)
    status = "timeout" if timed_out else "ok"
    out_b = bytes(out.buf[:cap_bytes])
    err_trunc = len(err.buf) > err_cap
    err_b = bytes(err.buf[:err_cap])
    stdout = decode(utf8_cut(out_b) if truncated else out_b)
    if truncated:
        stdout += MARKER.format(cap=cap_bytes)
    stderr = decode(utf8_cut(err_b) if err_trunc else err_b)
    msg = ""
    if timed_out:
        msg = f"the call ran past its {timeout_s:g} s timeout and was killed"
    elif truncated:
        msg = f"the output passed the {cap_bytes}-byte cap; the call was stopped"
    return {"stdout": stdout, "stderr": stderr, "exit_code": None if (timed_out or truncated) else proc.returncode,
            "status": status, "truncated": truncated, "duration_s": time.monotonic() - t0, "message": msg}


def _wait_group_gone(pgid: int, limit_s: float = 2.0) -> None:
    """Reap and wait until no process of group ``pgid`` is left (the agent is a child subreaper)."""
    end = time.monotonic() + limit_s
    while True:
        _reap()
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if time.monotonic() > end:
            return
        _killpg(pgid)
        time.sleep(0.001)


def _become_subreaper() -> None:
    """Make orphans of tool calls re-parent to the agent (Linux prctl), so it can reap them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass


def _reap() -> None:
    """Reap any exited children (the agent may run as PID 1 and inherit orphans)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def setup(agent: Agent, confine_areas: bool) -> None:
    """Confine the agent (see the module docstring); on failure set ``agent.fatal`` (nothing is served)."""
    info: dict = {"noexec": [], "caps_dropped": False}
    if confine_areas:
        try:
            info.update(confine([agent.host(w) for w in agent.writable]))
        except OSError as exc:
            agent.fatal = (f"the sandbox's isolation could not be set up: {exc.strerror or exc}; the writable areas "
                           "must be mounted noexec (bubblewrap with user namespaces)")
    exec_roots = [r for r in EXEC_ROOTS if os.path.isdir(r)]
    if any(_within(os.path.realpath(agent.host(w)), os.path.realpath(r)) for w in agent.writable for r in exec_roots):
        info["landlock_abi"] = 0  # a writable area under a system directory: Landlock could not tell them apart
    else:
        info["landlock_abi"] = restrict_exec(exec_roots)
    agent.confinement = info


def main(argv: list[str] | None = None) -> int:
    """Serve JSON-line requests on stdin until EOF. Returns the exit status."""
    ap = argparse.ArgumentParser(description="forkyard in-sandbox agent")
    ap.add_argument("--root", action="append", default=[], help="SANDBOX_PATH=HOST_PATH mapping")
    ap.add_argument("--readable", action="append", default=None, help="sandbox roots tools may read")
    ap.add_argument("--writable", action="append", default=None, help="writable areas (packed by snapshot)")
    ap.add_argument("--area-bytes", type=int, default=AREA_BYTES, help="bytes per writable area")
    ap.add_argument("--max-write-files", type=int, default=MAX_WRITE_FILES)
    ap.add_argument("--max-area-entries", type=int, default=MAX_AREA_ENTRIES)
    ap.add_argument("--confine", action="store_true", help="remount the writable areas noexec, drop capabilities")
    ap.add_argument("--probe", action="store_true", help="set up, print the ping answer as JSON, exit")
    ap.add_argument("--isolated", action="store_true",
                    help="the agent is the main process of its own PID, mount and IPC namespaces (a container, "
                         "bubblewrap): recycle may kill every other process it sees and reset every writable place")
    ns = ap.parse_args(argv)
    roots = dict(r.split("=", 1) for r in ns.root)
    agent = Agent(roots, ns.readable or ["/data", "/scratch"], ns.writable or ["/scratch", "/tmp"],
                  area_bytes=ns.area_bytes, max_write_files=ns.max_write_files, max_area_entries=ns.max_area_entries)
    setup(agent, ns.confine)
    if ns.probe:
        print(json.dumps(agent.handle({"op": "ping"})))
        return 1 if agent.fatal else 0
    agent.record_baseline(ns.isolated)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    _become_subreaper()
    stdin = sys.stdin.buffer
    stdout = sys.stdout.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0
        rid = None
        try:
            req = json.loads(line)
            rid = req.get("id") if isinstance(req, dict) else None
            if not isinstance(req, dict):
                raise ValueError("a request must be a JSON object")
            ans = agent.handle(req)
        except Exception as exc:  # never die on one bad request
            ans = {"error": agent.to_sandbox(f"{type(exc).__name__}: {exc}"), "error_kind": "error"}
        ans["id"] = rid
        stdout.write(json.dumps(ans, ensure_ascii=True).encode("ascii") + b"\n")
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
