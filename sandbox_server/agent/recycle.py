"""The ``recycle`` operation (:class:`RecycleOps`): reset a sandbox for another session and check it (the
pool hands a sandbox out again only when the answer's ``clean`` is true). Standard library only.
"""

from __future__ import annotations

import os
import signal
import time

from .fs import clear_dir, dir_differs, dir_entries, remove_tree, reset_dir, writable_places
from .proc import describe_process, lineage, proc_table, reap_children, remove_sysv_ipc, sysv_ipc
from .state import AgentState


class RecycleOps(AgentState):
    """``recycle`` of an agent: the baseline recorded at start (:meth:`record_baseline`), the reset and its
    check (:meth:`op_recycle`)."""

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
        table = proc_table()
        if set(table) - lineage(os.getpid(), table):
            self.scope = None
            self.scope_problem = ("the agent was started as its sandbox's main process but sees processes that are "
                                  "not its own ancestors: it cannot tell which processes belong to the sandbox")
            return
        self.scope = "namespace"
        for d in writable_places(skip=[*self.readable, *self.writable, "/proc", "/sys", "/usr", "/dev/pts"]):
            try:
                self.places0[d] = (os.lstat(d), dir_entries(d))
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
        for w, st in (self.areas0 or {}).items():
            h = self.host(w)
            clear_dir(h)
            reset_dir(h, st)
        for d, (st, entries) in self.places0.items():
            for name in set(dir_entries(d)) - set(entries):
                remove_tree(os.path.join(d, name))
            reset_dir(d, st, times=False)
        if scope == "namespace":
            remove_sysv_ipc()
        problems += self._check_reset(scope, processes=not problems)  # processes left are named already
        return {"clean": not problems, "killed": killed, "problems": problems, "duration_s": time.monotonic() - t0}

    def _strays(self, scope: str) -> list[int]:
        """Pids of processes a reset must kill: every process of the namespace but the agent's lineage, or
        (``descendants``) the agent's descendants only."""
        table = proc_table()
        me = os.getpid()
        if scope == "namespace":
            keep = lineage(me, table)
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
            reap_children()
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
        reap_children()
        return len(killed), [f"process {describe_process(p)} is still running"
                             + (f" (kill: {denied[p]})" if p in denied else f" {limit_s:g} s after SIGKILL")
                             for p in self._strays(scope)]

    def _check_reset(self, scope: str, processes: bool = True) -> list[str]:
        """What a fresh sandbox would not show: a process (when ``processes``), an entry in a writable area
        or another writable place, a changed mode, owner or time, a System V IPC object. One line each
        (empty: clean)."""
        problems = ([f"process {describe_process(p)} appeared during the reset" for p in self._strays(scope)]
                    if processes else [])
        for w, st in (self.areas0 or {}).items():
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
            problems += dir_differs(w, st, now, times=True)
        for d, (st, entries) in self.places0.items():
            try:
                cur = dir_entries(d)
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
            problems += dir_differs(d, st, now, times=False)
        if scope == "namespace":
            problems += [f"a System V IPC object is left: {x}" for x in sysv_ipc()]
        return problems
