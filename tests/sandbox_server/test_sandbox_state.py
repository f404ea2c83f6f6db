"""Sandbox state: ownership between servers (S22), full writable areas (S26) and file metadata across
fork and snapshot (S27), on every backend (docker, local with bubblewrap, local unisolated).

* S22: a second backend (same server name, in this process or another) never removes the first one's
  sandboxes; only what a dead process left is removed; ``close()`` removes the instance's folder.
* S26: writes past the documented limits (16 MiB per writable area counted in 4 KiB pages, 1,000 files per
  write, 4,096 entries per area) are refused with :class:`LimitExceeded` (HTTP 413, no retry hint), the
  message names the limit, no file of the failed write is left, and the sandbox is not replaced.
* S27: forks and restores carry modes, nanosecond mtimes, symbolic links, hard links, FIFOs, socket files and
  closed (0000) folders; a device makes the snapshot refuse loudly (naming the path); ``stat`` answers identically
  in siblings.
"""

from __future__ import annotations

import base64
import errno
import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from sandbox_server.agent import writes as agent_mod  # the module whose os.open a write uses
from sandbox_server.agent import AREA_BYTES, MAX_AREA_ENTRIES, MAX_WRITE_FILES, PAGE_BYTES, Agent
from sandbox_server.backends import LocalBackend, machine_id, owner_record
from sandbox_server.backends.cgroups import hierarchy
from sandbox_server.errors import LimitExceeded, ServiceUnavailable
from tests.docker_support import (
    ROOT, SERVER_NAME, delete_quietly, host_sh, require_bwrap, require_docker,
)


def _names(service, sid):
    with tarfile.open(fileobj=io.BytesIO(service.backend.snapshot(service._session(sid).sid))) as tar:
        return sorted(n for n in tar.getnames() if n not in ("scratch", "tmp"))


# -- S22: servers and processes never touch each other's sandboxes -----------------------------------------

@pytest.fixture(params=["local", "local-nobwrap"])
def local_kind(request):
    if request.param == "local":
        require_bwrap()
    return request.param == "local-nobwrap"


def test_s22_a_second_backend_leaves_the_first_ones_sandboxes(fixture_data, tmp_path, local_kind):
    name = f"{SERVER_NAME}-s22"
    a = LocalBackend(fixture_data, state_dir=tmp_path, server_name=name, unsafe_no_isolation=local_kind)
    b = None
    try:
        sid = a.create()
        a.write_files(sid, {"notes.txt": b"mine"})
        b = LocalBackend(fixture_data, state_dir=tmp_path, server_name=name, unsafe_no_isolation=local_kind)
        other = LocalBackend(fixture_data, state_dir=tmp_path, server_name="another-name",
                             unsafe_no_isolation=local_kind)
        assert a.state_dir != b.state_dir and a.state_dir.parent == b.state_dir.parent == tmp_path / name
        assert b.cleanup_orphans() == 0 and other.cleanup_orphans() == 0
        assert a.exec(sid, ["cat", "/scratch/notes.txt"], path_args=[1]).stdout == "mine"
        owner = json.loads((a.state_dir / "owner.json").read_text())
        assert owner["pid"] == os.getpid() and owner["machine"] == machine_id()
        other.close()
        a.close()
        assert not a.state_dir.exists() and b.state_dir.exists()
        assert b.cleanup_orphans() == 0
    finally:
        a.close()
        if b is not None:
            b.close()
            assert not b.state_dir.exists()


