"""Recycling released sandboxes: a released sandbox is reset, verified and handed out again.

On every backend (docker, local under bubblewrap, and the unisolated local opt-in where it makes sense):

1. a recycled sandbox is indistinguishable from the fresh one it was: the same listings of /scratch and
   /tmp (modes and modification times included), the same process table, the same environment and cwd
   for tools, the same default session state;
2. nothing of one episode is visible in the next on the same sandbox: files, an odd mode, a link, a
   FIFO, a subdirectory the agent may not enter, a detached process, session cwd / env / metadata;
3. a sandbox that served ``max_sandbox_uses`` sessions is destroyed and replaced;
4. a sandbox whose reset cannot be verified (a process or a file of another user, which the sandbox's
   own user cannot remove) is destroyed, never handed out again; so is one whose agent died or hung;
5. ``recycle=False`` keeps destroy-and-replace.

Each test builds its own small service (``max_total=1`` where the same sandbox must come back) and
checks by backend id that the sandbox it looks at is the one it used before.
"""

from __future__ import annotations

import io
import os
import signal
import tarfile
import time

import pytest

from sandbox_server.service import SandboxService, ServiceConfig
from tests.docker_support import SERVER_NAME, backend_for, host_sh, require_bwrap, unisolated

MARK = "RECYCLEMARK7f3a"

#: Tries to leave a process that outlives its tool call (own session, standard streams closed) carrying ``argv[1]``.
DETACH = ("import os, sys, time\n"
          "if os.fork():\n    sys.exit(0)\n"
          "os.setsid()\n"
          "for fd in (0, 1, 2):\n    os.close(fd)\n"
          "time.sleep(300)\n")


@pytest.fixture
def make(fixture_data):
    """Builds started services over the fixture data (``make(kind, **ServiceConfig fields)``; by default
    ``min_idle=0, max_total=1``: one sandbox, so a recycled one is the one the next session gets) and closes
    them after the test."""
    made: list[SandboxService] = []

    def build(kind: str, **cfg) -> SandboxService:
        if kind == "local":
            require_bwrap()
        base = dict(min_idle=0, max_total=1, acquire_timeout_s=20.0, default_timeout_s=5.0, max_timeout_s=10.0)
        backend = backend_for(kind, f"{SERVER_NAME}-recycle-{kind}", fixture_data)
        svc = SandboxService(backend, ServiceConfig(**{**base, **cfg})).start()
        made.append(svc)
        return svc

    yield build
    for svc in made:
        svc.close()


def _metric(svc: SandboxService, name: str) -> float:
    return svc.metrics.registry.get_sample_value(name) or 0.0


def _sid(svc: SandboxService, session_id: str) -> str:
    return svc._session(session_id).sid


def _settled(svc: SandboxService, idle: int, limit_s: float = 20.0) -> None:
    """Wait until no release is being recycled and ``idle`` sandboxes are idle."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        st = svc.pool.status()
        if st["recycling"] == 0 and st["starting"] == 0 and st["idle"] == idle:
            return
        time.sleep(0.02)
    raise AssertionError(svc.pool.status())


def _gone(svc: SandboxService, *sids: str, limit_s: float = 20.0) -> None:
    """Wait until the backend no longer runs any of ``sids``."""
    deadline = time.monotonic() + limit_s
    while set(sids) & set(svc.backend.ids()):
        assert time.monotonic() < deadline, f"still running: {set(sids) & set(svc.backend.ids())}"
        time.sleep(0.02)


def _leave_process(svc: SandboxService, session_id: str, tag: str) -> None:
    """Try to leave a detached process tagged ``tag``: the agent kills it as the call ends (it kills every one of
    its descendants, and it is the child subreaper every orphan re-parents to), so none is there even before the
    sandbox is recycled."""
    r = svc.exec_argv(session_id, ["python3", "-c", DETACH, tag], timeout_s=5)
    assert r.status == "ok", r
    assert not _procs_with(svc, session_id, tag), "a process outlived the call that started it"


def _procs_with(svc: SandboxService, session_id: str, tag: str) -> list[str]:
    return [p for p in svc.backend.ps(_sid(svc, session_id)) if tag in p]


def _observe(svc: SandboxService, session_id: str) -> dict:
    """Everything a session can see of its sandbox's writable state, processes, and its own state."""
    out = {
        "ls": host_sh(svc, session_id, "ls -la --time-style=full-iso /scratch /tmp").stdout,
        "find": host_sh(svc, session_id, "find /scratch /tmp -printf '%p %M %U %T@\\n' | sort").stdout,
        "tool_ls": svc.exec(session_id, "ls", {"path": "/scratch", "all": True, "long": True}).stdout,
        "tool_stat": svc.exec(session_id, "stat", {"path": "/scratch"}).stdout,
        "tool_find": svc.exec(session_id, "find", {"path": "/scratch"}).stdout,
        "env_cwd": svc.exec_argv(session_id, ["sh", "-c", "env | sort; pwd"]).stdout,
        "state": svc.get(session_id).state.model_dump(),
    }
    if not unisolated(svc):  # unisolated, the agent sees the host's processes: compared by tag instead
        out["ps"] = svc.backend.ps(_sid(svc, session_id))
    return out


