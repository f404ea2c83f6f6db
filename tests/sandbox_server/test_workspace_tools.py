"""The ``workspace`` tool family on both backends (bubblewrap and Docker): edits of /scratch and code run there, and
hostile code (a fork bomb, a memory bomb, a disk bomb, an endless loop, a network attempt, signals to the agent and
to other sandboxes, writes outside the workspace, an output flood), each cut or refused, the sandbox still answering
with its workspace intact, and another sandbox unharmed."""

from __future__ import annotations

import pytest

from sandbox_server.agent import Agent
from sandbox_server.service import HOST_COPY_MIN_BYTES
from sandbox_server.tools import MAX_TEXT_CHARS, TOOLS, ToolRefused, tool_specs, validate_call

WORKSPACE_TOOLS = ["write_file", "replace_in_file", "make_dir", "remove", "run_python", "run_tests"]


@pytest.fixture(scope="module", params=["local", "docker"])
def box(request):
    """(service, workspace sandbox id, a plain sandbox id) per backend: the session-wide service of the backend."""
    svc = request.getfixturevalue(f"{request.param}_service")
    ws = svc.create(cwd="/scratch", families=["workspace"])
    plain = svc.create()
    yield svc, ws.id, plain.id
    svc.delete(ws.id)
    svc.delete(plain.id)


def run(box, tool, timeout_s=5.0, **args):
    svc, sid, _ = box
    return svc.exec(sid, tool, args, timeout_s=timeout_s)


def script(box, name, text, timeout_s=5.0, args=""):
    """Write ``text`` to ``name`` in the workspace and run it."""
    assert run(box, "write_file", path=name, text=text).exit_code == 0
    res = run(box, "run_python", path=name, args=args, timeout_s=timeout_s)
    run(box, "remove", path=name)
    return res


def unharmed(box) -> None:
    """The sandbox still answers with its workspace files, and the other sandbox too."""
    svc, sid, plain = box
    res = run(box, "cat", path="pkg/calc.py")
    assert res.status == "ok" and "def add" in res.stdout and not res.sandbox_replaced
    assert svc.exec(plain, "ls", {"path": "/data"}).stdout.strip()


def test_the_family_is_listed_and_opt_in():
    specs = {s.name: s for s in tool_specs()}
    assert all(specs[t].family == "workspace" for t in WORKSPACE_TOOLS)
    assert specs["write_file"].schema_["properties"]["text"]["maxLength"] == MAX_TEXT_CHARS
    assert [t for t in WORKSPACE_TOOLS if TOOLS[t].runs_code] == ["run_python", "run_tests"]
    with pytest.raises(ToolRefused, match="created without the workspace family"):
        validate_call("write_file", {"path": "/scratch/a", "text": "x"})
    call = validate_call("run_python", {"path": "/scratch/a.py", "args": "1 'two words'"}, families=["workspace"])
    assert call.argv[-3:] == ["/scratch/a.py", "1", "two words"] and call.runs_code
    for bad in ("/data/x", "/tmp/x", "../x", "/scratch", "/scratch/../data/x"):
        with pytest.raises(ToolRefused):
            validate_call("write_file", {"path": bad, "text": "x"}, cwd="/scratch", families=["workspace"])
    for text, words in (("\U0001f600" * 40_000, "bytes in UTF-8"), ("a\ud800b", "lone surrogate")):
        with pytest.raises(ToolRefused, match=words):  # refused before it runs, never an error of the sandbox
            validate_call("write_file", {"path": "a", "text": text}, cwd="/scratch", families=["workspace"])


def test_an_agent_without_a_process_bound_refuses_code_and_runs_the_rest(tmp_path):
    roots = {r: str(tmp_path / r.strip("/")) for r in ("/data", "/scratch", "/tmp")}
    for h in roots.values():
        (tmp_path / h).mkdir(exist_ok=True)
    agent = Agent(roots, ["/data", "/scratch"], ["/scratch", "/tmp"])
    call = validate_call("run_python", {"path": "/scratch/a.py"}, families=["workspace"])
    ans = agent.handle({"op": "exec", "argv": call.argv, "cwd": "/scratch", "path_args": call.path_args,
                        "bounded_only": True})
    assert ans["status"] == "refused" and "does not bound its process count" in ans["message"]
    ls = agent.handle({"op": "exec", "argv": ["ls", "/scratch"], "cwd": "/scratch", "path_args": [1]})
    assert ls["status"] == "ok" and ls["exit_code"] == 0
    assert agent.handle({"op": "ping"})["limits"]["bounded"] is False