_HOLDER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from sandbox_server.backends import LocalBackend
b = LocalBackend(sys.argv[2], state_dir=sys.argv[3], server_name=sys.argv[4], unsafe_no_isolation=sys.argv[5] == "1")
b.cleanup_orphans()
sid = b.create()
b.write_files(sid, {"notes.txt": b"from the other process"})
print(b.state_dir / sid, flush=True)
sys.stdin.readline()
print(b.exec(sid, ["cat", "/scratch/notes.txt"], path_args=[1]).stdout, flush=True)
"""


def test_s22_two_processes_and_a_killed_one(fixture_data, tmp_path, local_kind):
    """Process A holds a sandbox; B (same name, same state root) starts and cleans up: A's file survives.
    After A is SIGKILLed, the next clean-up removes A's folder (and only then)."""
    name = f"{SERVER_NAME}-s22p"
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(ROOT), str(fixture_data), str(tmp_path), name,
                             "1" if local_kind else "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    b = None
    try:
        sbdir = Path(proc.stdout.readline().strip())
        assert sbdir.name.startswith("l-") and (sbdir / "scratch").is_dir()
        b = LocalBackend(fixture_data, state_dir=tmp_path, server_name=name, unsafe_no_isolation=local_kind)
        assert b.cleanup_orphans() == 0 and sbdir.exists()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "from the other process\n"  # A's sandbox still works after B's clean-up
        found = None if local_kind else hierarchy()  # the holder's sandbox has control groups (root, bwrap)
        groups = [root / f"forkyard-{name}@{sbdir.parent.name}" for root in (found[1] if found else [])]
        assert groups or local_kind or os.geteuid() != 0
        assert all((g / sbdir.name).is_dir() for g in groups)  # B's clean-up left the live holder's groups
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert sbdir.parent.exists()  # a killed process cannot clean up after itself...
        assert all(g.is_dir() for g in groups)
        assert b.cleanup_orphans() == 1 and not sbdir.parent.exists()  # ...the next one removes its folder
        assert not any(g.exists() for g in groups)  # ...and its control groups
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if b is not None:
            b.close()


def test_s22_owner_records_decide(fixture_data, tmp_path):
    """A folder whose pid was reused (another start time) is removed; one of another machine or PID namespace,
    or of a live process, is kept; the old flat layout is removed when nothing runs in it."""
    b = LocalBackend(fixture_data, state_dir=tmp_path, server_name="x", unsafe_no_isolation=True)
    try:
        me = owner_record()

        def inst(name: str, owner: dict | None) -> Path:
            d = tmp_path / "x" / name
            (d / "l-000000000000" / "scratch").mkdir(parents=True)
            if owner is not None:
                (d / "owner.json").write_text(json.dumps(owner))
            return d

        reused = inst(f"{os.getpid()}-aaaa", {**me, "start": 1})
        foreign = inst("1-bbbb", {**me, "machine": "another-boot:1", "pid": 1})
        live = inst(f"{os.getpid()}-cccc", me)
        no_record_live = inst(f"{os.getpid()}-dddd", None)
        dead = subprocess.Popen(["true"])
        dead.wait()
        no_record_dead = inst(f"{dead.pid}-eeee", None)
        flat = tmp_path / "x" / "l-111111111111"
        (flat / "scratch").mkdir(parents=True)
        assert b.cleanup_orphans() == 3
        assert not reused.exists() and not no_record_dead.exists() and not flat.exists()
        assert foreign.exists() and live.exists() and no_record_live.exists() and b.state_dir.exists()
    finally:
        b.close()


def test_s22_docker_leaves_a_live_owners_containers():
    require_docker()
    from sandbox_server.backends import OWNER_LABELS, DockerBackend

    name = f"{SERVER_NAME}-s22d"
    a = DockerBackend(server_name=name)
    dead_owner = DockerBackend(server_name=name)
    foreign = DockerBackend(server_name=name)
    b = None
    try:
        sid = a.create()
        a.write_files(sid, {"notes.txt": b"mine"})
        gone = subprocess.Popen(["true"])
        gone.wait()
        dead_owner._owner = {"machine": machine_id(), "pid": gone.pid, "start": 1}
        dsid = dead_owner.create()
        foreign._owner = {"machine": "another-boot:1", "pid": 1, "start": 1}
        f_run, f_exit = foreign.create(), foreign.create()
        assert a.container(sid).labels[OWNER_LABELS[1]] == str(os.getpid())
        s = foreign._socks[f_exit]  # its owner "went away": the agent reads EOF and the container exits
        getattr(s, "_sock", s).close()
        s.close()
        c = foreign.container(f_exit)
        for _ in range(100):
            c.reload()
            if c.status != "running":
                break
            time.sleep(0.05)
        assert c.status == "exited"
        b = DockerBackend(server_name=name)
        assert b.cleanup_orphans() == 2  # the dead owner's and the exited foreign one
        assert a.exec(sid, ["cat", "/scratch/notes.txt"]).stdout == "mine"
        assert foreign.exec(f_run, ["true"]).status == "ok"
        left = {ct.id[:12] for ct in b.client.containers.list(all=True, filters={"label": f"forkyard.sandbox={name}"})}
        assert left == {a.container(sid).id[:12], foreign.container(f_run).id[:12]}
        assert dead_owner.container(dsid).id[:12] not in left
    finally:
        for x in (a, dead_owner, foreign, b):
            if x is not None:
                x.close()