# -- 1: a recycled sandbox is indistinguishable from a fresh one -------------------------------------------


@pytest.mark.parametrize("kind", ["docker", "local", "local-nobwrap"])
def test_a_recycled_sandbox_looks_exactly_like_it_did_fresh(make, kind):
    svc = make(kind)
    a = svc.create()
    sid = _sid(svc, a.id)
    fresh = _observe(svc, a.id)
    assert fresh["state"] == {"cwd": "/data", "env": {}, "metadata": {}, "families": []}
    # an episode: files, state, a detached process, a changed mode on the area itself
    svc.write_files(a.id, {"q.txt": b"question", "d/e/f.txt": b"deep"})
    svc.update_state(a.id, cwd="/scratch", env={"LANG": "C.UTF-8", "TZ": "UTC0"}, metadata={"episode": 1})
    assert host_sh(svc, a.id, "echo t > /tmp/t; chmod 0700 /scratch; chmod 0000 /scratch/d").status == "ok"
    _leave_process(svc, a.id, MARK)
    assert _observe(svc, a.id) != fresh
    svc.delete(a.id)
    _settled(svc, idle=1)
    b = svc.create()
    assert _sid(svc, b.id) == sid  # the same sandbox, recycled
    recycled = _observe(svc, b.id)
    assert recycled == fresh
    assert not _procs_with(svc, b.id, MARK)
    assert _metric(svc, "forkyard_sandboxes_recycled_total") == 1
    # and a brand-new sandbox of the same backend answers the same, times and process ids aside
    other = make(kind)
    c = other.create()
    new = _observe(other, c.id)
    for key in ("tool_find", "env_cwd", "state") + (("ps",) if "ps" in new else ()):
        assert new[key] == recycled[key], key


