"""Behaviour of the sandbox service, written once and run on both backends (local and a real Docker engine).

Field cases S1-S5 and S9 of ../shared/cases/README.md, each for its whole kind, plus snapshot / clone /
fork independence and recovery from a hung agent. The per-call timeout is 2 s; slow cases run in
parallel on separate sandboxes to keep the suite short.
"""

from __future__ import annotations

import io
import json
import os
import signal
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from envs.text_space import TextSpace
from sandbox_server.errors import SandboxNotFound, ToolRefused
from tests.docker_support import CAP

MARK = "[... output cut at"


@pytest.fixture
def sb(service):
    info = service.create()
    yield info.id
    try:
        service.delete(info.id)
    except SandboxNotFound:
        pass


def writable_names(service, sid):
    """Names in the sandbox's writable areas (/scratch, /tmp), read through a snapshot (the areas' own
    entries, which carry their mode and mtime, left out)."""
    with tarfile.open(fileobj=io.BytesIO(service.backend.snapshot(service._session(sid).sid))) as tar:
        return [n for n in tar.getnames() if n not in ("scratch", "tmp")]


def run(service, sid, tool, **args):
    return service.exec(sid, tool, args)


# -- each tool ------------------------------------------------------------------------------------------

def test_each_tool_runs(service, sb):
    assert "Lib" in run(service, sb, "ls").stdout.split()
    assert "-rf" in run(service, sb, "ls", all=True).stdout.split()
    assert run(service, sb, "cat", path="notes.txt").stdout.startswith("alpha\n")
    assert run(service, sb, "head", path="notes.txt", lines=2).stdout == "alpha\nbeta\n"
    assert run(service, sb, "tail", path="notes.txt", lines=1).stdout == "-dash line\n"
    assert run(service, sb, "wc", path="notes.txt").stdout.split()[:3] == ["4", "6", "33"]
    r = run(service, sb, "grep", pattern="needle", path="sub")
    assert r.stdout == "sub/deep/file.txt:1:deep needle\n" and r.exit_code == 0
    assert run(service, sb, "grep", pattern="^-dash", path="notes.txt", recursive=False).stdout == "4:-dash line\n"
    assert run(service, sb, "grep", pattern="a.b", path="notes.txt", fixed=True).exit_code == 1  # literal: no match
    assert "Lib/json/decoder.py" in run(service, sb, "find", path="Lib", name="*.py", type="f").stdout
    assert run(service, sb, "find", path=".", maxdepth=0).stdout == ".\n"
    assert "Size: 6" in run(service, sb, "stat", path="a.txt").stdout
    assert run(service, sb, "cat", path="oklink").stdout.startswith("alpha")  # a link inside the root is fine
    r = run(service, sb, "cat", path="missing.txt")
    assert r.status == "ok" and r.exit_code == 1 and "No such file" in r.stderr


def test_corpus_and_manifest_are_readable(service, sb):
    man = json.loads(run(service, sb, "cat", path="MANIFEST.json").stdout)
    assert len(man["files"]) >= 40 and man["content_hash"]
    assert "def dedent" in run(service, sb, "grep", pattern="def dedent", path="Lib").stdout


# -- S1: shell syntax is data --------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["notes.txt; rm -rf /data", "$(touch /tmp/pwned)", "`touch /tmp/pwned`",
                                  "a.txt && touch /tmp/pwned", "a.txt | sh", "x > a.txt"])
def test_s1_shell_metacharacters_reach_the_tool_literally(service, sb, path):
    r = run(service, sb, "cat", path=path)
    assert r.status == "ok" and r.exit_code == 1 and "No such file" in r.stderr
    assert writable_names(service, sb) == []  # no /tmp/pwned, nothing written at all
    assert run(service, sb, "cat", path="a.txt").stdout == "apple\n"  # data unchanged


def test_s1_a_weird_file_name_is_just_a_name(service, sb):
    assert run(service, sb, "cat", path="weird name;rm -rf x").stdout == "literal name\n"


def test_s1_newline_then_command_is_refused(service, sb):
    with pytest.raises(ToolRefused, match="control character"):
        run(service, sb, "cat", path="a.txt\ntouch /tmp/pwned")


# -- S2 / S9: refusals, including the sandbox's on-filesystem (symlink) check ------------------------------

@pytest.mark.parametrize("tool,args", [
    ("cat", {"path": "../../etc/passwd"}), ("cat", {"path": "/data/../data2/secret"}),
    ("cat", {"path": "/data2/secret"}), ("cat", {"path": "link"}), ("grep", {"pattern": "root", "path": "dirlink"}),
    ("head", {"path": "/proc/self/environ"}), ("ls", {"path": "dirlink"}), ("find", {"path": "dirlink"}),
    ("stat", {"path": "link"}), ("find", {"path": ".", "exec": "touch /tmp/pwned {} ;"}),
    ("grep", {"pattern": "", "path": "/"}), ("find", {"path": "/"}), ("cat", {"path": "a\x00b"}),
    ("cat", {"path": "x" * 5000}), ("nope", {}),
])
def test_refusals_run_nothing_and_leak_nothing(service, sb, tool, args):
    with pytest.raises(ToolRefused) as exc:
        run(service, sb, tool, **args)
    msg = str(exc.value)
    assert msg and "root:" not in msg and "secret\n" not in msg