# -- S26: a full scratch area ---------------------------------------------------------------------------

def test_s26_past_the_area_size_is_a_client_error_with_nothing_left(service):
    info = service.create(files={"a.bin": b"a" * (6 << 20)})
    try:
        sid0 = service._session(info.id).sid
        service.write_files(info.id, {"b.bin": b"b" * (6 << 20)})
        with pytest.raises(LimitExceeded) as exc:
            service.write_files(info.id, {"c.bin": b"c" * (5 << 20), "d/e.bin": b"e" * 10})
        msg = str(exc.value)
        assert "16 MiB" in msg and str(AREA_BYTES) in msg and "/scratch" in msg
        assert not isinstance(exc.value, ServiceUnavailable)  # a client error: no retry hint
        assert service._session(info.id).sid == sid0  # the sandbox was not replaced
        assert _names(service, info.id) == ["scratch/a.bin", "scratch/b.bin"]  # no partial file, no new dir
        # the backend refuses the same way without the service's per-write byte cap in front of it
        with pytest.raises(LimitExceeded, match="16 MiB"):
            service.backend.write_files(sid0, {"big.bin": b"x" * (AREA_BYTES + 1)})
        assert _names(service, info.id) == ["scratch/a.bin", "scratch/b.bin"]
        # exactly the limit fits (whole pages)
        service.write_files(info.id, {"c.bin": b"c" * (4 << 20)})
        assert service.exec(info.id, "wc", {"path": "/scratch/c.bin"}).stdout.split()[2] == str(4 << 20)
    finally:
        delete_quietly(service, info.id)


def test_s26_ten_thousand_small_files_at_create(service):
    files = {f"f{i:05d}.txt": b"hello" for i in range(10_000)}
    before = service.pool_status()
    with pytest.raises(LimitExceeded) as exc:
        service.create(files=files)
    assert f"{MAX_WRITE_FILES} files per write" in str(exc.value)
    assert service.pool_status().sessions == before.sessions  # the half-made session is gone
    info = service.create(files=dict(list(files.items())[:MAX_WRITE_FILES]))  # the limit itself works
    try:
        assert service.exec(info.id, "find", {"path": "/scratch", "type": "f"}).stdout.count("\n") == MAX_WRITE_FILES
        # 4 more writes of 1,000 small files: 5,000 pages of 4 KiB > 16 MiB -> refused, nothing of that write left
        for k in range(1, 5):
            batch = {f"b{k}/{i:04d}": b"x" for i in range(MAX_WRITE_FILES)}
            try:
                service.write_files(info.id, batch)
            except LimitExceeded as exc2:
                assert "16 MiB" in str(exc2) and f"{MAX_AREA_ENTRIES} entries" in str(exc2)
                names = _names(service, info.id)
                assert not [n for n in names if n.startswith(f"scratch/b{k}")]
                assert len(names) == MAX_WRITE_FILES * k + (k - 1)  # the earlier batches and their folders
                break
        else:
            pytest.fail("5,000 files of 4 KiB pages fit in 16 MiB")
    finally:
        delete_quietly(service, info.id)


def test_s26_restore_past_the_limits_is_refused_and_changes_nothing(service):
    info = service.create(files={"keep.txt": b"keep"})
    try:
        sid = service._session(info.id).sid
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i in range(MAX_AREA_ENTRIES + 1):
                ti = tarfile.TarInfo(f"tmp/f{i}")
                tar.addfile(ti, io.BytesIO(b""))
        with pytest.raises(LimitExceeded, match=f"{MAX_AREA_ENTRIES} entries"):
            service.backend.restore(sid, buf.getvalue())
        assert _names(service, info.id) == ["scratch/keep.txt"]
    finally:
        delete_quietly(service, info.id)


def _agent(tmp_path: Path, **kw) -> Agent:
    for d in ("scratch", "tmp"):
        (tmp_path / d).mkdir(parents=True)
    return Agent({"/scratch": str(tmp_path / "scratch"), "/tmp": str(tmp_path / "tmp"), "/data": str(tmp_path)},
                 ["/data", "/scratch"], ["/scratch", "/tmp"], **kw)


