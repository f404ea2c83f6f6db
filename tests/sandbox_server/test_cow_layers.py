"""Copy-on-write forks (sandbox_server/backends/layers.py) on both backends: a fork of a sandbox whose areas hold at
least HOST_COPY_MIN_BYTES freezes them in place into a read-only layer, and each copy mounts it under an overlay.
Real bubblewrap sandboxes and Docker containers, a real mount helper, real overlayfs; the contents are read back
through the agents' tar (``export``) and the mounts from ``/proc/<pid>/mountinfo`` on the host."""

from __future__ import annotations

import gc
import io
import os
import tarfile
import time

import pytest

from sandbox_server.backends.layers import Layers
from sandbox_server.service import HOST_COPY_MIN_BYTES, SandboxService, ServiceConfig
from tests.docker_support import backend_for, require_bwrap, require_docker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["local", "docker"])
def svc(request, fixture_data):
    require_docker() if request.param == "docker" else require_bwrap()
    why = Layers.available()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI runs as root with overlayfs: layers must work there ({why})")
        pytest.skip(why)
    service = SandboxService(backend_for(request.param, "layers-test", fixture_data),
                             ServiceConfig(min_idle=3, max_total=24, max_concurrent_starts=2, default_timeout_s=5.0,
                                           max_timeout_s=10.0, acquire_timeout_s=30.0)).start()
    yield service
    service.close()


def members(svc, sid) -> list[tuple]:
    """(name, type, mode, mtime, size, link target, bytes) of every member of a sandbox's export."""
    return tar_members(svc.export(sid))


def tar_members(data: bytes) -> list[tuple]:
    """(name, type, mode, mtime, size, link target, bytes) of every member of a tar."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return sorted((m.name, m.type, m.mode, m.mtime, m.size, m.linkname,
                       tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers())  # type: ignore


def mounts(svc, sid) -> list[tuple[str, str, str]]:
    """(mount point, fs type, mount options) of the mounts the sandbox's agent sees, from the host."""
    pid = svc.backend._ns_pid(svc._session(sid).sid)
    out = []
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ")
            out.append((left.split()[4], right.split()[0], left.split()[5]))
    return out


SHAPE = ("import os\nos.makedirs('/scratch/w/empty', exist_ok=True)\n"
         "open('/scratch/w/a.txt', 'w').write('alpha')\nos.link('/scratch/w/a.txt', '/scratch/w/hard')\n"
         "os.symlink('a.txt', '/scratch/w/soft')\nos.chmod('/scratch/w/a.txt', 0o640)\n"
         "os.utime('/scratch/w/a.txt', (1e9, 1e9))\nos.utime('/scratch/w/empty', (2e9, 2e9))\n"
         "os.chmod('/scratch', 0o750)\nopen('/tmp/t.txt', 'w').write('tmp')\n"
         "open('/scratch/w/big.bin', 'wb').write(os.urandom(300_000))\n")


def shaped(svc) -> str:
    """A workspace sandbox holding SHAPE's files (more than HOST_COPY_MIN_BYTES)."""
    sid = svc.create(cwd="/scratch", families=["workspace"]).id
    assert svc.exec(sid, "write_file", {"path": "shape.py", "text": SHAPE}).exit_code == 0
    res = svc.exec(sid, "run_python", {"path": "shape.py"})
    assert res.exit_code == 0, res
    assert svc.exec(sid, "remove", {"path": "shape.py"}).exit_code == 0
    return sid


def test_a_fork_freezes_the_workspace_in_place_and_the_copies_stand_on_it_apart(svc):
    sid = shaped(svc)
    before = members(svc, sid)
    assert sum(m[4] for m in before) >= HOST_COPY_MIN_BYTES
    kids = [k.id for k in svc.fork(sid, 3)]
    try:
        layers = svc.backend._layers
        assert all(layers.mounts(svc._session(x).sid) for x in [sid, *kids])  # the source stands on it too
        for k in kids:
            assert members(svc, k) == before  # bytes, modes, times, links, the empty folder, /tmp, the area's mode
            kinds = {m[0]: (m[1], m[2]) for m in mounts(svc, k)}
            assert kinds["/scratch"][0] == "overlay" and kinds["/tmp"][0] == "overlay"
            assert {"noexec", "nosuid", "nodev"} <= set(kinds["/scratch"][1].split(","))
        # what one writes, renames or removes reaches no other, nor the source; the source's later writes no copy
        assert svc.exec(kids[0], "write_file", {"path": "w/a.txt", "text": "changed"}).exit_code == 0
        assert svc.exec(kids[0], "remove", {"path": "w/big.bin"}).exit_code == 0
        assert svc.exec(kids[1], "write_file", {"path": "mv.py", "text": "import os\nos.rename('/scratch/w',"
                                                "'/scratch/v')\n"}).exit_code == 0
        assert svc.exec(kids[1], "run_python", {"path": "mv.py"}).exit_code == 0
        assert svc.exec(sid, "write_file", {"path": "later.txt", "text": "later"}).exit_code == 0
        assert svc.exec(kids[0], "cat", {"path": "w/a.txt"}).stdout == "changed"
        assert svc.exec(kids[0], "cat", {"path": "w/hard"}).stdout == "changed"  # one file, two names (index=on)
        assert "big.bin" not in svc.exec(kids[0], "ls", {"path": "w"}).stdout
        assert svc.exec(kids[1], "ls", {"path": "."}).stdout.split() == ["mv.py", "v"]
        assert members(svc, kids[2]) == before
        after = [m for m in members(svc, sid) if not m[0].endswith("later.txt")]
        assert [m for m in after if m[0] != "scratch"] == [m for m in before if m[0] != "scratch"]
        for k in kids:
            assert "later.txt" not in svc.exec(k, "ls", {"path": "."}).stdout
    finally:
        for k in kids:
            svc.delete(k)
        svc.delete(sid)


