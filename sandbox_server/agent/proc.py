"""Processes and System V IPC as the agent sees them: the process table and lineage, a process described
for a message, reaping (the agent is a child subreaper, and PID 1 in a container), killing a process group,
and the IPC objects of its namespace. Linux ``/proc`` only; standard library only.
"""

from __future__ import annotations

import os
import signal

from .confine import load_libc


def proc_table() -> dict[int, tuple[int, str]]:
    """Every process in ``/proc``: {pid: (parent pid, state letter)}."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat(int(name))
        if fields and len(fields) > 1:
            out[int(name)] = (int(fields[1]), fields[0].decode("ascii", "replace"))
    return out


#: ``oom_score_adj`` of every process a code-running call or an interpreter session starts: the most, so that when a
#: sandbox reaches its memory bound the kernel's OOM killer takes the call's processes before the agent (a fork bomb
#: of 128 interpreters reaches about 230 of 256 MiB; the agent, the largest single process, was its choice before).
#: Raising one's own score needs no privilege; lowering the agent's would (``CAP_SYS_RESOURCE``).
OOM_SCORE_ADJ_CALLS = 1000


def oom_first() -> None:
    """Make this process (and what it forks after) the OOM killer's first choice: ``/proc/self/oom_score_adj`` set
    to :data:`OOM_SCORE_ADJ_CALLS`. Run in a call's first process before its program (a ``preexec_fn``); where
    ``/proc`` refuses, nothing changes (never an error of the call)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(OOM_SCORE_ADJ_CALLS))
    except OSError:
        pass


def lineage(pid: int, table: dict[int, tuple[int, str]]) -> set[int]:
    """``pid`` and its ancestors visible in ``table``."""
    out = set()
    while pid in table and pid not in out:
        out.add(pid)
        pid = table[pid][0]
    return out


def describe_process(pid: int) -> str:
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


_SYSV = (("shm", "shmctl"), ("sem", "semctl"), ("msg", "msgctl"))


def sysv_ipc() -> list[str]:
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
            v = dict(zip(cols, row.split()))  # noqa: B905 - zip(strict=) is Python >= 3.10; the agent runs on 3.9
            ident = v.get("shmid") or v.get("semid") or v.get("msqid")
            if ident is not None:
                out.append(f"{kind} {ident} (key {v.get('key')}, uid {v.get('uid')})")
    return out


def remove_sysv_ipc() -> None:
    """Remove every System V IPC object of this IPC namespace that this process may remove (IPC_RMID)."""
    objs = sysv_ipc()
    if not objs:
        return
    try:
        _, libc = load_libc()
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


def killpg(pgid: int) -> None:
    """SIGKILL process group ``pgid``; a group already gone (or not ours) is ignored."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def children_of(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/PID/task/*/children`` (None when the kernel has no such files)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(c) for c in f.read().split()]
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            pass
    return out


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first, then the parent pid, ...), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:].split()
    except (OSError, ValueError):
        return None


def state_of(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R``, ``S``, ``T``, ``Z``, ...), or None when there is no such process."""
    fields = _stat(pid)
    return fields[0].decode("ascii", "replace") if fields else None


def parent_of(pid: int) -> int | None:
    """The parent pid of process ``pid``, or None when there is no such process."""
    fields = _stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def descendants(spare: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """Every live descendant of the agent but the pids in ``spare`` (their own descendants are listed; zombies are
    not: they are dead, and one whose parent does not reap it, a stopped interpreter session's, would be waited for
    in vain): walked down the ``children`` files from the agent (a few reads when it has none, whatever else runs on
    the machine), or found by a scan of the whole process table where the kernel has no ``children`` files."""
    me = os.getpid()
    first = children_of(me)
    if first is None:
        table = proc_table()
        return [pid for pid in table if pid != me and pid not in spare and table[pid][1] not in ("Z", "X")
                and me in lineage(pid, table)]
    out, stack = [], list(first)
    while stack:
        pid = stack.pop()
        if pid not in spare and state_of(pid) not in ("Z", "X", None):
            out.append(pid)
        stack += children_of(pid) or []
    return out


def kill_descendants(limit_s: float = 2.0, spare: frozenset[int] | set[int] = frozenset()) -> int:
    """SIGKILL every descendant of the agent but ``spare`` (the live interpreter and its marks) and wait until none is
    left (reaped), at most ``limit_s`` seconds:
    what calls started and left behind, those that left their process group (``setsid``) included, since the agent
    is their child subreaper (:func:`become_subreaper`) and every orphan re-parents to it. Returns how many signals
    were sent."""
    import time

    deadline, killed = time.monotonic() + limit_s, 0
    while True:
        found = descendants(spare)
        if not found or time.monotonic() > deadline:
            return killed
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        reap_children()
        if descendants(spare):
            time.sleep(0.001)  # the signal is delivered; its exit and the re-parenting to the agent are not yet


def become_subreaper() -> None:
    """Make orphans of tool calls re-parent to the agent (Linux prctl), so it can reap them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except Exception:
        pass


def reap_children() -> None:
    """Reap any exited children (the agent may run as PID 1 and inherit orphans)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