def _b64(d: dict) -> dict:
    return {k: base64.b64encode(v).decode() for k, v in d.items()}


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
def test_s26_a_write_that_fails_midway_keeps_none_of_its_files(tmp_path, monkeypatch, err):
    a = _agent(tmp_path)
    assert a.handle({"op": "write", "files": _b64({"old.txt": b"old", "x/keep.txt": b"k"})}) == {"ok": True}
    real_open, calls = os.open, []

    def failing_open(path, flags, mode=0o777, **kw):  # fails on old.txt, the file this write replaces,
        calls.append(path)                              # whatever order the agent writes in
        if str(path).endswith("old.txt"):
            raise OSError(err, os.strerror(err), path)
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(agent_mod.os, "open", failing_open)
    ans = a.handle({"op": "write", "files": _b64({"n1.txt": b"1", "old.txt": b"new", "d/n3.txt": b"3", "n4": b"4"})})
    monkeypatch.undo()
    assert ans["error_kind"] == ("limit" if err != errno.EIO else "error"), ans
    assert "none of the files of this write were kept" in ans["error"]
    assert str(tmp_path) not in ans["error"] and "/scratch" in ans["error"]  # sandbox paths only
    left = sorted(str(p.relative_to(tmp_path / "scratch")) for p in (tmp_path / "scratch").rglob("*"))
    assert left == ["x", "x/keep.txt"]  # old.txt was being replaced: removed too (documented); d/ removed


def test_s26_limits_are_counted_in_pages(tmp_path):
    a = _agent(tmp_path, area_bytes=8 * PAGE_BYTES, max_write_files=5, max_area_entries=6)
    assert a.handle({"op": "write", "files": _b64({f"f{i}": b"x" for i in range(4)})}) == {"ok": True}  # 4 pages
    ans = a.handle({"op": "write", "files": _b64({"big": b"x" * (4 * PAGE_BYTES + 1)})})  # 5 more pages: 9 > 8
    assert ans["error_kind"] == "limit" and f"{8 * PAGE_BYTES} bytes" in ans["error"]
    assert a.handle({"op": "write", "files": _b64({"f0": b"x" * (PAGE_BYTES * 5)})}) == {"ok": True}  # replaces f0
    ans = a.handle({"op": "write", "files": _b64({f"g{i}": b"" for i in range(6)})})
    assert ans["error_kind"] == "limit" and "5 files per write" in ans["error"]
    ans = a.handle({"op": "write", "files": _b64({"g/h": b""})})  # 4 files + g + g/h = 6 entries: fits
    assert ans == {"ok": True}
    ans = a.handle({"op": "write", "files": _b64({"i": b""})})
    assert ans["error_kind"] == "limit" and "6 entries" in ans["error"]


# -- S27: fork and snapshot carry metadata ----------------------------------------------------------------

SETUP = ("cd /scratch && touch -d '2001-01-01 00:00:00.123456789' f && chmod 640 f && ln f hard && ln -s f lnk "
         "&& mkdir -p d/e && touch -d '2002-02-02 02:02:02' d/e/g && chmod 700 d/e && touch -d 2003-03-03 d "
         "&& ln -s d/e/g /scratch/glink && echo tmp > /tmp/t.txt && chmod 600 /tmp/t.txt "
         "&& touch -d 2004-04-04 /tmp/t.txt && ln -s ../etc/passwd /tmp/out "
         "&& echo s > secret && touch -d 2005-05-05 secret && chmod 000 secret && mkdir -p ro/in && echo x > ro/in/x "
         "&& chmod 500 ro/in && chmod 555 ro")


def _stats(service, sid):
    return {p: service.exec(sid, "stat", {"path": p}).stdout for p in (
        "/scratch/f", "/scratch/hard", "/scratch/lnk", "/scratch/d", "/scratch/d/e", "/scratch/d/e/g",
        "/scratch/secret",
        "/scratch/ro", "/scratch/ro/in", "/scratch/ro/in/x")}


