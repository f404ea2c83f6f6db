"""The mount helper of :mod:`sandbox_server.backends.layers`: a single-threaded root process that freezes a local
sandbox's writable areas in place into read-only **layers**, mounts layers under a copy-on-write overlay at other
sandboxes' areas (inside each sandbox's own mount namespace), and takes them away again. Nothing is copied: a layer
is a read-only mount of a tmpfs the frozen sandbox wrote, held open by this process.

Run as ``python3 -I -S overlay_helper.py ROOT`` by :class:`~sandbox_server.backends.layers.Layers`: it leaves the
server's mount namespace for a private one, where it mounts a small tmpfs at ``ROOT`` to show a layer's content
(:data:`VIEW`, seen from the host as ``/proc/<helper>/root/ROOT/...``). Then one request per line on stdin, one
answer per line on stdout (JSON), until stdin closes:

* ``{"op": "freeze", "pid": P, "name": N, "area_bytes": B}``: the areas (``/scratch``, ``/tmp``) of the sandbox whose
  agent is host process ``P`` become layer ``N``, read-only, as they are now: each area's current upper tmpfs (the
  area's own tmpfs, for one never frozen or shared) is kept read-only as the layer's top, on the layers it stood on;
  the sandbox goes on over a new, empty upper tmpfs of ``B`` bytes, under an overlay of those layers. O(1): no file
  is copied. The old tmpfs stays below, covered: nothing in the sandbox reaches it again, so no one can change it.
* ``{"op": "share", "name": N, "pids": [P, ...], "area_bytes": B}``: for each sandbox, whose areas must be empty, an
  overlay of layer ``N`` over a new empty upper tmpfs of ``B`` bytes at each area. Answers ``failed``: ``{pid:
  error}`` of the sandboxes it could not do (to be discarded).
* ``{"op": "restand", "pid": P, "name": N, "area_bytes": B}``: put the sandbox's areas back to layer ``N`` (a
  rollback): what stood there goes (an upper tmpfs of this helper's is unmounted, with what it held; the area's own
  tmpfs is emptied and holds the new upper), and an overlay of the layer over an empty upper takes its place.
  Answers ``covered``: whether the sandbox's own tmpfs is covered now (it can then not be given back plain).
* ``{"op": "unshare", "pid": P}``: a sandbox that was shared a layer and never frozen gets its plain, empty areas
  back (the overlays and the layers' mounts taken out, the folders under them removed): it can be recycled. Refused
  for a frozen one, whose own tmpfs is a layer now (it is destroyed instead).
* ``{"op": "forget", "pid": P}``: the sandbox is gone (or will be destroyed): close what this process held for it.
* ``{"op": "view", "name": N}`` / ``{"op": "unview", "name": N}``: show layer ``N`` read-only at ``ROOT/N/<area>``
  (for a tar of it made by the server) / take that away.
* ``{"op": "drop", "name": N}``: forget layer ``N`` (its mounts go once nothing else holds them).

Every mount the sandbox can see is ``noexec,nosuid,nodev`` like the areas; every upper tmpfs has the area's size, so a
sandbox's bound holds for what it writes. Answers: ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.

Why a process of its own: ``setns`` into a mount namespace is refused to a process with more than one thread (the
server has many), and a helper that stays up costs one process start in all instead of one per mount. Why layers are
attached inside the area before the overlay is mounted: the kernel takes an overlay's layers only from mounts of the
namespace it is mounted in (the overlay then holds its own private copies of them). Standard library only (it runs
with ``-I -S``); Linux >= 5.12 (the new mount API and ``mount_setattr``).

Why one file: it runs as a script with ``-I -S`` (no site, no package), so it can import nothing of forkyard, and
every operation reads and changes the same state (the layers it holds, each sandbox's stack).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys

#: The system calls of the new mount API: the same numbers on every architecture (Linux 5.2 and 5.12).
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_FSOPEN, SYS_FSCONFIG, SYS_FSMOUNT, SYS_MOUNT_SETATTR = 428, 429, 430, 431, 432, 442
OPEN_TREE_CLONE, O_CLOEXEC, AT_EMPTY_PATH, AT_FDCWD = 1, 0o2000000, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH, FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE, FSOPEN_CLOEXEC, FSMOUNT_CLOEXEC = 0x4, 1, 6, 1, 1
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_REC, MS_PRIVATE = 0x1, 0x2, 0x4, 0x8, 0x20, 0x4000, 0x40000
MNT_DETACH, CLONE_NEWNS, EINVAL = 0x2, 0x20000, 22
#: The areas a layer holds.
AREAS = ("/scratch", "/tmp")
#: What an area holds under its overlay: the upper and work folders, and one mount point per layer below.
UPPER, WORK, LOWER = ".forkyard-upper", ".forkyard-work", ".forkyard-lower"
#: Overlayfs takes at most this many layers below; a sandbox frozen again on a stack this deep is refused (its
#: copies are then made by a copy of its files).
MAX_DEPTH = 64
#: A sandbox's frozen layers hold at most this many areas' size in all (its tops stay in its memory, covered, for
#: its life): past it a freeze is refused and its copies are made by a copy of its files.
FROZEN_AREAS = 4
#: Overlay options: a folder renamed in a copy is renamed (not refused with EXDEV: ``redirect_dir``), and a file with
#: hard links copied up once for all its names (``index``).
OPTIONS = "redirect_dir=on,index=on"
#: The mount flags a remount keeps (a remount sets the mount's flags to those it is given).
_KEEP = 0x2 | 0x4 | 0x8  # MS_NOSUID | MS_NODEV | MS_NOEXEC
_SAFE = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _check(r: int, what: str) -> int:
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return r


def _setattr(fd: int, attrs: int) -> None:
    a = _MountAttr(attrs, 0, 0, 0)
    _check(_libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, ctypes.byref(a), ctypes.sizeof(a)),
           "mount_setattr")


def _clone(fd: int, path: str = "") -> int:
    """A detached, read-only, ``noexec,nosuid,nodev`` bind of the mount (or folder ``path`` under it) ``fd``."""
    flags = OPEN_TREE_CLONE | O_CLOEXEC | (0 if path else AT_EMPTY_PATH)
    tree = _check(_libc.syscall(SYS_OPEN_TREE, fd, path.encode(), flags), "open_tree")
    _setattr(tree, MOUNT_ATTR_RDONLY | _SAFE)
    return tree


def _attach(tree: int, where: str) -> None:
    _check(_libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, where.encode(), MOVE_MOUNT_F_EMPTY_PATH), "move_mount")


def _read_only(area: str) -> None:
    """Make the file system mounted at ``area`` read-only (the superblock: every mount of it, and every descriptor
    open on it). Raises OSError (EBUSY: a file of it is open for writing)."""
    _check(_libc.mount(None, area.encode(), None, ctypes.c_ulong(MS_REMOUNT | MS_RDONLY | _KEEP), None),
           f"make {area} read-only")


def _used(where: str | int) -> int:
    """Bytes in use in the file system of ``where`` (a path or a descriptor)."""
    st = os.fstatvfs(where) if isinstance(where, int) else os.statvfs(where)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _new_tmpfs(size: int, mode: int) -> int:
    """A detached tmpfs of ``size`` bytes, root mode ``mode``, ``noexec,nosuid,nodev``."""
    fs = _check(_libc.syscall(SYS_FSOPEN, b"tmpfs", FSOPEN_CLOEXEC), "fsopen")
    try:
        for key, value in (("size", str(size)), ("mode", f"{mode:o}")):
            _check(_libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_SET_STRING, key.encode(), value.encode(), 0), key)
        _check(_libc.syscall(SYS_FSCONFIG, fs, FSCONFIG_CMD_CREATE, None, None, 0), "create tmpfs")
        return _check(_libc.syscall(SYS_FSMOUNT, fs, FSMOUNT_CLOEXEC, _SAFE), "fsmount")
    finally:
        os.close(fs)


class _Inside:
    """``with _Inside(pid, helper):`` runs its body in the mount namespace and root of process ``pid``; back after."""

    def __init__(self, pid: int, own_ns: int, own_root: int):
        self.pid, self.own_ns, self.own_root = pid, own_ns, own_root

    def __enter__(self) -> None:
        root = os.open(f"/proc/{self.pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        ns = os.open(f"/proc/{self.pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(ns, CLONE_NEWNS), "setns")
            os.fchdir(root)
            os.chroot(".")
        except BaseException:
            self.__exit__()
            raise
        finally:
            os.close(root)
            os.close(ns)

    def __exit__(self, *exc: object) -> None:
        _check(_libc.setns(self.own_ns, CLONE_NEWNS), "setns back")
        os.fchdir(self.own_root)
        os.chroot(".")


class Helper:
    """The helper's state. ``layers``: {name: {area: [mount points in this process's namespace, top first]}}, each a
    read-only mount this process made (a layer's own clones: one layer is dropped without touching another).
    ``stacks``: {pid: (the layer its areas stand on, {area: (fd of its upper folder, whether that folder is on the
    area's own tmpfs)})}. ``frozen``: pids whose own tmpfs is covered by one of this process's (never given back as
    plain areas).

    Detached mounts are cloned only in the namespace they were made in (the kernel refuses others), so every layer is
    kept attached here, and a sandbox's layers are cloned here and then attached in the sandbox's namespace."""

    def __init__(self, root: str):
        self.root = root
        self.layers: dict[str, dict[str, list[str]]] = {}
        self.stacks: dict[int, tuple[str, dict[str, tuple[int, bool]]]] = {}
        self.frozen: set[int] = set()
        self.frozen_bytes: dict[int, int] = {}  # pid -> bytes its frozen tops held when frozen (they stay: covered)
        self.own_ns = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        self.own_root = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _overlay(self, pid: int, area: str, layer: str, size: int, own_tmpfs: bool) -> int:
        """Mount an overlay of ``layer``'s mounts for ``area`` at ``area`` of ``pid``, its upper and work folders on
        the area's own (empty) tmpfs when ``own_tmpfs``, else on a new tmpfs of ``size`` bytes mounted over the area
        first. Returns an fd of the upper folder."""
        paths = self.layers[layer][area]
        st = os.stat(paths[0])  # the overlay's root shows its upper folder's mode and times: the layer's
        clones = [_clone(AT_FDCWD, p) for p in paths]
        try:
            with _Inside(pid, self.own_ns, self.own_root):
                if own_tmpfs:
                    if os.listdir(area):
                        raise OSError(f"{area} is not empty")
                else:
                    tmp = _new_tmpfs(size, 0o755)
                    try:
                        _attach(tmp, area)
                    finally:
                        os.close(tmp)
                names = [f"{area}/{LOWER}{i}" for i in range(len(paths))]
                for d in [f"{area}/{UPPER}", f"{area}/{WORK}", *names]:
                    os.mkdir(d, 0o700)
                os.chown(f"{area}/{UPPER}", st.st_uid, st.st_gid)  # a sandbox's own user owns its area (docker)
                os.chmod(f"{area}/{UPPER}", st.st_mode & 0o7777)
                os.utime(f"{area}/{UPPER}", ns=(st.st_atime_ns, st.st_mtime_ns))
                upper = os.open(f"{area}/{UPPER}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    for clone, name in zip(clones, names, strict=True):
                        _attach(clone, name)
                    opts = f"lowerdir={':'.join(names)},upperdir={area}/{UPPER},workdir={area}/{WORK},{OPTIONS}"
                    _check(_libc.mount(b"overlay", area.encode(), b"overlay",
                                       ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC), opts.encode()),
                           "mount overlay")
                except BaseException:
                    os.close(upper)
                    raise
        finally:
            for fd in clones:
                os.close(fd)
        return upper

    def _stand(self, pid: int, layer: str, uppers: dict[str, tuple[int, bool]]) -> None:
        self.forget(pid, frozen=pid in self.frozen)
        self.stacks[pid] = (layer, uppers)
        if not all(own for _, own in uppers.values()):
            self.frozen.add(pid)

    def freeze(self, pid: int, name: str, size: int) -> None:
        """Raises OSError, its message ending ``[changed]`` when the sandbox's areas changed before it failed.

        The tmpfs that becomes the layer's top is made read-only as a file system (``MS_REMOUNT|MS_RDONLY``), not
        only as the mounts this process makes: a descriptor the sandbox opened on it before (a cwd, a folder, a
        process that survived) can then change nothing in it. Refused while a file of it is open for writing."""
        below_layer, stack = self.stacks.get(pid, ("", {}))
        uppers = {area: fd for area, (fd, _) in stack.items()}
        for area in AREAS:
            depth = len(self.layers[below_layer][area]) if below_layer else 0
            if depth + 1 > MAX_DEPTH:
                raise OSError(f"{area} stands on {depth} layers already")
        held = self.frozen_bytes.get(pid, 0)
        adding = sum(_used(uppers[a]) if a in uppers else _used(f"/proc/{pid}/root{a}") for a in AREAS)
        if held + adding > FROZEN_AREAS * size:
            raise OSError(f"its frozen layers would hold {held + adding} bytes, past {FROZEN_AREAS} areas' size")
        top_dir = f"{self.root}/{name}"
        os.mkdir(top_dir, 0o700)
        self.layers[name] = layer = {}
        changed = False
        made_ro: list[str] = []  # plain areas made read-only (put back on a refusal before anything else changed)
        tops: dict[str, int] = {}
        new_uppers: dict[str, tuple[int, bool]] = {}
        try:
            for area in AREAS:  # the layer's tops: read-only file systems from here
                with _Inside(pid, self.own_ns, self.own_root):
                    if area in uppers:  # the overlay's upper folder; the overlay goes (covered below the new one)
                        tops[area] = _clone(uppers[area])
                        changed = True
                        _check(_libc.umount2(area.encode(), MNT_DETACH), f"umount the overlay of {area}")
                        _read_only(area)
                    else:  # the area's own tmpfs
                        _read_only(area)
                        made_ro.append(area)
                        tops[area] = _clone(AT_FDCWD, area)
            for area in AREAS:  # the layer: each top on clones of what it stood on, mounted here
                paths = [f"{top_dir}/{area.strip('/')}-{i}" for i in
                         range(1 + (len(self.layers[below_layer][area]) if below_layer else 0))]
                os.mkdir(paths[0], 0o700)
                _attach(tops[area], paths[0])
                layer[area] = paths[:1]
                for src, dst in zip(self.layers[below_layer][area] if below_layer else [], paths[1:], strict=True):
                    os.mkdir(dst, 0o700)
                    clone = _clone(AT_FDCWD, src)
                    try:
                        _attach(clone, dst)
                    finally:
                        os.close(clone)
                    layer[area].append(dst)
            for area in AREAS:  # the sandbox goes on over the layer
                changed = True
                new_uppers[area] = (self._overlay(pid, area, name, size, own_tmpfs=False), False)
        except BaseException as exc:
            for fd, _ in new_uppers.values():
                os.close(fd)
            if not changed and made_ro:
                with _Inside(pid, self.own_ns, self.own_root):
                    for area in made_ro:
                        _libc.mount(None, area.encode(), None, ctypes.c_ulong(MS_REMOUNT | _KEEP), None)
            self.drop(name)
            raise OSError(f"{type(exc).__name__}: {exc}{' [changed]' if changed else ''}") from None
        finally:
            for fd in tops.values():
                os.close(fd)
        self.frozen.add(pid)
        self.frozen_bytes[pid] = held + adding
        self._stand(pid, name, new_uppers)

    def share(self, pid: int, name: str, size: int) -> None:
        if pid in self.stacks:
            raise OSError("it stands on a layer already")
        uppers: dict[str, tuple[int, bool]] = {}
        try:
            for area in AREAS:
                uppers[area] = (self._overlay(pid, area, name, size, own_tmpfs=True), True)
        except BaseException:
            for fd, _ in uppers.values():
                os.close(fd)
            raise
        self._stand(pid, name, uppers)

    def restand(self, pid: int, name: str, size: int) -> None:
        """Put the areas of ``pid`` back to layer ``name``: what stood there goes (an upper tmpfs of this process's
        is unmounted; the area's own tmpfs, as upper or as plain area, is emptied), and an overlay of the layer over
        an empty upper takes its place. Raises OSError, its message ending ``[changed]`` when the areas changed
        before it failed."""
        below_layer, stack = self.stacks.get(pid, ("", {}))
        os.stat(f"/proc/{pid}/ns/mnt")
        self.layers[name]  # noqa: B018 - a KeyError for an unknown layer, before anything changes
        changed = False
        uppers: dict[str, tuple[int, bool]] = {}
        try:
            for area in AREAS:
                upper = stack.get(area)
                with _Inside(pid, self.own_ns, self.own_root):
                    changed = True
                    if upper is not None:
                        _check(_libc.umount2(area.encode(), MNT_DETACH), f"umount the overlay of {area}")
                    if upper is not None and not upper[1]:  # an upper tmpfs of ours: it goes, with what it held
                        _check(_libc.umount2(area.encode(), MNT_DETACH), f"umount the upper tmpfs of {area}")
                        own = False
                    else:  # the area's own tmpfs: emptied, then the new upper is made on it
                        n = len(self.layers[below_layer][area]) if upper is not None else 0
                        for i in range(n):
                            _libc.umount2(f"{area}/{LOWER}{i}".encode(), MNT_DETACH)
                        for entry in os.listdir(area):
                            path = f"{area}/{entry}"
                            if os.path.isdir(path) and not os.path.islink(path):
                                shutil.rmtree(path)
                            else:
                                os.unlink(path)
                        own = True
                uppers[area] = (self._overlay(pid, area, name, size, own_tmpfs=own), own)
        except BaseException as exc:
            for fd, _ in uppers.values():
                os.close(fd)
            raise OSError(f"{type(exc).__name__}: {exc}{' [changed]' if changed else ''}") from None
        self._stand(pid, name, uppers)

    def unshare(self, pid: int) -> None:
        """Take the overlays and their layers out of the areas of ``pid`` (shared, never frozen) and remove the
        folders under them: its areas are its plain, empty tmpfs again."""
        if pid in self.frozen:
            raise OSError("its own areas are layers now: it cannot be given back")
        if pid not in self.stacks:
            return
        layer = self.layers[self.stacks[pid][0]]
        with _Inside(pid, self.own_ns, self.own_root):
            for area in AREAS:
                n = len(layer[area])
                for target in [area] + [f"{area}/{LOWER}{i}" for i in range(n)]:
                    if _libc.umount2(target.encode(), MNT_DETACH) != 0 and ctypes.get_errno() != EINVAL:
                        e = ctypes.get_errno()
                        raise OSError(e, f"umount {target}: {os.strerror(e)}")
                for d in [UPPER, WORK] + [f"{LOWER}{i}" for i in range(n)]:
                    if os.path.lexists(f"{area}/{d}"):
                        shutil.rmtree(f"{area}/{d}")
        self.forget(pid)

    def forget(self, pid: int, frozen: bool = False) -> None:
        """Close what was held for ``pid``; it stays marked frozen when ``frozen``."""
        _, uppers = self.stacks.pop(pid, ("", {}))
        for fd, _ in uppers.values():
            os.close(fd)
        if not frozen:
            self.frozen.discard(pid)
            self.frozen_bytes.pop(pid, None)

    def view(self, name: str) -> None:
        """Show layer ``name`` read-only at ``ROOT/name/view/<area>``."""
        top = f"{self.root}/{name}/view"
        os.mkdir(top, 0o700)
        for area, paths in self.layers[name].items():
            where = f"{top}{area}"
            os.mkdir(where, 0o700)
            if len(paths) == 1:
                clone = _clone(AT_FDCWD, paths[0])
                try:
                    _attach(clone, where)
                finally:
                    os.close(clone)
            else:
                _check(_libc.mount(b"overlay", where.encode(), b"overlay",
                                   ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY),
                                   f"lowerdir={':'.join(paths)},redirect_dir=follow".encode()), "mount the view")

    def unview(self, name: str) -> None:
        top = f"{self.root}/{name}/view"
        if not os.path.isdir(top):
            return
        for area in AREAS:
            _libc.umount2(f"{top}{area}".encode(), MNT_DETACH)
        shutil.rmtree(top, ignore_errors=True)

    def drop(self, name: str) -> None:
        """Take layer ``name``'s mounts out of this namespace (sandboxes hold their own clones)."""
        self.unview(name)
        for paths in self.layers.pop(name, {}).values():
            for p in paths:
                _libc.umount2(p.encode(), MNT_DETACH)
        shutil.rmtree(f"{self.root}/{name}", ignore_errors=True)

    def handle(self, req: dict) -> dict:
        op = req["op"]
        if op == "freeze":
            self.freeze(int(req["pid"]), _name(req["name"]), int(req["area_bytes"]))
        elif op == "share":
            failed = {}
            for pid in req["pids"]:
                try:
                    self.share(int(pid), _name(req["name"]), int(req["area_bytes"]))
                except Exception as exc:  # noqa: BLE001 - that sandbox is named (to be discarded), the others go on
                    failed[str(pid)] = f"{type(exc).__name__}: {exc}"
            return {"ok": True, "failed": failed}
        elif op == "restand":
            self.restand(int(req["pid"]), _name(req["name"]), int(req["area_bytes"]))
            return {"ok": True, "covered": int(req["pid"]) in self.frozen}
        elif op == "ping":
            pass
        elif op == "unshare":
            self.unshare(int(req["pid"]))
        elif op == "forget":
            self.forget(int(req["pid"]))
        elif op == "view":
            self.view(_name(req["name"]))
        elif op == "unview":
            self.unview(_name(req["name"]))
        elif op == "drop":
            self.drop(_name(req["name"]))
        else:
            raise ValueError(f"unknown op {op!r}")
        return {"ok": True}


def _name(name: object) -> str:
    name = str(name)
    if not name.isalnum():
        raise ValueError(f"bad layer name {name!r}")
    return name


def main() -> None:
    root = sys.argv[1]
    _check(_libc.unshare(CLONE_NEWNS), "unshare")
    _check(_libc.mount(b"none", b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None), "make / private")
    _check(_libc.mount(b"forkyard-layers", root.encode(), b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV | MS_NOEXEC),
                       b"size=4m,mode=0700"), "mount the layers' tmpfs")
    helper = Helper(root)
    sys.stdout.write(json.dumps({"ok": True, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            ans = helper.handle(json.loads(line))
        except Exception as exc:  # noqa: BLE001 - every failure is answered; the helper serves the next request
            ans = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
