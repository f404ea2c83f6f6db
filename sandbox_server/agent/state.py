"""The agent's state (:class:`AgentState`): sandbox paths mapped onto host paths and back, the readable
roots and writable areas, their limits and the checks every operation shares. Standard library only.
"""

from __future__ import annotations

import os
import stat

from .confine import SignalScope
from .protocol import (
    AREA_BYTES, MAX_AREA_ENTRIES, MAX_WRITE_FILES, PAGE_BYTES, Fail, PathRewriter, mib, pages, within,
)


class AgentState:
    """State of one agent process: the root mapping, the writable areas and their limits; the path and
    limit checks every operation shares. The operations are in :class:`~.core.Agent` and its bases.

    Args:
        roots: {sandbox path: host path}; identity where absent.
        readable: sandbox roots tools may read.
        writable: writable areas (packed by snapshots; the first takes ``write``).
        area_bytes / max_write_files / max_area_entries: the limits (bytes; files; entries).
        bounded: the sandbox bounds its process count from outside (``--bounded``).
    """

    def __init__(self, roots: dict[str, str], readable: list[str], writable: list[str], *,
                 area_bytes: int = AREA_BYTES, max_write_files: int = MAX_WRITE_FILES,
                 max_area_entries: int = MAX_AREA_ENTRIES, bounded: bool = False):
        self.roots = {os.path.normpath(k): os.path.normpath(v) for k, v in roots.items()}
        self.readable = [os.path.normpath(r) for r in readable]
        self.writable = [os.path.normpath(w) for w in writable]
        self.area_bytes = area_bytes
        self.max_write_files = max_write_files
        self.max_area_entries = max_area_entries
        #: Whether the sandbox bounds its process count from outside (a pids cgroup, Docker's ``pids_limit``):
        #: ``exec`` requests with ``bounded_only`` (tools that run code) are refused without it.
        self.bounded = bounded
        #: The Landlock domain every call enters (:class:`~.confine.SignalScope`), set by :func:`~.cli.setup`.
        self.signal_scope: SignalScope | None = None
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

    def open_areas(self) -> None:
        """Give each writable area itself back its owner's read, write and search bits where the sandbox's code took
        them (``chmod 000 /scratch``): every call runs there and every snapshot, rollback and reset empties it, so an
        area the agent cannot enter would end the sandbox's use. What is inside keeps its modes."""
        for w in self.writable:
            h = self.host(w)
            try:
                mode = stat.S_IMODE(os.stat(h).st_mode)
                if mode & 0o700 != 0o700:
                    os.chmod(h, mode | 0o700)
            except OSError:
                pass

    # -- path mapping ---------------------------------------------------------------------------
    def host(self, sandbox_path: str) -> str:
        """Map a sandbox path to a host path (identity where no root maps it)."""
        p = os.path.normpath(sandbox_path)
        best = None
        for s in self.roots:
            if within(p, s) and (best is None or len(s) > len(best)):
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
        if not any(within(virt, r) for r in self.readable):
            return f"path {arg!r} resolves to {virt}, outside {', '.join(self.readable)}"
        real = os.path.realpath(self.host(virt))
        real_roots = [os.path.realpath(self.host(r)) for r in self.readable]
        if not any(within(real, r) for r in real_roots):
            return f"path {arg!r} leaves {', '.join(self.readable)} through a symbolic link"
        return None

    def _area_of(self, virt: str) -> str | None:
        for w in self.writable:
            if within(virt, w):
                return w
        return None

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
                raise Fail(f"{cur_virt} is a symbolic link; files are never written through one", "refused")
            if not stat.S_ISDIR(st.st_mode):
                raise Fail(f"{cur_virt} is a file, not a directory", "refused")
        return created

    # -- limits of the writable areas ---------------------------------------------------------------
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
                        nbytes += pages(st.st_size)
        return nbytes, entries

    def _limit_text(self) -> str:
        return (f"each writable area holds at most {self.area_bytes} bytes ({mib(self.area_bytes)}, every file "
                f"counted in whole {PAGE_BYTES}-byte pages) and {self.max_area_entries} entries")

    def _check_limits(self, area: str, nbytes: int, entries: int, what: str) -> None:
        if nbytes > self.area_bytes:
            raise Fail(f"{what} needs {nbytes} bytes in {area} ({mib(nbytes)} in {PAGE_BYTES}-byte pages); "
                       f"{self._limit_text()}; nothing was written", "limit")
        if entries > self.max_area_entries:
            raise Fail(f"{what} needs {entries} entries in {area}; {self._limit_text()}; nothing was written", "limit")