def test_s27_fork_carries_modes_mtimes_and_links(service):
    origin = service.create(files={"f": b"content\n"})
    ids = [origin.id]
    try:
        r = host_sh(service, origin.id, SETUP)
        assert r.status == "ok" and r.exit_code == 0, r
        want = _stats(service, origin.id)
        assert "Modify: 2001-01-01 00:00:00.123456789 +0000" in want["/scratch/f"]
        assert "Mode: 0640" in want["/scratch/f"]
        assert "Type: symbolic link" in want["/scratch/lnk"] and "-> 'f'" in want["/scratch/lnk"]
        assert "Mode: 0700" in want["/scratch/d/e"] and "2003-03-03" in want["/scratch/d"]
        assert "Mode: 0000" in want["/scratch/secret"] and "Mode: 0555" in want["/scratch/ro"]
        for text in want.values():  # nothing host-dependent in the stat tool's answer
            assert not any(w in text for w in ("Inode", "Device", "Access", "Uid", "Change", "Birth", "Links"))
        kids = service.fork(origin.id, 2)
        snap = service.snapshot(origin.id)
        clone = service.clone(snap.id, 1)[0]
        grandkid = service.fork(kids[1].id, 1)[0]  # a restored sandbox packs again the same
        ids += [k.id for k in kids] + [clone.id, grandkid.id]
        for sid in [k.id for k in kids] + [clone.id, grandkid.id]:
            assert _stats(service, sid) == want
            assert service.exec(sid, "cat", {"path": "/scratch/lnk"}).stdout == "content\n"
            r = host_sh(service, sid, "stat -c '%h %i' /scratch/f /scratch/hard; readlink /scratch/glink; "
                                      "cat /tmp/t.txt; stat -c '%a %Y' /tmp/t.txt; readlink /tmp/out")
            lines = r.stdout.splitlines()
            assert lines[0].split()[0] == "2" and lines[0] == lines[1], r  # one inode, two names
            assert lines[2:] == ["d/e/g", "tmp", "600 1081036800", "../etc/passwd"]
        # a hard link is one file: writing through one name shows in the other, in the fork only
        host_sh(service, kids[0].id, "echo changed > /scratch/hard")
        assert service.exec(kids[0].id, "cat", {"path": "/scratch/f"}).stdout == "changed\n"
        assert service.exec(kids[1].id, "cat", {"path": "/scratch/f"}).stdout == "content\n"
        service.delete_snapshot(snap.id)
    finally:
        delete_quietly(service, *ids)


def test_s27_fifos_sockets_and_closed_folders_are_carried(service):
    """What a policy's own code can make in its areas never makes the episode unforkable: FIFOs, (stale) UNIX socket
    files and folders of mode 0000 with files inside are carried by forks and snapshots, modes and times included;
    the parent's closed folder is closed again after the pack, its times unchanged."""
    origin = service.create(files={"keep.txt": b"keep"})
    ids = [origin.id]
    make = ("mkfifo -m 640 /scratch/p && mkdir /tmp/sub && mkfifo /tmp/sub/p && "
            "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('/scratch/s')\" && "
            "mkdir -p /scratch/locked/in && echo inside > /scratch/locked/in/f && chmod 000 /scratch/locked && "
            "touch -d '2001-02-03 04:05:06' /scratch/locked")
    look = "stat -c '%n %F %a %Y' /scratch/p /tmp/sub/p /scratch/locked"
    try:
        r = host_sh(service, origin.id, make)
        assert r.status == "ok" and r.exit_code == 0, r
        before = host_sh(service, origin.id, look).stdout
        assert "fifo 640" in before and "directory 0 981173106" in before, before
        kids = service.fork(origin.id, 2)
        ids += [k.id for k in kids]
        snap = service.snapshot(origin.id)
        assert host_sh(service, origin.id, look).stdout == before  # the parent's folder closed again, same times
        for kid in kids:
            got = host_sh(service, kid.id, look + " && stat -c '%F' /scratch/s && chmod 700 /scratch/locked && "
                                           "cat /scratch/locked/in/f")
            assert got.stdout == before + "socket\ninside\n", got
        service.delete_snapshot(snap.id)
    finally:
        delete_quietly(service, *ids)


