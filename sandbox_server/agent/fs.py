"""Directory helpers of the agent: emptying and removing trees whatever their modes (:func:`clear_dir`,
:func:`remove_tree`), listing entries (:func:`dir_entries`), finding the places a process may write
(:func:`writable_places`) and recording / putting back / comparing a directory's mode and times.
Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import stat

from .protocol import within


class TempReadable:
    """Context: give the owner ``bits`` on ``path`` while inside when it lacks them (a 0000 file or a 0500
    directory made by the sandbox's own user), then put the mode (and times) back."""

    def __init__(self, path: str, st: os.stat_result, bits: int):
        self.path, self.st, self.bits = path, st, bits
        self.changed = False

    def __enter__(self) -> "TempReadable":
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


def clear_dir(path: str) -> None:
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


def dir_entries(d: str) -> dict[str, tuple[int, int]]:
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


def writable_places(skip: list[str], depth: int = 3) -> list[str]:
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
        if not any(within(p, s) for s in skip_set) and os.path.isdir(p) and not os.path.islink(p):
            visit(os.path.normpath(p), depth)
    return found


def remove_tree(path: str) -> None:
    """Remove ``path`` (a file, link or directory tree, whatever its modes); errors are left to the check."""
    if os.path.isdir(path) and not os.path.islink(path):
        clear_dir(path)
        try:
            os.rmdir(path)
        except OSError:
            pass
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def reset_dir(path: str, st: os.stat_result, times: bool = True) -> None:
    """Put a directory's permission bits (and, ``times``, its access and modification times) back as ``st``
    recorded them; errors are left to the check."""
    try:
        if stat.S_IMODE(os.lstat(path).st_mode) != stat.S_IMODE(st.st_mode):
            os.chmod(path, stat.S_IMODE(st.st_mode))
        if times:
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    except OSError:
        pass


def dir_differs(name: str, st: os.stat_result, now: os.stat_result, times: bool) -> list[str]:
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