def test_s2_find_cannot_follow_links_out(service, sb):
    r = run(service, sb, "find", path=".", name="passwd")
    assert r.stdout == "" and r.status == "ok"  # dirlink -> / is listed, never followed
    r = run(service, sb, "grep", pattern="root:", path=".", fixed=True)
    assert "root:x:" not in r.stdout  # -r does not follow links met while recursing


def test_s9_leading_dash_path_is_a_file(service, sb):
    assert run(service, sb, "cat", path="-rf").stdout == "a file named -rf\n"
    assert run(service, sb, "find", path="-rf").stdout == "./-rf\n"


# -- S3: timeouts ------------------------------------------------------------------------------------------

def test_s3_timeouts_kill_everything_and_the_sandbox_stays_usable(service):
    ids = [service.create().id for _ in range(4)]
    try:
        cases = [
            (ids[0], lambda s: service.exec(s, "cat", {"path": "fifo"}, timeout_s=2)),
            (ids[1], lambda s: service.exec_argv(s, ["sh", "-c", "echo started; sleep 1000.123 & exit 0"],
                                                 timeout_s=2)),
            (ids[2], lambda s: service.exec_argv(s, ["cat"], timeout_s=2)),
            (ids[3], lambda s: service.exec_argv(s, ["grep", "foo"], timeout_s=2)),
        ]
        t0 = time.monotonic()
        with ThreadPoolExecutor(4) as ex:
            futs = [ex.submit(fn, sid) for sid, fn in cases]
            results = [f.result() for f in futs]
        assert time.monotonic() - t0 < 2 + 1.5
        fifo, orphan, bare_cat, bare_grep = results
        assert fifo.status == "timeout" and fifo.duration_s < 3.0
        assert orphan.status == "timeout" and orphan.stdout == "started\n"  # partial output kept
        assert bare_cat.status == "ok" and bare_cat.duration_s < 1.0  # stdin is empty: returns at once
        assert bare_grep.status == "ok" and bare_grep.exit_code == 1 and bare_grep.duration_s < 1.0
        procs = service.backend.ps(service._session(ids[1]).sid)
        assert not [p for p in procs if "sleep 1000.123" in p]  # the orphan died with its group
        for sid in ids:  # every sandbox still answers
            assert service.exec(sid, "cat", {"path": "a.txt"}).stdout == "apple\n"
    finally:
        for sid in ids:
            service.delete(sid)


def test_s3_out_of_range_timeouts(service, sb):
    with pytest.raises(ToolRefused, match="positive"):
        service.exec(sb, "cat", {"path": "a.txt"}, timeout_s=-1)
    r = service.exec(sb, "cat", {"path": "a.txt"}, timeout_s=1e9)  # clamped to the maximum, then runs
    assert r.status == "ok" and r.stdout == "apple\n"


def test_hung_agent_is_replaced_from_its_last_snapshot(service):
    info = service.create(files={"state.txt": b"kept"})
    try:
        sess = service._session(info.id)
        old = sess.sid
        if service.backend.name == "local":
            os.killpg(service.backend.pid(old), signal.SIGSTOP)
            resume = lambda: os.killpg(service.backend.pid(old), signal.SIGCONT)  # noqa: E731
        else:
            service.backend.container(old).pause()
            resume = lambda: service.backend.container(old).unpause()  # noqa: E731
        try:
            r = service.exec(info.id, "cat", {"path": "a.txt"}, timeout_s=0.5)
        finally:
            try:
                resume()
            except Exception:
                pass  # already destroyed by the replacement
        assert r.status == "timeout" and "replaced" in r.message
        assert sess.sid != old
        assert service.exec(info.id, "cat", {"path": "/scratch/state.txt"}).stdout == "kept"
    finally:
        service.delete(info.id)


# -- S4: output caps ---------------------------------------------------------------------------------------

def test_s4_caps(service, sb):
    exact = run(service, sb, "cat", path="exact.txt")
    assert not exact.truncated and len(exact.stdout) == CAP and MARK not in exact.stdout
    over = run(service, sb, "cat", path="over.txt")
    assert over.truncated and over.stdout.startswith("a" * CAP) and MARK in over.stdout
    assert len(over.stdout.encode()) <= CAP + 64
    r = run(service, sb, "grep", pattern="", path=".")
    assert r.truncated and len(r.stdout.encode()) <= CAP + 64