def test_the_unisolated_local_mode_edits_but_never_runs_code(fixture_data):
    """Without bubblewrap (the explicit unsafe mode) a call's code would be a host process: the run tools are
    refused there, whatever the control groups, while the editor works."""
    from tests.docker_support import shared_service

    svc = shared_service("local-nobwrap", fixture_data)
    sid = svc.create(cwd="/scratch", families=["workspace"]).id
    try:
        assert svc.exec(sid, "write_file", {"path": "a.py", "text": "print(1)\n"}).exit_code == 0
        with pytest.raises(ToolRefused, match="does not bound its process count"):
            svc.exec(sid, "run_python", {"path": "a.py"})
    finally:
        svc.delete(sid)


def test_a_plain_sandbox_refuses_the_family(box):
    svc, _, plain = box
    with pytest.raises(ToolRefused, match="workspace family"):
        svc.exec(plain, "write_file", {"path": "/scratch/a.py", "text": "1"})
    assert svc.get(plain).state.families == []


def make_package(box) -> None:
    """A package with a bug (``add`` subtracts) and its unit test, written into the workspace."""
    assert run(box, "make_dir", path="pkg").exit_code == 0
    for path, text in (("pkg/__init__.py", ""), ("tests/__init__.py", ""),
                       ("pkg/calc.py", "def add(a, b):\n    return a - b\n"),
                       ("tests/test_calc.py", "import unittest\nfrom pkg.calc import add\n\n\nclass T(unittest."
                        "TestCase):\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n")):
        assert run(box, "write_file", path=path, text=text).exit_code == 0


@pytest.fixture
def package(box):
    make_package(box)
    yield box


def test_edit_and_test_a_package(box):
    svc, sid, _ = box
    assert svc.get(sid).state.families == ["workspace"]
    make_package(box)
    failing = run(box, "run_tests", path="tests")
    assert failing.exit_code == 1 and "FAILED (failures=1)" in failing.stderr and "-1 != 5" in failing.stderr
    twice = run(box, "replace_in_file", path="pkg/calc.py", old="a", new="x")
    assert twice.exit_code == 1 and "occurs 3 times" in twice.stderr
    assert run(box, "cat", path="pkg/calc.py").stdout == "def add(a, b):\n    return a - b\n"  # nothing changed
    fixed = run(box, "replace_in_file", path="pkg/calc.py", old="a - b", new="a + b")
    assert fixed.exit_code == 0 and "2\t    return a + b" in fixed.stdout
    passing = run(box, "run_tests", path="tests")
    assert passing.exit_code == 0 and "Ran 1 test" in passing.stderr and "OK" in passing.stderr
    out = script(box, "show.py", "import sys\nfrom pkg.calc import add\nprint(add(*map(int, sys.argv[1:])))\n",
                 args="40 2")
    assert (out.status, out.exit_code, out.stdout) == ("ok", 0, "42\n")
    missing = run(box, "replace_in_file", path="pkg/none.py", old="a", new="b")
    assert missing.exit_code == 1 and "cannot read" in missing.stderr


@pytest.mark.parametrize("name", ["-c", "--help", "!", "-", "(x"])
def test_operator_like_names_are_files_to_every_workspace_tool(box, name):
    """Field case S45's kind for the workspace family: a name that looks like an option is a file to the editor, the
    interpreter and the test runner alike."""
    assert run(box, "write_file", path=name, text="print('ran', __file__)\n").exit_code == 0
    assert run(box, "cat", path=name).stdout == "print('ran', __file__)\n"
    out = run(box, "run_python", path=name)
    assert (out.exit_code, out.stdout) == (0, f"ran /scratch/./{name}\n")
    assert run(box, "replace_in_file", path=name, old="ran", new="done").exit_code == 0
    assert run(box, "run_python", path=name).stdout == f"done /scratch/./{name}\n"
    assert run(box, "remove", path=name).exit_code == 0
    assert run(box, "make_dir", path=name).exit_code == 0 and run(box, "ls", path=name).exit_code == 0
    none = run(box, "run_tests", path=name)  # a start directory (not importable), never an option of unittest
    assert none.exit_code == 1 and f"/scratch/{name}'" in none.stderr and "usage" not in none.stderr.lower()
    assert run(box, "remove", path=name).exit_code == 0