# -- 2: nothing of an episode is visible in the next ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["docker", "local", "local-nobwrap"])
def test_nothing_of_an_episode_reaches_the_next_one_on_the_same_sandbox(make, kind):
    svc = make(kind)
    a = svc.create(cwd="/scratch", env={"LANG": "C.UTF-8", "TZ": MARK}, metadata={"marker": MARK},
                   files={"marker.txt": MARK.encode(), f"sub/{MARK}.txt": b"x", f".{MARK}": MARK.encode()})
    sid = _sid(svc, a.id)
    script = (f"echo {MARK} > /tmp/{MARK}; mkdir -p /tmp/d/e; echo {MARK} > /tmp/d/e/f; chmod 0500 /tmp/d; "
              f"echo {MARK} > /scratch/odd; chmod 4751 /scratch/odd 2>/dev/null || chmod 0751 /scratch/odd; "
              f"ln -s /scratch/marker.txt /scratch/link-{MARK}; ln /scratch/marker.txt /scratch/hard; "
              f"mkfifo /scratch/fifo-{MARK}; chmod 0000 /scratch/sub")
    r = host_sh(svc, a.id, script)
    assert r.status == "ok" and r.exit_code == 0, r
    if not unisolated(svc):  # other writable places of the sandbox (never host folders)
        extra = host_sh(svc, a.id, f"echo {MARK} > /dev/shm/{MARK} && echo ok")
        assert extra.stdout.strip() == "ok", extra
    _leave_process(svc, a.id, MARK)
    before = host_sh(svc, a.id, f"grep -rl {MARK} /scratch /tmp 2>/dev/null | wc -l").stdout
    assert int(before) >= 4  # the markers are there to be found
    svc.delete(a.id)

    b = svc.create()
    assert _sid(svc, b.id) == sid
    info = svc.get(b.id)
    assert info.state.model_dump() == {"cwd": "/data", "env": {}, "metadata": {}, "families": []}
    assert MARK not in svc.exec_argv(b.id, ["env"]).stdout
    # every way a tool reaches the writable areas
    g = svc.exec(b.id, "grep", {"pattern": MARK, "path": "/scratch"})
    assert g.stdout == "" and g.exit_code != 0
    assert svc.exec(b.id, "find", {"path": "/scratch"}).stdout.split() == ["/scratch"]
    assert svc.exec(b.id, "ls", {"path": "/scratch", "all": True}).stdout.split() == [".", ".."]
    assert "No such file" in svc.exec(b.id, "cat", {"path": "/scratch/marker.txt"}).stderr
    # and every way a shell in the sandbox does
    look = host_sh(svc, b.id, f"grep -r {MARK} /scratch /tmp; ls -la /scratch /tmp")
    assert MARK not in look.stdout and MARK not in look.stderr
    assert len(host_sh(svc, b.id, "find /scratch /tmp").stdout.split()) == 2  # the two areas, empty
    if not unisolated(svc):
        assert MARK not in host_sh(svc, b.id, "ls -la /dev/shm; grep -r . /dev/shm 2>&1").stdout
    assert not _procs_with(svc, b.id, MARK)
    # a snapshot of the new session carries nothing but the two empty areas
    with tarfile.open(fileobj=io.BytesIO(svc.export(b.id))) as tar:
        assert sorted(m.name for m in tar.getmembers()) == ["scratch", "tmp"]


def test_forks_take_recycled_sandboxes_and_see_only_the_parent(make):
    svc = make("local", max_total=3)
    old = [svc.create(files={"old.txt": MARK.encode()}) for _ in range(3)]
    sids = {_sid(svc, s.id) for s in old}
    for s in old:
        svc.delete(s.id)
    _settled(svc, idle=3)
    parent = svc.create(files={"q.txt": b"parent"})
    kids = svc.fork(parent.id, 2)
    assert {_sid(svc, k.id) for k in [parent, *kids]} == sids  # all three recycled
    for k in kids:
        assert svc.exec(k.id, "find", {"path": "/scratch"}).stdout.split() == ["/scratch", "/scratch/q.txt"]
        assert svc.exec(k.id, "cat", {"path": "/scratch/q.txt"}).stdout == "parent"


# -- 3: worn-out sandboxes are replaced -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["docker", "local"])
def test_a_sandbox_past_max_uses_is_destroyed_and_replaced(make, kind):
    svc = make(kind, max_sandbox_uses=2)
    seen = []
    for _ in range(5):
        s = svc.create()
        seen.append(_sid(svc, s.id))
        svc.delete(s.id)
    assert seen[0] == seen[1] != seen[2] == seen[3] != seen[4]
    _settled(svc, idle=1)
    _gone(svc, seen[0], seen[2])
    assert _metric(svc, "forkyard_sandboxes_retired_total") == 2
    assert _metric(svc, "forkyard_sandboxes_recycled_total") == 3


# -- 4: a reset that cannot be verified destroys the sandbox ------------------------------------------------