def test_code_in_a_copy_cannot_reach_or_change_the_layer_and_cannot_execute_there(svc):
    sid = shaped(svc)
    before = members(svc, sid)
    kid = svc.fork(sid, 1)[0].id
    try:
        probe = ("import ctypes, os, subprocess\n"
                 "print(sorted(n for n in os.listdir('/scratch') if n.startswith('.')))\n"
                 "libc = ctypes.CDLL(None, use_errno=True)\n"
                 "for t in (b'/scratch', b'/tmp'):\n"
                 "    print(libc.umount2(t, 2), ctypes.get_errno())\n"
                 "open('/scratch/x.sh', 'w').write('#!/bin/sh\\necho ran\\n'); os.chmod('/scratch/x.sh', 0o755)\n"
                 "try:\n    subprocess.run(['/scratch/x.sh']); print('executed')\n"
                 "except PermissionError:\n    print('no exec')\n")
        assert svc.exec(kid, "write_file", {"path": "probe.py", "text": probe}).exit_code == 0
        out = svc.exec(kid, "run_python", {"path": "probe.py"}).stdout.splitlines()
        assert out[0] == "[]"  # the upper, work and layer folders are under the overlay: unseen
        assert out[1].startswith("-1 ") and out[2].startswith("-1 ")  # no unmounting to reach them
        assert out[3] == "no exec"
        assert members(svc, sid) == before  # the source reads as before
    finally:
        svc.delete(kid)
        svc.delete(sid)