HOSTILE = {
    "fork bomb": ("import os\nwhile True:\n    os.fork()\n", "Resource temporarily unavailable"),
    "memory bomb": ("x = bytearray(2 << 30)\n", "MemoryError"),
    "memory bomb under the address-space limit": ("x = bytearray(400 << 20)\nx[::4096] = b'1' * len(x[::4096])\n",
                                                  None),
    "disk bomb": ("f = open('/scratch/big', 'wb')\nwhile True:\n    f.write(b'x' * 65536)\n", "Errno"),
    "network": ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)\n", "Error"),
    "signal the agent": ("import os\nos.kill(os.getppid(), 9)\n", "Operation not permitted"),
    "signal pid 1": ("import os\nos.kill(1, 9)\n", "Operation not permitted"),
    "signal every process": ("import os\nos.kill(-1, 9)\nprint('alive')\n", "alive"),
    "write the corpus": ("open('/data/x', 'w')\n", "Read-only file system"),
    "change a kernel setting": ("p = '/proc/sys/vm/swappiness'\nopen(p, 'w').write(open(p).read())\n", "Error"),
    "plant a preload library": ("import os\nos.makedirs('/etc', exist_ok=True)\nopen('/etc/ld.so.preload', 'w')\n",
                                "Error"),
    "write the root": ("open('/opt/x', 'w')\n", "Error"),
    "write the system": ("open('/usr/x', 'w')\n", "Error"),
    "execute from the workspace": ("import os, shutil\nshutil.copy('/usr/bin/true', '/scratch/t')\n"
                                   "os.chmod('/scratch/t', 0o755)\nos.execv('/scratch/t', ['t'])\n", "Error"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_code_is_cut_or_refused_and_harms_nothing(package, name):
    box = package
    text, expect = HOSTILE[name]
    res = script(box, "hostile.py", text)
    assert res.status == "ok" and not res.sandbox_replaced, res
    assert res.exit_code != 0 if name != "signal every process" else res.exit_code in (0, -9)
    if expect is not None and name != "signal every process":
        assert expect in res.stderr, res.stderr[-500:]
    if name == "disk bomb":
        assert run(box, "remove", path="big").exit_code == 0
    unharmed(box)


def test_past_the_memory_bound_the_calls_processes_die_before_the_agent(package):
    """60 processes of 6 MiB each pass the sandbox's 256 MiB bound: the OOM killer takes some of them (each smaller
    than the agent) and never the agent, so the sandbox keeps its workspace (before, the agent died and the sandbox
    was replaced from its last snapshot, the episode's edits lost)."""
    box = package
    seen = script(box, "adj.py", "import os\nprint(open('/proc/self/oom_score_adj').read().strip(),"
                  " open(f'/proc/{os.getppid()}/oom_score_adj').read().strip())\n")
    assert seen.stdout.split() == ["1000", "0"], seen  # the call first, the agent last
    res = script(box, "hog.py", "import os, time\nkids = []\nfor i in range(60):\n    pid = os.fork()\n"
                 "    if pid == 0:\n        b = bytearray(6 << 20)\n        b[::4096] = b'1' * len(b[::4096])\n"
                 "        time.sleep(2)\n        os._exit(0)\n    kids.append(pid)\n"
                 "print(sum(os.waitpid(k, 0)[1] == 9 for k in kids), 'killed')\n", timeout_s=8.0)
    assert res.status == "ok" and not res.sandbox_replaced and res.exit_code == 0, res
    assert int(res.stdout.split()[0]) >= 1, res.stdout  # the bound was reached and the children paid for it
    unharmed(box)


def test_remove_takes_folders_the_episode_locked(box):
    locked = script(box, "lock.py", "import os\nos.makedirs('/scratch/locked/a/b')\nopen('/scratch/locked/a/b/f', 'w')"
                    ".write('x')\nos.chmod('/scratch/locked/a/b', 0)\nos.chmod('/scratch/locked/a', 0o500)\n")
    assert locked.exit_code == 0, locked
    gone = run(box, "remove", path="locked")
    assert (gone.exit_code, gone.stderr) == (0, "") and run(box, "ls", path="locked").exit_code != 0


def test_an_endless_loop_and_an_output_flood_are_cut(package):
    box = package
    loop = script(box, "loop.py", "while True:\n    pass\n", timeout_s=2.0)
    assert loop.status == "timeout" and 1.5 < loop.duration_s < 4.0 and not loop.sandbox_replaced
    flood = script(box, "flood.py", "import sys\nwhile True:\n    sys.stdout.write('y' * 65536)\n")
    assert flood.truncated and flood.status == "ok" and flood.stdout.startswith("yyyy")
    orphan = script(box, "orphan.py", "import os, time\nif os.fork() == 0:\n    os.setsid()\n    os.close(1)\n"
                    "    os.close(2)\n    time.sleep(60)\n")
    assert orphan.exit_code == 0
    procs = script(box, "procs.py", "import os\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n"
                   "        try:\n            print(open(f'/proc/{p}/cmdline', 'rb').read())\n"
                   "        except OSError:\n            pass\n")
    assert "orphan.py" not in procs.stdout and "procs.py" in procs.stdout  # nothing a call started outlives it
    unharmed(box)


def _members(svc, sid) -> list[tuple]:
    """(name, type, mode, mtime, size, link target, bytes) of every member of a sandbox's export."""
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(svc.export(sid))) as tar:
        return sorted((m.name, m.type, m.mode, m.mtime, m.size, m.linkname,
                       tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers())  # type: ignore


def test_a_fork_copies_the_changed_workspace_exactly_and_the_copies_stay_apart(box):
    """What the episode wrote (a file, a hard link, a symbolic link, an empty folder, modes, times, a file in /tmp)
    is in every copy as in the original, whichever way the backend copies (a root server: copy-on-write layers,
    tests/sandbox_server/test_cow_layers.py; else the local backend's ``cp -a`` on the host or the agents' tar); a write
    in one copy reaches no other."""
    svc, sid, _ = box
    out = script(box, "shape.py", "import os\nos.makedirs('/scratch/w/empty', exist_ok=True)\n"
                 "open('/scratch/w/a.txt', 'w').write('alpha')\nos.link('/scratch/w/a.txt', '/scratch/w/hard')\n"
                 "os.symlink('a.txt', '/scratch/w/soft')\nos.chmod('/scratch/w/a.txt', 0o640)\n"
                 "os.utime('/scratch/w/a.txt', (1e9, 1e9))\nos.utime('/scratch/w/empty', (2e9, 2e9))\n"
                 "open('/tmp/t.txt', 'w').write('tmp')\nopen('/scratch/w/big.bin', 'wb').write(os.urandom(300_000))\n")
    assert out.exit_code == 0, out
    assert len(svc.export(sid)) >= HOST_COPY_MIN_BYTES  # large enough for layers (or the local backend's host copy)
    before = _members(svc, sid)
    assert any(m[0].endswith("w/hard") and m[1] == b"1" for m in before)  # a hard link in the tar
    assert any(m[0].endswith("t.txt") and m[6] == b"tmp" for m in before)  # /tmp is carried too
    kids = [k.id for k in svc.fork(sid, 3)]
    try:
        for k in kids:
            assert _members(svc, k) == before
        assert svc.exec(kids[0], "write_file", {"path": "/scratch/w/a.txt", "text": "changed"}).exit_code == 0
        assert svc.exec(kids[1], "cat", {"path": "/scratch/w/hard"}).stdout == "alpha"
        assert svc.exec(sid, "cat", {"path": "/scratch/w/a.txt"}).stdout == "alpha"
        assert svc.get(kids[2]).state.families == ["workspace"]
    finally:
        for k in kids:
            svc.delete(k)
        run(box, "remove", path="w")


def test_a_rollback_puts_the_workspace_and_the_state_back_in_place(box):
    svc, sid, _ = box
    assert run(box, "write_file", path="r/keep.txt", text="kept").exit_code == 0
    snap = svc.snapshot(sid)
    assert run(box, "write_file", path="r/keep.txt", text="changed").exit_code == 0
    assert run(box, "write_file", path="r/later.txt", text="later").exit_code == 0
    info = svc.rollback(sid, snap.id)
    assert info.id == sid and info.state.families == ["workspace"] and info.state.cwd == "/scratch"
    assert run(box, "cat", path="r/keep.txt").stdout == "kept"
    assert run(box, "ls", path="r").stdout == "keep.txt\n"
    with pytest.raises(Exception, match="snapshot"):
        svc.rollback(sid, "no-such-snapshot")
    svc.delete_snapshot(snap.id)
    run(box, "remove", path="r")