def test_s27_a_device_is_refused_loudly(tmp_path):
    """Nothing in a sandbox can make a device (no CAP_MKNOD); one put there from outside makes the pack refuse,
    naming it, never dropped."""
    if os.geteuid() != 0:
        pytest.skip("making a device needs root")
    a = _agent(tmp_path)
    os.mknod(tmp_path / "scratch" / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    ans = a.handle({"op": "pack"})
    assert ans["error_kind"] == "unsupported" and "/scratch/null" in ans["error"] and "device" in ans["error"]


def test_s27_restore_refuses_links_used_as_paths(tmp_path):
    """A tar whose file goes through an earlier symbolic link (``a -> /etc``, then ``a/x``) is refused and
    leaves the areas empty; a hard link to something not in the archive is refused."""
    a = _agent(tmp_path)
    for members in ([("scratch/a", tarfile.SYMTYPE, "/etc"), ("scratch/a/x", tarfile.REGTYPE, "")],
                    [("scratch/h", tarfile.LNKTYPE, "etc/passwd")],
                    [("etc/x", tarfile.REGTYPE, "")]):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, typ, link in members:
                ti = tarfile.TarInfo(name)
                ti.type, ti.linkname = typ, link
                tar.addfile(ti, io.BytesIO(b"") if typ == tarfile.REGTYPE else None)
        ans = a.handle({"op": "unpack", "data": base64.b64encode(buf.getvalue()).decode()})
        assert ans.get("error_kind") == "refused", ans
        assert str(tmp_path) not in ans["error"]
        assert not list((tmp_path / "scratch").iterdir())
    assert not Path("/etc/x").exists()


def test_s26_check_write_limits_before_any_sandbox():
    from sandbox_server.backends import check_write_limits

    check_write_limits({f"f{i}": b"x" for i in range(MAX_WRITE_FILES)})
    check_write_limits({"a": b"x" * AREA_BYTES})
    with pytest.raises(LimitExceeded, match=f"{MAX_WRITE_FILES} files per write"):
        check_write_limits({f"f{i}": b"" for i in range(MAX_WRITE_FILES + 1)})
    with pytest.raises(LimitExceeded, match="16 MiB"):
        check_write_limits({"a": b"x" * (AREA_BYTES - 10), "b": b"x"})  # two files: one page more than fits


def test_s27_unusual_modes_and_links_round_trip(tmp_path):
    """Read-only folders, a 0000 file and a link to a folder survive pack -> unpack into another agent; a
    write through a symbolic link is refused."""
    a = _agent(tmp_path / "a")
    s = tmp_path / "a" / "scratch"
    (s / "ro" / "in").mkdir(parents=True)
    (s / "ro" / "in" / "f").write_text("x")
    (s / "secret").write_text("s")
    os.symlink("ro", s / "dl")
    os.utime(s / "secret", ns=(1, 978307200_123456789))
    os.chmod(s / "secret", 0)
    os.chmod(s / "ro" / "in", 0o500)
    os.chmod(s / "ro", 0o555)
    packed = a.handle({"op": "pack"})
    assert "data" in packed, packed
    b = _agent(tmp_path / "b")
    for _ in range(2):  # twice: the second unpack must clear the read-only folders of the first
        assert b.handle({"op": "unpack", "data": packed["data"]}) == {"ok": True}
    t = tmp_path / "b" / "scratch"
    assert stat_mode(t / "secret") == 0 and os.lstat(t / "secret").st_mtime_ns == 978307200_123456789
    assert stat_mode(t / "ro") == 0o555 and stat_mode(t / "ro" / "in") == 0o500 and os.readlink(t / "dl") == "ro"
    ans = b.handle({"op": "write", "files": _b64({"dl/new.txt": b"x"})})
    assert ans["error_kind"] == "refused" and "/scratch/dl is a symbolic link" in ans["error"]
    assert b.handle({"op": "write", "files": {"x": 5}})["error_kind"] == "refused"
    for root in (tmp_path / "a", tmp_path / "b"):
        for d, dirs, _ in os.walk(root):
            for x in dirs:
                os.chmod(os.path.join(d, x), 0o755)


def stat_mode(p: Path) -> int:
    return os.lstat(p).st_mode & 0o7777


def test_one_write_lists_in_the_same_order_in_forks_and_clones(service):
    """Files of one write (given in any order) are created in path order, the order a restore recreates
    them in: `find` and recursive `grep` answer a fork or clone exactly as the original (anchor keys of
    the parent and its children agree)."""
    files = {"b.txt": b"x\n", "a.txt": b"x\n", "sub/c.txt": b"x\n", "sub/a.txt": b"x\n", "z/q": b"x\n"}
    sb = service.create(files=files)
    ids = [sb.id]
    try:
        calls = [("find", {"path": "/scratch"}), ("grep", {"pattern": "x", "path": "/scratch"})]
        base = [service.exec(sb.id, t, a).stdout for t, a in calls]
        assert base[0].count("\n") == 8
        kid = service.fork(sb.id, 1)[0]
        snap = service.snapshot(sb.id)
        clone = service.clone(snap.id, 1)[0]
        ids += [kid.id, clone.id]
        for other in (kid, clone):
            assert [service.exec(other.id, t, a).stdout for t, a in calls] == base
        service.delete_snapshot(snap.id)
    finally:
        delete_quietly(service, *ids)
