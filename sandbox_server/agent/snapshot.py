"""The ``pack`` and ``unpack`` operations (:class:`SnapshotOps`): the writable areas as a base64 PAX tar
and back. Carried: regular files, directories, symbolic links, hard links, FIFOs and (unbound, as every socket file
is once the process that bound it has gone) UNIX socket files, with their permission bits (setuid/setgid dropped) and
modification times to the nanosecond, whatever the modes the sandbox's own code set (a 0000 folder is opened for the
pack and closed again). Devices, which nothing in a sandbox can make, are refused, never dropped. Standard library
only.
"""

from __future__ import annotations

import base64
import binascii
import errno
import io
import os
import shutil
import stat
import tarfile

from .fs import TempReadable, clear_dir
from .protocol import INTERPRETER_STATE_BYTES, Fail, pages
from .state import AgentState


#: The PAX header that marks an empty member as a UNIX socket file.
SOCKET_HEADER = "FORKYARD.socket"
#: The archive member that carries the live interpreter's state by value (outside every area: never a file of the
#: sandbox; see :mod:`sandbox_server.interpreter_runner`), present only when a session ran.
SESSION_MEMBER = "FORKYARD.interpreter"


class SnapshotOps(AgentState):
    """``pack`` / ``unpack`` of an agent's writable areas (see the package docstring for the protocol)."""

    def op_pack(self, req: dict) -> dict:
        """``{"data": base64 tar, "size_bytes": n}`` of the writable areas (:meth:`pack_areas`)."""
        return self.pack_areas(None)

    def pack_areas(self, carried: bytes | None) -> dict:
        """``{"data": base64 tar, "size_bytes": n}`` of the writable areas, and ``carried`` (the interpreter's state,
        opaque bytes) as the member :data:`SESSION_MEMBER` when given. Raises Fail (``unsupported``)."""
        buf = io.BytesIO()
        seen: dict[tuple[int, int], str] = {}
        opened: list[tuple[str, os.stat_result]] = []  # folders the pack opened (mode without owner r-x), in order
        try:
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for w in self.writable:
                    h = self.host(w)
                    if os.path.isdir(h):
                        self._pack_tree(tar, h, w, seen, opened)
                if carried is not None:
                    ti = tarfile.TarInfo(SESSION_MEMBER)
                    ti.size = len(carried)
                    tar.addfile(ti, io.BytesIO(carried))
        finally:
            for path, st in reversed(opened):  # children first: a parent's mtime is put back last
                try:
                    os.chmod(path, stat.S_IMODE(st.st_mode))
                    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
                except OSError:
                    pass
        return {"data": base64.b64encode(buf.getvalue()).decode("ascii"), "size_bytes": buf.tell()}

    def _pack_tree(self, tar: tarfile.TarFile, host_root: str, virt_root: str, seen: dict, opened: list) -> None:
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
                if stat.S_IMODE(st.st_mode) & 0o500 != 0o500:  # open for the walk below it; closed again after
                    os.chmod(hpath, stat.S_IMODE(st.st_mode) | 0o500)
                    opened.append((hpath, st))
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
                    with TempReadable(hpath, st, 0o400), open(hpath, "rb") as f:
                        tar.addfile(ti, f)
            elif stat.S_ISLNK(st.st_mode):
                ti.type = tarfile.SYMTYPE
                ti.linkname = os.readlink(hpath)
                tar.addfile(ti)
            elif stat.S_ISFIFO(st.st_mode):
                ti.type = tarfile.FIFOTYPE
                tar.addfile(ti)
            elif stat.S_ISSOCK(st.st_mode):  # tar has no socket type: an empty member marked as one
                ti.pax_headers[SOCKET_HEADER] = "1"
                tar.addfile(ti)
            else:
                kind = "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a special file"
                raise Fail(f"cannot snapshot {vpath}: it is {kind}; snapshots carry regular files, directories, "
                           "links, FIFOs and socket files only (remove it first)", "unsupported")

    def op_unpack(self, req: dict) -> dict:
        """Replace the writable areas' contents with the base64 tar ``data`` (checked whole against the
        limits first; on failure the areas are left empty). The answer's ``carried`` holds the bytes of the member
        :data:`SESSION_MEMBER` (None without one): the caller takes it out before answering. Raises Fail (refused |
        unsupported | limit | error)."""
        try:
            raw = base64.b64decode(req.get("data") or "", validate=True)
        except (binascii.Error, ValueError) as exc:
            raise Fail(f"the archive is not base64: {exc}", "refused") from None
        members: list[tarfile.TarInfo] = []
        tar = None
        if raw:
            try:
                tar = tarfile.open(fileobj=io.BytesIO(raw), mode="r")
                members = tar.getmembers()
            except tarfile.TarError as exc:
                raise Fail(f"the archive cannot be read: {exc}", "refused") from None
        carried = None
        for m in [m for m in members if m.name == SESSION_MEMBER]:
            members.remove(m)
            src = tar.extractfile(m) if tar is not None and m.isreg() else None
            if src is None:
                raise Fail(f"archive member {SESSION_MEMBER} is not an interpreter state", "refused")
            if m.size > INTERPRETER_STATE_BYTES:
                raise Fail(f"archive member {SESSION_MEMBER} holds {m.size} bytes; an interpreter state is at most "
                           f"{INTERPRETER_STATE_BYTES}", "refused")
            carried = src.read()
        files_seen: set[str] = set()
        usage = {w: [0, 0] for w in self.writable}  # bytes, entries
        for m in members:
            virt = os.path.normpath("/" + m.name)
            area = self._area_of(virt)
            if area is None or (virt == area and not m.isdir()):
                raise Fail(f"archive member {m.name!r} outside the writable areas", "refused")
            if not (m.isdir() or m.isreg() or m.issym() or m.islnk() or m.isfifo()):
                raise Fail(f"archive member {virt} is not a file, directory or link", "unsupported")
            if virt != area:
                usage[area][1] += 1
            if m.isreg():
                usage[area][0] += pages(m.size)
                files_seen.add(virt)
            if m.islnk():
                target = os.path.normpath("/" + m.linkname)
                if target not in files_seen:
                    raise Fail(f"hard link {virt} -> {target}: the target is not an earlier file of the archive",
                               "refused")
        for w, (nbytes, entries) in usage.items():
            self._check_limits(w, nbytes, entries, what="the snapshot")
        for w in self.writable:
            clear_dir(self.host(w))
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
        except (OSError, Fail) as exc:
            for w in self.writable:
                clear_dir(self.host(w))
            if isinstance(exc, Fail):
                raise
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise Fail(f"restoring the snapshot filled a writable area: {self._limit_text()}", "limit") from None
            raise Fail(f"restoring the snapshot failed: {exc}") from None
        return {"ok": True, "carried": carried}

    def _extract(self, tar: tarfile.TarFile | None, m: tarfile.TarInfo, dirs: list) -> None:
        virt = os.path.normpath("/" + m.name)
        area = self._area_of(virt)
        assert tar is not None and area is not None  # op_unpack checked every member first
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
        if m.isfifo() or (m.isreg() and m.pax_headers.get(SOCKET_HEADER) == "1" and m.size == 0):
            if m.isfifo():
                os.mkfifo(dest, 0o600)
            else:
                _make_socket_file(dest)
            os.chmod(dest, mode)
            os.utime(dest, ns=(mtime_ns, mtime_ns))
        elif m.isreg():
            src = tar.extractfile(m)
            assert src is not None  # a regular file's member
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


def _make_socket_file(path: str) -> None:
    """Make an unbound UNIX socket file at ``path`` (bound, then closed: what a socket file is once its process went).
    The path is made relative to a folder opened first, since a bound name holds 107 bytes at most."""
    import socket

    parent, name = os.path.split(path)
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(f"/proc/self/fd/{fd}/{name}" if len(os.fsencode(path)) > 100 else path)
    finally:
        s.close()
        os.close(fd)