def _agent_host_pid(backend, sid: str) -> int:
    """Host pid of a bubblewrap sandbox's agent (bubblewrap, its init, then the agent)."""
    stack = [backend.pid(sid)]
    while stack:
        pid = stack.pop()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\x00")
        if b"bwrap" not in cmd[0] and any(b"agent.pyz" in c for c in cmd):
            return pid
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                stack += [int(c) for c in f.read().split()]
    raise AssertionError("no agent under the bubblewrap process")


def _root_leftover(svc: SandboxService, session_id: str, what: str) -> str:
    """Leave something in the sandbox that its own user cannot remove: a process (``process``) or a
    directory with a file (``file``) of another user. Returns the text the reset's refusal must name."""
    sid = _sid(svc, session_id)
    if svc.backend.name == "docker":
        c = svc.backend.container(sid)
        if what == "process":
            c.exec_run(["sleep", "301"], user="0", detach=True)
            deadline = time.monotonic() + 10
            while not _procs_with(svc, session_id, "sleep 301"):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            return "sleep 301"
        # /tmp is 1777 in a container: root (without capabilities) may write there, and the sandbox user
        # may not remove root's directory (sticky bit) nor the file in it
        code, out = c.exec_run(["sh", "-c", "mkdir /tmp/keep && echo x > /tmp/keep/f"], user="0")
        assert code == 0, out
        return "/tmp/keep"
    # bubblewrap: the host's root writes into the sandbox's /scratch as another user
    if os.geteuid() != 0:
        pytest.skip("making a file the local sandbox's user cannot remove needs root on the host")
    scratch = f"/proc/{_agent_host_pid(svc.backend, sid)}/root/scratch"
    os.mkdir(f"{scratch}/keep")
    with open(f"{scratch}/keep/f", "w") as f:
        f.write("x")
    os.chown(f"{scratch}/keep/f", 65534, 65534)
    os.chown(f"{scratch}/keep", 65534, 65534)
    os.chmod(f"{scratch}/keep", 0o755)
    return "/scratch/keep"


@pytest.mark.parametrize("kind,what", [("docker", "process"), ("docker", "file"), ("local", "file")])
def test_a_sandbox_whose_reset_fails_verification_is_destroyed(make, kind, what):
    svc = make(kind)
    a = svc.create(files={"q.txt": b"x"})
    sid = _sid(svc, a.id)
    named = _root_leftover(svc, a.id, what)
    assert not svc.backend.reset(sid)["clean"]  # the agent's own check finds it ...
    svc.delete(a.id)
    b = svc.create()
    assert _sid(svc, b.id) != sid  # ... so the pool never hands that sandbox out again
    assert sid not in svc.backend.ids()
    assert named in (svc.backend.last_recycle_problem or "")
    assert _metric(svc, "forkyard_recycle_failures_total") == 1
    assert _metric(svc, "forkyard_sandboxes_recycled_total") == 0
    if kind == "docker":
        import docker.errors

        with pytest.raises(docker.errors.NotFound):
            svc.backend.client.containers.get(sid[2:])


@pytest.mark.parametrize("kind", ["docker", "local"])
def test_a_released_sandbox_whose_agent_died_is_destroyed(make, kind):
    svc = make(kind)
    a = svc.create()
    sid = _sid(svc, a.id)
    if kind == "docker":  # the agent (not its container), as test_reliability kills it
        pid = svc.backend._call(sid, {"op": "ping"})["pid"]
        svc.backend.container(sid).exec_run(["python3", "-c", f"import os; os.kill({pid}, 9)"], user="1000:1000")
    else:
        os.killpg(svc.backend.pid(sid), 9)
    svc.delete(a.id)  # its release tries a reset, which fails
    b = svc.create()
    assert _sid(svc, b.id) != sid and sid not in svc.backend.ids()
    assert _metric(svc, "forkyard_recycle_failures_total") == 1


