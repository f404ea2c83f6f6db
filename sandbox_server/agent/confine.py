"""Confinement of the agent and everything it runs: writable areas remounted ``noexec,nosuid,nodev`` and
every capability dropped (:func:`confine`, the local backend's ``--confine``), and execution restricted to
the system directories with Landlock where the kernel offers it (:func:`restrict_exec`). Linux only;
standard library only (``ctypes`` for the system calls).
"""

from __future__ import annotations

import errno
import os
import re
import sys

_MS = {"ro": 0x1, "nosuid": 0x2, "nodev": 0x4, "noexec": 0x8, "noatime": 0x400, "nodiratime": 0x800,
       "relatime": 0x200000}
_MS_REMOUNT, _MS_BIND = 0x20, 0x1000
_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_ACCESS_FS_EXECUTE = 1
#: Landlock scopes (ABI >= 6): no connecting to abstract UNIX sockets and no signals to processes outside the domain.
_LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET, _LANDLOCK_SCOPE_SIGNAL = 1, 2
#: Directories whose programs may be executed (Landlock), where they exist.
EXEC_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def load_libc():
    """``(ctypes, libc)``: the ctypes module and this process's C library (errno kept). Raises OSError."""
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
    ctypes, libc = load_libc()
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
        ctypes, libc = load_libc()
        sc = libc.syscall
        sc.restype = ctypes.c_long
        abi = sc(ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
        if abi < 1:
            return 0
        attr = ctypes.c_uint64(_LANDLOCK_ACCESS_FS_EXECUTE)
        rfd = sc(ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(8),
                 ctypes.c_uint32(0))
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
                        _LANDLOCK_ACCESS_FS_EXECUTE.to_bytes(8, sys.byteorder)
                        + pfd.to_bytes(4, sys.byteorder, signed=True), 12)
                    sc(ctypes.c_long(_SYS_LANDLOCK_ADD_RULE), ctypes.c_int(rfd), ctypes.c_int(1), rule,
                       ctypes.c_uint32(0))
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


class SignalScope:
    """A Landlock domain every call's processes enter before they run (ABI >= 6, Linux 6.12): from inside it no
    signal reaches a process outside it (the agent, other calls' processes: ``kill`` fails with ``EPERM``), no
    abstract UNIX socket outside it can be connected to, and no process outside it can be traced (Landlock's rule
    since ABI 1). A call's own processes stay free to signal each other. :attr:`active` is False where the kernel
    lacks the scopes; a call's code can then kill the agent, which ends that sandbox's session (the server replaces
    the sandbox: ``sandbox_replaced``), never another's.
    """

    def __init__(self) -> None:
        self.fd = -1
        try:
            ctypes, libc = load_libc()
            sc = libc.syscall
            sc.restype = ctypes.c_long
            abi = sc(ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
            if abi >= 6:
                attr = (ctypes.c_uint64 * 3)(0, 0, _LANDLOCK_SCOPE_SIGNAL | _LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET)
                fd = sc(ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(24),
                        ctypes.c_uint32(0))
                if fd >= 0:
                    os.set_inheritable(int(fd), False)
                    self.fd = int(fd)
            self._sc, self._libc, self._ctypes = sc, libc, ctypes
        except Exception:
            self.fd = -1

    @property
    def active(self) -> bool:
        """Whether calls run scoped."""
        return self.fd >= 0

    def enter(self) -> None:
        """Enter the domain (the calling process and its future children): a ``preexec_fn`` step. Raises OSError
        when the kernel refuses (the call then does not run)."""
        if self.fd < 0:
            return
        ct = self._ctypes
        self._libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if self._sc(ct.c_long(_SYS_LANDLOCK_RESTRICT_SELF), ct.c_int(self.fd), ct.c_uint32(0)) != 0:
            raise OSError(ct.get_errno(), "landlock_restrict_self failed")