@pytest.mark.parametrize("argv", [["cat", "/dev/zero"], ["cat", "/dev/urandom"]])
def test_s4_endless_producers_are_stopped_at_the_cap(service, sb, argv):
    r = service.exec_argv(sb, argv, timeout_s=5)
    assert r.truncated and r.status == "ok" and r.duration_s < 2.0
    assert len(r.stdout.encode("utf-8")) <= CAP * 3 + 64  # U+FFFD is 3 bytes per invalid input byte
    procs = service.backend.ps(service._session(sb).sid)
    assert not [p for p in procs if p == " ".join(argv)]


def test_s4_sixteen_capped_calls_at_once(service):
    ids = [service.create().id for _ in range(4)]
    try:
        with ThreadPoolExecutor(16) as ex:
            results = list(ex.map(lambda i: service.exec(ids[i % 4], "cat", {"path": "big.txt"}), range(16)))
        assert all(r.truncated and len(r.stdout.encode()) <= CAP + 64 for r in results)
    finally:
        for sid in ids:
            service.delete(sid)


def test_s4_server_memory_grows_by_cap_times_calls_not_by_output(service):
    """16 endless producers at once: the server's Python heap peaks at a few copies of 16 x cap
    (agent frame, JSON, decoded text), never at what the tools would have printed."""
    import tracemalloc

    ids = [service.create().id for _ in range(4)]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with ThreadPoolExecutor(16) as ex:
            results = list(ex.map(lambda i: service.exec_argv(ids[i % 4], ["cat", "/dev/zero"], timeout_s=5),
                                  range(16)))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
        for sid in ids:
            service.delete(sid)
    assert all(r.truncated for r in results)
    assert peak < 16 * CAP * 12, f"peak heap growth {peak} bytes for 16 calls capped at {CAP} bytes"


# -- S5: bytes that are not UTF-8 --------------------------------------------------------------------------

def test_s5_undecodable_bytes(service, sb):
    space = TextSpace(max_length=200_000)
    r = run(service, sb, "head", path="binary.bin", bytes=64)
    assert r.stdout.startswith("\x00\x01\x02") and space.contains(r.stdout)
    json.dumps(r.model_dump())  # valid JSON
    assert run(service, sb, "cat", path="latin1.txt").stdout == "caf\ufffd\n"
    r = run(service, sb, "cat", path="split.txt")
    assert r.truncated and r.stdout.startswith("a" * (CAP - 1) + "\n[...")  # the 2-byte char is not halved
    assert "\ufffd" not in r.stdout
    assert run(service, sb, "cat", path="nulcr.bin").stdout == "a\x00b\r\nc\x00\r"
    assert all(space.contains(x.stdout) for x in [r])


# -- files, state, snapshot, clone, fork -------------------------------------------------------------------

def test_write_files_and_state(service):
    info = service.create(files={"q/question.txt": b"what?"}, cwd="/scratch", env={"LANG": "C.UTF-8"},
                          metadata={"k": 1})
    try:
        assert service.exec(info.id, "cat", {"path": "q/question.txt"}).stdout == "what?"
        assert service.exec(info.id, "ls", {"path": "/data/sub"}).stdout == "deep\n"
        with pytest.raises(ToolRefused):
            service.write_files(info.id, {"../escape": b"x"})
        with pytest.raises(ToolRefused):
            service.update_state(info.id, cwd="/etc")
        assert service.get(info.id).state.metadata == {"k": 1}
    finally:
        service.delete(info.id)


def test_clones_are_independent(service):
    origin = service.create(files={"f.txt": b"origin"}, metadata={"turn": 3})
    try:
        snap = service.snapshot(origin.id)
        assert snap.size_bytes > 0 and snap.state.metadata == {"turn": 3}
        clones = service.clone(snap.id, 3)
        assert len({c.id for c in clones} | {origin.id}) == 4
        for i, c in enumerate(clones):
            assert c.state.metadata == {"turn": 3}
            service.write_files(c.id, {"f.txt": f"clone{i}".encode(), f"only{i}.txt": b"x"})
        service.write_files(origin.id, {"f.txt": b"changed"})
        for i, c in enumerate(clones):
            assert service.exec(c.id, "cat", {"path": "/scratch/f.txt"}).stdout == f"clone{i}"
            names = service.exec(c.id, "ls", {"path": "/scratch"}).stdout.split()
            assert names == ["f.txt", f"only{i}.txt"]
        assert service.exec(origin.id, "cat", {"path": "/scratch/f.txt"}).stdout == "changed"
        kids = service.fork(clones[0].id, 2)
        assert [service.exec(k.id, "cat", {"path": "/scratch/f.txt"}).stdout for k in kids] == ["clone0"] * 2
        for c in clones + kids:
            service.delete(c.id)
        service.delete_snapshot(snap.id)
        with pytest.raises(SandboxNotFound):
            service.clone(snap.id, 1)
    finally:
        service.delete(origin.id)


def test_unknown_sandbox(service):
    with pytest.raises(SandboxNotFound):
        service.exec("sb-nope", "ls", {})
