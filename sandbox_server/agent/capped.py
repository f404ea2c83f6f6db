"""Capped execution of one tool call (the ``exec`` op): a new session with an empty stdin, stdout and
stderr read while it runs and rewritten to sandbox paths, the whole process group stopped at the output cap
or the deadline, and nothing the call started left behind. Standard library only.
"""

from __future__ import annotations

import math
import os
import selectors
import subprocess
import time
from collections.abc import Callable

from .proc import kill_descendants, killpg, oom_first, reap_children
from .protocol import MARKER, PROC_MEMORY_BYTES, PROC_OPEN_FILES, PathRewriter, decode, utf8_cut


def static_limits(file_bytes: int) -> list[tuple[str, int]]:
    """The resource limits the agent sets on itself at start, soft and hard alike, so that every process of every
    call inherits them at no cost per call (no child can raise them): address space :data:`PROC_MEMORY_BYTES`
    bytes, files written at most ``file_bytes`` bytes each (a writable area's size), :data:`PROC_OPEN_FILES` open
    files, no core dumps. (Processes per sandbox are bounded outside the agent: a pids cgroup, Docker's
    ``pids_limit``; ``RLIMIT_NPROC`` never binds a process whose real user is root.)"""
    return [("RLIMIT_AS", PROC_MEMORY_BYTES), ("RLIMIT_FSIZE", file_bytes), ("RLIMIT_NOFILE", PROC_OPEN_FILES),
            ("RLIMIT_CORE", 0)]


def process_limits(timeout_s: float, file_bytes: int) -> list[tuple[str, int]]:
    """The resource limits of the processes of a call that runs code (``bounded_only``), as ``(RLIMIT name,
    value)``: :func:`static_limits` and CPU time the call's deadline rounded up plus one second."""
    return static_limits(file_bytes) + [("RLIMIT_CPU", int(math.ceil(max(timeout_s, 0.0))) + 1)]


def _clamped(limits: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """``(name, resource constant, value)`` of ``limits`` the platform has, each value lowered to this process's hard
    limit (a process can lower its limits, never raise them)."""
    import resource

    out = []
    for name, value in limits:
        which = getattr(resource, name, None)
        if which is None:
            continue
        hard = resource.getrlimit(which)[1]
        out.append((name, which, value if hard == resource.RLIM_INFINITY else min(value, hard)))
    return out


def limit_self(limits: list[tuple[str, int]]) -> dict[str, int]:
    """Set ``limits`` on this process (soft and hard, never above a hard limit it has); every child inherits them.
    Returns ``{name: value}`` of those set; a limit the platform lacks or refuses is left out."""
    import resource

    done = {}
    for name, which, value in _clamped(limits):
        try:
            resource.setrlimit(which, (value, value))
            done[name] = value
        except (ValueError, OSError):
            pass
    return done


def _limiter(limits: list[tuple[str, int]], scope: Callable[[], None] | None = None) -> Callable[[], None]:
    """A ``preexec_fn`` setting ``limits`` in the child before it runs the call's program (never above a hard
    limit the agent already has), making it the OOM killer's first choice (:func:`.proc.oom_first`) when ``limits``
    are given (a call that runs code), then calling ``scope`` (:meth:`.confine.SignalScope.enter`) when given."""
    import resource

    pairs = [(which, value) for _, which, value in _clamped(limits)]

    def apply() -> None:
        for which, value in pairs:
            resource.setrlimit(which, (value, value))
        if limits:
            oom_first()
        if scope is not None:
            scope()

    return apply


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
               rewriter: Callable[[], PathRewriter] | None = None,
               limits: list[tuple[str, int]] | None = None, scope: Callable[[], None] | None = None,
               spare: frozenset[int] | set[int] = frozenset()) -> dict:
    """Run ``argv`` in a new session with empty stdin; read stdout/stderr while it runs.

    Stops the call's whole process group at ``cap_bytes`` of stdout or at ``timeout_s`` seconds. The call
    ends when the direct child has exited *and* both pipes are closed (a background child that keeps the
    pipe open keeps the call running until the deadline), after which the group is killed, and every other
    descendant of the agent too (what left the group), so nothing the call started survives it.
    ``rewriter``: a factory of :class:`PathRewriter` (or None) applied to both streams before the caps, and
    to the message. ``limits``: resource limits of the call's processes
    (:func:`process_limits`), or None; ``scope``: a step every call's first process takes before it runs
    (:meth:`.confine.SignalScope.enter`), or None; ``spare``: descendants the clean-up leaves (the live interpreter
    and its marks). Returns the answer dict of the ``exec`` op.
    """
    t0 = time.monotonic()
    deadline = t0 + max(0.0, timeout_s)
    err_cap = min(cap_bytes, 16384)
    text = (lambda s: rewriter().text(s)) if rewriter else (lambda s: s)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=cwd, env=env, start_new_session=True, close_fds=True,
                                preexec_fn=_limiter(limits or [], scope) if limits or scope else None)
    except (OSError, ValueError) as exc:
        return {"stdout": "", "stderr": text(str(exc)), "exit_code": None, "status": "error", "truncated": False,
                "duration_s": time.monotonic() - t0, "message": text(f"could not start {argv[0]}: {exc}")}
    pgid = proc.pid
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes
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
            killpg(pgid)
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
    killpg(pgid)  # nothing the call started outlives it
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    proc.stdout.close()
    proc.stderr.close()
    _wait_group_gone(pgid)
    kill_descendants(spare=spare)  # and what left the group (setsid, a double fork): it re-parented to the agent
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
        reap_children()
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        if time.monotonic() > end:
            return
        killpg(pgid)
        time.sleep(0.001)