def wait_for(cond, timeout_s: float = 20.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_copies_are_recycled_plain_the_source_is_destroyed_and_the_layers_go(svc):
    backend, layers = svc.backend, svc.backend._layers
    sid = shaped(svc)
    source = svc._session(sid).sid
    kids = [k.id for k in svc.fork(sid, 2)]
    kid_sids = [svc._session(k).sid for k in kids]
    for k in kids:
        svc.delete(k)
    svc.delete(sid)
    assert wait_for(lambda: all(s in svc.pool._idle for s in kid_sids))  # recycled: idle in the pool again
    assert wait_for(lambda: source not in svc.pool._idle and backend._ns_pid(source) is None)  # destroyed: its
    # areas were its copies' layers
    assert not any(layers.mounts(s) for s in [source, *kid_sids])
    for s in kid_sids:  # plain, empty areas: one tmpfs each, nothing under it
        pid = backend._ns_pid(s)
        with open(f"/proc/{pid}/mountinfo") as f:
            points = [(line.split()[4], line.split(" - ")[1].split()[0]) for line in f]
        areas = sorted(p for p in points if p[0].startswith(("/scratch", "/tmp")))
        assert areas == [("/scratch", "tmpfs"), ("/tmp", "tmpfs")]
        assert os.listdir(f"/proc/{pid}/root/scratch") == [] and os.listdir(f"/proc/{pid}/root/tmp") == []
    gc.collect()  # the sessions' restore points (holds on the layer) are gone: the flusher drops the layers
    assert wait_for(lambda: layers._drops == [] and os.listdir(f"/proc/{layers._helper_pid}/root{layers.root}") == [])


def test_a_copy_whose_agent_died_is_rebuilt_from_the_layer(svc):
    sid = shaped(svc)
    before = members(svc, sid)
    kid = svc.fork(sid, 1)[0].id
    try:
        os.kill(svc.backend._ns_pid(svc._session(kid).sid), 9)
        res = svc.exec(kid, "cat", {"path": "w/a.txt"})
        if res.sandbox_replaced is not True:  # the kill may land after the call: the next one replaces it
            res = svc.exec(kid, "cat", {"path": "w/a.txt"})
        assert svc.exec(kid, "cat", {"path": "w/a.txt"}).stdout == "alpha"
        assert members(svc, kid) == before
    finally:
        svc.delete(kid)
        svc.delete(sid)


def test_forks_of_copies_and_forks_again_stack_the_layers(svc):
    sid = shaped(svc)
    first = svc.fork(sid, 1)[0].id
    assert svc.exec(sid, "write_file", {"path": "second.txt", "text": "2"}).exit_code == 0
    assert svc.exec(sid, "remove", {"path": "w/soft"}).exit_code == 0
    second = svc.fork(sid, 1)[0].id  # the source, frozen again: its writes since are the new layer's top
    assert svc.exec(first, "write_file", {"path": "w/a.txt", "text": "first"}).exit_code == 0
    grand = svc.fork(first, 2)  # a copy frozen in turn
    at_fork = members(svc, first)
    try:
        rp = svc._session(grand[0].id).restore_point  # the layer over the layer it stood on, as one tar
        assert tar_members(rp.tar()) == at_fork
        assert svc.exec(second, "cat", {"path": "second.txt"}).stdout == "2"
        assert "soft" not in svc.exec(second, "ls", {"path": "w"}).stdout  # a removal carried as a whiteout
        assert "soft" in svc.exec(first, "ls", {"path": "w"}).stdout
        for g in grand:
            assert svc.exec(g.id, "cat", {"path": "w/a.txt"}).stdout == "first"
            assert "second.txt" not in svc.exec(g.id, "ls", {"path": "."}).stdout
        assert members(svc, grand[0].id) == members(svc, first)
    finally:
        for x in [g.id for g in grand] + [first, second, sid]:
            svc.delete(x)


def test_a_copy_keeps_its_area_bound(svc):
    sid = shaped(svc)
    kid = svc.fork(sid, 1)[0].id
    try:
        bomb = ("n = 0\ntry:\n    with open('/scratch/fill.bin', 'wb') as f:\n        while True:\n"
                "            f.write(b'x' * (1 << 20)); f.flush(); n += 1\n"
                "except OSError as e:\n    print(n, e.errno)\n")
        assert svc.exec(kid, "write_file", {"path": "bomb.py", "text": bomb}).exit_code == 0
        out = svc.exec(kid, "run_python", {"path": "bomb.py"}).stdout.split()
        assert out[1] == "28" and int(out[0]) <= 16  # ENOSPC within the area's 16 MiB
        assert "fill.bin" not in svc.exec(sid, "ls", {"path": "."}).stdout
    finally:
        svc.delete(kid)
        svc.delete(sid)


def test_a_rollback_or_a_clone_of_a_frozen_snapshot_stands_on_its_layer(svc):
    """A snapshot of large areas freezes them too; a rollback to it (of the same sandbox, of another one with its own
    files, of a copy standing on another layer) and a clone of it stand on that layer, nothing unpacked; the
    snapshot's tar is as before."""
    layers = svc.backend._layers
    sid = shaped(svc)
    before = members(svc, sid)
    snap = svc.snapshot(sid)
    assert svc.snapshots.get(snap.id).layer is not None and tar_members(svc.snapshot_bytes(snap.id)) == before
    other = shaped(svc)  # a sandbox never forked: its own files in its own tmpfs
    assert svc.exec(other, "write_file", {"path": "mine.txt", "text": "mine"}).exit_code == 0
    copy = svc.fork(other, 1)[0].id  # stands on other's layer, its upper on its own tmpfs
    clones = [c.id for c in svc.clone(snap.id, 2)]
    try:
        for round_ in range(2):  # the second time, what stood there is an upper tmpfs of the helper's
            assert svc.exec(sid, "write_file", {"path": "w/a.txt", "text": f"changed {round_}"}).exit_code == 0
            assert svc.exec(sid, "remove", {"path": "w/big.bin"}).exit_code == 0
            assert svc.exec(sid, "write_file", {"path": "later.txt", "text": "later"}).exit_code == 0
            svc.rollback(sid, snap.id)
            assert members(svc, sid) == before
        for x in (other, copy, *clones):
            if x in (other, copy):
                svc.rollback(x, snap.id)
            assert members(svc, x) == before
            assert layers.mounts(svc._session(x).sid)
            assert {m[0]: m[1] for m in mounts(svc, x)}["/scratch"] == "overlay"
        assert svc.exec(copy, "write_file", {"path": "after.txt", "text": "a"}).exit_code == 0
        assert "after.txt" not in svc.exec(sid, "ls", {"path": "."}).stdout
        copy_sid = svc._session(copy).sid
    finally:
        for x in (copy, *clones, other, sid):
            svc.delete(x)
        svc.delete_snapshot(snap.id)
    assert wait_for(lambda: copy_sid in svc.pool._idle)  # its own tmpfs held its upper: recycled plain


def test_a_mount_helper_killed_costs_its_layers_never_a_copy_s_files(svc):
    """The helper holds the layers; killed, it takes them along: the copies keep their files (their mounts are their
    own), a fork of a sandbox standing on a lost layer copies instead, the sandboxes on lost layers are destroyed when
    released (never recycled with stale mounts), and a new helper makes new layers."""
    layers = svc.backend._layers
    sid = shaped(svc)
    before = members(svc, sid)
    kids = [k.id for k in svc.fork(sid, 2)]
    os.kill(layers._helper_pid, 9)
    time.sleep(0.2)
    try:
        for k in kids:
            assert members(svc, k) == before
        again = svc.fork(sid, 1)[0].id  # its source stands on a lost layer: copied, not frozen
        kids.append(again)
        assert members(svc, again) == before and not layers.mounts(svc._session(again).sid)
        fresh = shaped(svc)
        kids.append(fresh)
        frozen = svc.fork(fresh, 1)[0].id  # a new helper, a new layer
        kids.append(frozen)
        assert layers.mounts(svc._session(frozen).sid) and layers.generation >= 1
    finally:
        lost = [svc._session(k).sid for k in kids[:2]]
        for k in kids:
            svc.delete(k)
        svc.delete(sid)
    assert wait_for(lambda: not any(s in svc.pool._idle for s in lost) and
                    all(svc.backend._ns_pid(s) is None for s in lost))


def test_a_descriptor_opened_before_the_freeze_cannot_change_the_layer(svc):
    """A process that outlives the freeze holding a folder of the frozen tmpfs (an interpreter's waiting copy, kept by
    a snapshot and resumed by a rollback after the sandbox lost the family and was forked) writes nothing into the
    layer: the frozen tmpfs is read-only as a file system, not only as the helper's mounts."""
    a = svc.create(cwd="/scratch", families=["workspace", "interpreter"]).id
    b = shaped(svc)
    kids: list[str] = []
    try:
        cell = svc.exec(a, "run_cell", {"code": "import os\nfd = os.open('/scratch', os.O_RDONLY | os.O_DIRECTORY)"})
        assert cell.status == "ok", cell
        own = svc.snapshot(a).id  # keeps a waiting copy of the interpreter, fd open
        svc.rollback(a, svc.snapshot(b).id)  # a: b's files and families (no interpreter); the waiting copy stays
        before = members(svc, a)
        kids = [k.id for k in svc.fork(a, 2)]  # a's own tmpfs frozen into the layer
        svc.rollback(a, own)  # the waiting copy resumes, fd still on the frozen tmpfs
        out = svc.exec(a, "run_cell", {"code": "os.open('planted.txt', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)"})
        assert "Read-only file system" in out.stdout + out.stderr + out.message
        for k in kids:
            assert members(svc, k) == before
    finally:
        for x in [*kids, a, b]:
            svc.delete(x)


def test_the_layers_a_sandbox_froze_stay_bounded_and_forks_go_on(svc):
    """Each freeze keeps what the sandbox wrote since the last one in its memory (a covered, read-only tmpfs); past
    4 areas' size in all the next freeze is refused and the fork copies instead: rewriting 12 MiB between 6 forks
    leaves the sandbox able to use its memory, and every copy holds what it should."""
    sid = svc.create(cwd="/scratch", families=["workspace"]).id
    layers, kids = svc.backend._layers, []
    try:
        for i in range(6):
            svc.exec(sid, "remove", {"path": f"blob{i - 1}"})
            svc.write_files(sid, {f"blob{i}/a": bytes([i]) * (6 << 20)})  # one write takes at most 8 MiB
            svc.write_files(sid, {f"blob{i}/b": bytes([i]) * (6 << 20)})
            kid = svc.fork(sid, 1)[0].id
            assert svc.exec(kid, "ls", {"path": "."}).stdout.split() == [f"blob{i}"]
            kids.append(kid)
        assert not layers.mounts(svc._session(kids[-1]).sid)  # copied: the freeze was refused
        big = "b = bytearray(96 << 20)\nprint(len(b))\n"  # memory left beside what was frozen (cgroup 256 MiB)
        assert svc.exec(sid, "write_file", {"path": "m.py", "text": big}).exit_code == 0
        assert svc.exec(sid, "run_python", {"path": "m.py"}).stdout.strip() == str(96 << 20)
    finally:
        for x in [*kids, sid]:
            svc.delete(x)
