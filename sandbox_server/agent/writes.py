"""The ``write`` operation (:class:`WriteOps`): files written under the first writable area (``/scratch``)
all or none, within the area's limits. Standard library only.
"""

from __future__ import annotations

import base64
import binascii
import errno
import os
import stat

from .protocol import Fail, pages, within
from .state import AgentState


class WriteOps(AgentState):
    """``write`` of an agent (see the package docstring for the protocol)."""

    def op_write(self, req: dict) -> dict:
        """Write ``files`` ({relative path: base64 bytes}) under the first writable area, all or none.
        Raises Fail (refused | limit | error)."""
        if not self.writable:
            raise Fail("no writable area", "refused")
        self.open_areas()
        base = self.writable[0]
        files = req.get("files") or {}
        if not isinstance(files, dict):
            raise Fail("files must be an object of relative path: base64 bytes", "refused")
        if len(files) > self.max_write_files:
            raise Fail(f"{len(files)} files in one write; the limit is {self.max_write_files} files per write; "
                       "nothing was written", "limit")
        plan: list[tuple[str, bytes]] = []
        for rel, b64 in files.items():
            if not isinstance(rel, str) or not rel or "\x00" in rel or os.path.isabs(rel):
                raise Fail(f"file path {rel!r} must be relative and stay inside {base}", "refused")
            virt = os.path.normpath(os.path.join(base, rel))
            if not within(virt, base) or virt == base:
                raise Fail(f"file path {rel!r} must be relative and stay inside {base}", "refused")
            try:
                if not isinstance(b64, str):
                    raise ValueError
                data = base64.b64decode(b64, validate=True)
            except (binascii.Error, ValueError):
                raise Fail(f"the content of {rel!r} is not base64", "refused") from None
            plan.append((virt, data))
        # Written in path order, the order in which a restore (a fork, a clone) recreates them from the
        # tar: a directory then lists its entries the same way in the copy as in the original.
        plan.sort(key=lambda item: item[0])
        virts = [v for v, _ in plan]
        if len(set(virts)) != len(virts):
            raise Fail("two file paths of this write name the same file", "refused")
        vset = set(virts)
        new_entries, freed, need = 0, 0, 0
        new_dirs: set[str] = set()
        for virt, data in plan:
            parent = os.path.dirname(virt)
            while parent != base:
                if parent in vset:
                    raise Fail(f"{parent} would be both a file and a directory", "refused")
                hp = self.host(parent)
                if os.path.islink(hp):
                    raise Fail(f"{parent} is a symbolic link; files are never written through one", "refused")
                if os.path.lexists(hp) and not os.path.isdir(hp):
                    raise Fail(f"{parent} is a file, not a directory", "refused")
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
                    raise Fail(f"{virt} is a directory", "refused")
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                    freed += pages(st.st_size)
            need += pages(len(data))
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
            raise Fail(f"{what} needs {need - freed} more bytes in {base} but only {free} are free; "
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
        except (OSError, Fail) as exc:
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
            if isinstance(exc, Fail):
                raise
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise Fail(f"{what}: {base} is full ({exc.strerror}); {self._limit_text()}; none of the files "
                           "of this write were kept", "limit") from None
            raise Fail(f"{what} failed: {exc}; none of the files of this write were kept") from None
        return {"ok": True}
