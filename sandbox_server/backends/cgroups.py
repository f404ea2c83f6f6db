"""Per-sandbox control groups of the local backend: a bound on the processes and the memory of one sandbox.

bubblewrap gives a sandbox its own namespaces but no resource bound; ``RLIMIT_NPROC`` cannot stand in for one, since
the kernel never applies it to a process whose real user is root (a root server's sandboxes). A control group can:
``pids.max`` stops a fork bomb at the sandbox's own count (``fork`` fails with ``EAGAIN``), and the memory
controller (``memory.limit_in_bytes`` in cgroup v1, ``memory.max`` in v2) kills inside the sandbox when it passes
its bound, never outside. Docker sets the same two bounds on its containers (``pids_limit``, ``mem_limit``).

:func:`available` finds the hierarchy (v2 unified, or v1 ``pids`` and ``memory`` controllers) and whether this
process may create groups there (root, or a delegated subtree). :class:`SandboxGroup` makes one group per sandbox
(``forkyard-<owner>/<sandbox id>`` under each controller, one parent group per backend instance:
``<owner>`` ends in ``@<pid>-<hex>``, the owning process), is entered by the sandbox's first process before it
runs bubblewrap (:meth:`SandboxGroup.enter`, a ``preexec_fn``: everything the sandbox starts is counted, with no
window in which a process could escape), and is removed after its processes are killed (:meth:`SandboxGroup.remove`).
A server that ends without closing its backend (killed, a test process exiting) leaves its groups behind:
:func:`remove_orphan_groups`, run by the next backend's orphan clean-up, removes every parent group whose owning
process is gone.
Linux only; nothing here runs when :func:`available` says no (the backend then reports its sandboxes unbounded and
the agent refuses the tools that run code).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

#: Where the control-group file systems are mounted.
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def hierarchy() -> tuple[str, list[Path]] | None:
    """``("v2", [unified root])`` or ``("v1", [pids root, memory root])`` where this process may create groups
    there, else None. Never raises."""
    try:
        own = _own_v2_path()
        if (CGROUP_ROOT / "cgroup.controllers").exists() and own is not None:
            controllers = (own / "cgroup.controllers").read_text().split()
            if {"pids", "memory"} <= set(controllers) and _writable_dir(own):
                return "v2", [own]
            return None
        roots = [CGROUP_ROOT / "pids", CGROUP_ROOT / "memory"]
        if all(_writable_dir(r) for r in roots):
            return "v1", roots
    except OSError:
        return None
    return None


def _own_v2_path() -> Path | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return CGROUP_ROOT / line[3:].lstrip("/")
    except OSError:
        return None
    return None


def available() -> str | None:
    """None when per-sandbox groups can be made here, else the reason in words (for logs and ``/health``)."""
    if hierarchy() is not None:
        return None
    if not CGROUP_ROOT.is_dir():
        return f"no control-group file system at {CGROUP_ROOT}"
    return (f"the control groups under {CGROUP_ROOT} are not writable by this process (uid {os.getuid()}): "
            "run the server as root, or delegate a cgroup v2 subtree with the pids and memory controllers to it")


class SandboxGroup:
    """One sandbox's control group(s): ``pids_max`` processes (threads included) and ``memory_bytes`` of memory.

    Args:
        owner: names the parent group, ``forkyard-<owner>`` (one per backend instance; ending in ``@<pid>-<hex>`` of
            the owning process lets :func:`remove_orphan_groups` remove it once that process is gone).
        sandbox_id: the sandbox's id (a path-safe name).
        pids_max: most tasks at once (>= 1).
        memory_bytes: most bytes of memory (user pages and the tmpfs pages its areas hold are both charged).

    Raises:
        OSError: the groups could not be created (:func:`available` said yes, and then a write failed).
    """

    def __init__(self, owner: str, sandbox_id: str, pids_max: int, memory_bytes: int):
        found = hierarchy()
        if found is None:
            raise OSError(available() or "no control groups")
        self.version, roots = found
        self.dirs: list[Path] = []
        try:
            for root in roots:
                parent = root / f"forkyard-{owner}"
                d = parent / sandbox_id
                for attempt in range(3):  # an orphan clean-up may remove the (empty) parent between the two mkdirs
                    parent.mkdir(exist_ok=True)
                    if self.version == "v2":
                        _enable_controllers(root)
                        _enable_controllers(parent)
                    try:
                        d.mkdir()
                        break
                    except FileNotFoundError:
                        if attempt == 2:
                            raise
                self.dirs.append(d)
                if self.version == "v2":
                    (d / "pids.max").write_text(str(pids_max))
                    (d / "memory.max").write_text(str(memory_bytes))
                    _try_write(d / "memory.swap.max", "0")
                elif root.name == "pids":
                    (d / "pids.max").write_text(str(pids_max))
                else:
                    (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    _try_write(d / "memory.memsw.limit_in_bytes", str(memory_bytes))
        except OSError:
            self.remove()
            raise
        self._procs = [os.fsencode(d / "cgroup.procs") for d in self.dirs]

    def enter(self) -> None:
        """Move the calling process into the group(s): a ``preexec_fn`` of the sandbox's first process (system calls
        only, no allocation worth naming, between ``fork`` and ``exec``)."""
        for path in self._procs:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def pids(self) -> list[int]:
        """The processes in the group now."""
        return _read_pids(self.dirs[0]) if self.dirs else []

    def remove(self, wait_s: float = 5.0) -> None:
        """Kill whatever is left in the group(s) and remove them (idempotent; never raises)."""
        deadline = time.monotonic() + wait_s
        for d in reversed(self.dirs):
            _kill_and_remove(d, deadline)
        self.dirs = []


def remove_owner_groups(owner: str) -> None:
    """Remove the parent group(s) ``forkyard-<owner>`` where no sandbox group is left in them; never raises."""
    found = hierarchy()
    for root in found[1] if found else []:
        try:
            (root / f"forkyard-{owner}").rmdir()
        except OSError:
            pass


_OWNER_PID = re.compile(r"@(\d+)-[0-9a-f]+\Z")


def remove_orphan_groups() -> int:
    """Remove the groups that processes now gone left behind; returns how many sandbox groups went. Never raises.

    A parent group ``forkyard-...@<pid>-<hex>`` whose process ``<pid>`` no longer runs loses every sandbox group in it
    (whatever still runs there is killed: a sandbox of a dead server) and then itself. Parents of the older naming
    ``forkyard-<server>`` (no owner in the name) lose only their empty sandbox groups, and themselves when empty. A
    live owner's groups are never touched (a reused pid keeps a dead owner's groups until that process ends too).
    """
    found = hierarchy()
    removed = 0
    for root in found[1] if found else []:
        try:
            parents = [p for p in root.iterdir() if p.name.startswith("forkyard-") and p.is_dir()]
        except OSError:
            continue
        for parent in parents:
            m = _OWNER_PID.search(parent.name)
            if m and _pid_alive(int(m.group(1))):
                continue
            try:
                children = [c for c in parent.iterdir() if c.is_dir()]
            except OSError:
                continue
            for child in children:
                if m is None and _read_pids(child):
                    continue
                removed += _kill_and_remove(child, time.monotonic() + 2.0)
            try:
                parent.rmdir()
            except OSError:
                pass
    return removed


def _kill_and_remove(d: Path, deadline: float) -> bool:
    """Kill every process in group ``d`` and remove it, retrying until ``deadline`` (monotonic seconds); whether it
    is gone."""
    while True:
        for pid in _read_pids(d):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists, owned by someone else
    return True


def _read_pids(d: Path) -> list[int]:
    try:
        return [int(x) for x in (d / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _enable_controllers(d: Path) -> None:
    """Let ``d``'s child groups use the pids and memory controllers (cgroup v2); already enabled is fine."""
    try:
        have = set((d / "cgroup.subtree_control").read_text().split())
    except OSError:
        return
    for c in ("pids", "memory"):
        if c not in have:
            _try_write(d / "cgroup.subtree_control", f"+{c}")


def _try_write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:
        pass


__all__ = ["CGROUP_ROOT", "SandboxGroup", "available", "hierarchy", "remove_orphan_groups", "remove_owner_groups"]