@pytest.mark.parametrize("kind", ["docker", "local"])
def test_a_sandbox_whose_agent_hung_is_replaced_and_never_recycled(make, kind):
    svc = make(kind, max_total=2)
    a = svc.create(files={"q.txt": b"kept"})
    old = _sid(svc, a.id)
    if kind == "local":
        os.killpg(svc.backend.pid(old), signal.SIGSTOP)
    else:
        svc.backend.container(old).pause()
    r = svc.exec(a.id, "cat", {"path": "a.txt"}, timeout_s=0.5)
    assert r.status == "timeout" and r.sandbox_replaced
    _gone(svc, old)
    assert svc.exec(a.id, "cat", {"path": "/scratch/q.txt"}).stdout == "kept"
    assert _metric(svc, "forkyard_sandboxes_recycled_total") == 0
    assert _metric(svc, "forkyard_recycle_failures_total") == 0  # not even tried


# -- 5: recycling off ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["docker", "local"])
def test_recycling_off_destroys_every_released_sandbox(make, kind):
    svc = make(kind, recycle=False)
    seen = []
    for _ in range(3):
        s = svc.create()
        seen.append(_sid(svc, s.id))
        svc.delete(s.id)
    assert len(set(seen)) == 3
    _gone(svc, *seen)
    assert _metric(svc, "forkyard_sandboxes_recycled_total") == 0


# -- the pool's size after a burst ---------------------------------------------------------------------------


def test_a_burst_gives_back_its_sandboxes_for_a_while_then_the_pool_shrinks_to_min_idle(make):
    svc = make("local", min_idle=1, max_total=4, surplus_idle_ttl_s=1.0)
    _settled(svc, idle=1)
    burst = [svc.create() for _ in range(4)]
    sids = {_sid(svc, s.id) for s in burst}
    for s in burst:
        svc.delete(s.id)
    _settled(svc, idle=4)  # all four back, ready for the next burst
    again = [svc.create() for _ in range(4)]
    assert {_sid(svc, s.id) for s in again} == sids  # no start
    for s in again:
        svc.delete(s.id)
    _settled(svc, idle=1, limit_s=10)  # the surplus went after surplus_idle_ttl_s
    _gone(svc, *(sids - set(svc.pool._idle)))
    assert len(svc.backend.ids()) == 1


@pytest.mark.parametrize("kind", ["local", "local-nobwrap"])
def test_a_local_sandbox_outlives_the_thread_that_started_it(make, kind):
    """bubblewrap's --die-with-parent follows the starting *thread*: a sandbox started by a request or worker
    thread that has since exited must still serve (recycled sandboxes serve many sessions)."""
    import threading

    svc = make(kind, max_total=2)
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("id", svc.create().id))
    t.start()
    t.join()
    time.sleep(0.3)
    sid = _sid(svc, got["id"])
    assert svc.backend.alive(sid)
    svc.delete(got["id"])
    _settled(svc, idle=1)
    assert _metric(svc, "forkyard_sandboxes_recycled_total") == 1 and sid in svc.backend.ids()


@pytest.mark.parametrize("kind", ["docker", "local"])
def test_a_sandbox_deleted_under_a_running_call_is_not_recycled(make, kind):
    """A call still running when its session is deleted could otherwise act after the reset, in the next
    session's sandbox: such a sandbox is destroyed, and the late call never reaches another session."""
    from concurrent.futures import ThreadPoolExecutor

    from sandbox_server.errors import SandboxNotFound

    svc = make(kind)
    a = svc.create(files={"q.txt": b"a"})
    sid = _sid(svc, a.id)
    with ThreadPoolExecutor(1) as ex:
        call = ex.submit(svc.exec, a.id, "cat", {"path": "fifo"}, 2.0)  # blocks until its timeout
        time.sleep(0.5)
        svc.delete(a.id)
        b = svc.create()
        assert _sid(svc, b.id) != sid
        assert call.result().status in ("timeout", "error")
    with pytest.raises(SandboxNotFound):
        svc.exec(a.id, "cat", {"path": "/scratch/q.txt"})
    _gone(svc, sid)
    assert _metric(svc, "forkyard_sandboxes_recycled_total") == 0
