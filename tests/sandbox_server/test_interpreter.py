"""The ``interpreter`` family: a live Python session per sandbox (``run_cell``), on both backends.

Variables persist from cell to cell; a last expression's value is printed; exceptions and ``exit()`` keep the
session; a cell past its deadline is interrupted (session kept) or, when it will not stop, its session ended; what
a cell starts dies with the cell; hostile cells (fork bomb, memory bomb, killing the agent, output flood) are cut
and the sandbox stays usable. Snapshots keep a stopped ``os.fork`` copy of the session: a rollback of the sandbox
to its own snapshot resumes it (the variables as they were), as often as asked; forks, clones and rollbacks to other
snapshots start a new session that first takes the snapshot's variables by value (``test_a_fork_carries_the_variables``
says which and how).
"""

from __future__ import annotations

import io
import tarfile
import time

import pytest

from sandbox_server.agent import SESSION_MEMBER
from sandbox_server.snapshots import without_interpreter_state
from sandbox_server.tools import TOOLS, ToolRefused, validate_call


@pytest.fixture(params=["local", "docker"])
def cellbox(request):
    """(service, sandbox id with the interpreter and workspace families) per backend."""
    svc = request.getfixturevalue(f"{request.param}_service")
    sb = svc.create(cwd="/scratch", families=["interpreter", "workspace"])
    yield svc, sb.id
    svc.delete(sb.id)


def cell(box, code, timeout_s=5.0):
    svc, sid = box
    return svc.exec(sid, "run_cell", {"code": code}, timeout_s=timeout_s)


def test_the_family_is_opt_in():
    assert TOOLS["run_cell"].family == "interpreter" and TOOLS["run_cell"].runs_code
    with pytest.raises(ToolRefused, match="interpreter family"):
        validate_call("run_cell", {"code": "1"}, families=["workspace"])
    call = validate_call("run_cell", {"code": "x = 1"}, families=["interpreter"])
    assert call.code == "x = 1" and call.argv[:3] == ["python3", "-s", "-B"]


def test_variables_persist_and_values_print(cellbox):
    r = cell(cellbox, "x = 40\nimport os\nos.getcwd()")
    assert r.status == "ok" and r.exit_code == 0 and r.stdout == "'/scratch'\n", r
    r = cell(cellbox, "x + 2")
    assert r.stdout == "42\n" and r.exit_code == 0
    r = cell(cellbox, "print('a'); import sys; print('b', file=sys.stderr); None")
    assert (r.stdout, r.stderr) == ("a\n", "b\n")
    r = cell(cellbox, "open('/proc/self/oom_score_adj').read().split()")  # past the memory bound, the session dies
    assert r.stdout == "['900']\n", r  # before the agent (0), after an export child (1000)


def test_errors_and_exit_keep_the_session(cellbox):
    cell(cellbox, "y = 7")
    r = cell(cellbox, "1 / 0")
    assert r.exit_code == 1 and "ZeroDivisionError" in r.stderr and "interpreter_runner" not in r.stderr
    r = cell(cellbox, "def f(:")
    assert r.exit_code == 1 and "SyntaxError" in r.stderr
    r = cell(cellbox, "exit(3)")
    assert r.exit_code == 1 and "SystemExit" in r.stderr
    assert cell(cellbox, "y").stdout == "7\n"


def test_a_cell_sees_the_workspace_and_its_edits(cellbox):
    svc, sid = cellbox
    svc.exec(sid, "write_file", {"path": "mod.py", "text": "def double(v):\n    return 2 * v\n"})
    r = cell(cellbox, "import mod\nmod.double(21)")
    assert r.stdout == "42\n", r
    r = cell(cellbox, "open('out.txt', 'w').write('from a cell')")
    assert svc.exec(sid, "cat", {"path": "out.txt"}).stdout == "from a cell"


def test_a_slow_cell_is_interrupted_and_the_session_kept(cellbox):
    cell(cellbox, "z = 5")
    r = cell(cellbox, "import time\nwhile True: time.sleep(0.01)", timeout_s=1.0)
    assert r.status == "timeout" and "KeyboardInterrupt" in r.stderr and "interrupted" in r.message
    assert cell(cellbox, "z").stdout == "5\n"


def test_an_interrupt_that_comes_as_the_cell_ends_costs_nothing(cellbox):
    """A cell that passes the output cap by one byte ends at once; the agent's SIGINT at the cap can then arrive after
    it, while the runner writes its answer or waits for the next request: dropped there (it ended the session 1 to 2
    times in 60, the next cell blamed), it interrupts only a cell's own code."""
    svc, sid = cellbox
    cell(cellbox, "keep = 41")
    for _ in range(40):
        flood = cell(cellbox, "import sys; sys.stdout.write('a' * 65537); None")
        assert flood.truncated and flood.session == "kept", flood
        after = cell(cellbox, "print('hi'); keep + 1")
        assert (after.stdout, after.session) == ("hi\n42\n", "kept"), after


def test_a_cell_that_will_not_stop_ends_the_session(cellbox):
    cell(cellbox, "w = 1")
    r = cell(cellbox, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
             timeout_s=1.0)
    assert r.status == "timeout" and "variables are gone" in r.message
    r = cell(cellbox, "'w' in dir()")
    assert r.stdout == "False\n" and "new interpreter" in r.message


def test_what_a_cell_starts_dies_with_it(cellbox):
    svc, sid = cellbox
    r = cell(cellbox, "import subprocess\np = subprocess.Popen(['sleep', '300'], start_new_session=True)\np.pid")
    assert r.exit_code == 0
    procs = svc.backend._call(svc._session(sid).sid, {"op": "ps"})["procs"]
    assert not any(p.startswith("sleep 300") for p in procs) and any("interpreter" in p or "-c" in p for p in procs)
    assert cell(cellbox, "p.poll() is not None").stdout == "True\n"


def test_a_thread_a_cell_leaves_runs_only_during_cells(cellbox):
    """The session is stopped between calls: a background thread cannot change the workspace beside other tools."""
    svc, sid = cellbox
    cell(cellbox, "import threading, time\nticks = []\ndef tick():\n    while True:\n        ticks.append(1)\n"
                  "        open('ticks.txt', 'w').write(str(len(ticks)))\n        time.sleep(0.005)\n"
                  "threading.Thread(target=tick, daemon=True).start()\ntime.sleep(0.05)")
    first = svc.exec(sid, "cat", {"path": "ticks.txt"}).stdout
    time.sleep(0.3)
    assert svc.exec(sid, "cat", {"path": "ticks.txt"}).stdout == first and int(first) > 0
    assert int(cell(cellbox, "time.sleep(0.05); len(ticks)").stdout) > int(first)  # it runs again in a cell


def test_hostile_cells_are_cut(cellbox):
    svc, sid = cellbox
    cell(cellbox, "keep = 'kept'")
    r = cell(cellbox, "b = bytearray(2 << 30)")
    assert "MemoryError" in r.stderr
    r = cell(cellbox, "import os\ntry:\n    os.kill(1, 9)\nexcept OSError as e:\n    print(type(e).__name__)")
    assert r.stdout.strip() in ("PermissionError", "ProcessLookupError"), r
    r = cell(cellbox, "while True: print('x' * 1000)", timeout_s=5.0)
    assert r.truncated and "cap" in r.message
    assert cell(cellbox, "keep").stdout == "'kept'\n"
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        break"
    r = cell(cellbox, bomb, timeout_s=3.0)
    assert not r.sandbox_replaced
    assert svc.exec(sid, "ls", {"path": "/data"}).status == "ok"


def test_rollback_resumes_the_interpreter_of_the_snapshot(cellbox):
    svc, sid = cellbox
    cell(cellbox, "import random\nrandom.seed(1)\nhistory = ['before']")
    snap = svc.snapshot(sid)
    full = svc.snapshot_bytes(snap.id)
    lean = without_interpreter_state(full)  # what a rollback that resumes the copy sends: the areas alone
    with tarfile.open(fileobj=io.BytesIO(full)) as a, tarfile.open(fileobj=io.BytesIO(lean)) as b:
        assert a.getnames()[-1] == SESSION_MEMBER and b.getnames() == a.getnames()[:-1]
    cell(cellbox, "history.append('after'); r1 = random.random()")
    first = cell(cellbox, "r1").stdout
    for _ in range(2):  # as often as asked: each resume leaves the copy in place
        svc.rollback(sid, snap.id)
        r = cell(cellbox, "history")
        assert r.stdout == "['before']\n", r
        cell(cellbox, "history.append('again'); r1 = random.random()")
        assert cell(cellbox, "r1").stdout == first  # the generator's state came back with the copy
    other = svc.create(cwd="/scratch", families=["interpreter"])
    try:
        svc.rollback(other.id, snap.id)  # another sandbox's snapshot: a new interpreter, the variables by value
        r = svc.exec(other.id, "run_cell", {"code": "history, random.random()"})  # the generator's state too
        assert r.stdout == f"(['before'], {first.strip()})\n" and "carried by value" in r.message, r
        [child] = svc.fork(sid, 1)
        r = svc.exec(child.id, "run_cell", {"code": "history"})
        assert r.stdout == "['before', 'again']\n" and "carried by value" in r.message, r
        svc.delete(child.id)
    finally:
        svc.delete(other.id)


def test_a_fork_carries_the_variables_by_value(cellbox):
    """fork(n), clone and a fork of a fork that ran no cell: modules by name, cell functions and classes by source,
    values by pickle (a shared list stays shared), random's state, cwd and environment; an open file, a generator
    and a lambda are named as not carried, with the reason, and the copies diverge from there."""
    svc, sid = cellbox
    cell(cellbox, "import random, json as j, os\nrandom.seed(3)\nx = [1, 2]\ny = x\nclass C:\n"
                  "    def __init__(self, v):\n        self.v = v\n@staticmethod\ndef f(a, b=2):\n    return a * b\n"
                  "c = C(5)\nfh = open('/scratch/a.txt', 'w')\ng = (i for i in range(3))\nl = lambda: 1\n"
                  "os.environ['K'] = 'v'\nos.chdir('/tmp')")
    kids = svc.fork(sid, 2)
    parent = cell(cellbox, "random.random(), x").stdout
    try:
        for kid in kids:
            r = svc.exec(kid.id, "run_cell", {"code": "random.random(), x, y is x, c.v, type(c).__name__, f(3), "
                                                      "j.dumps(1), os.getcwd(), os.environ['K']"})
            assert r.stdout == f"({parent.strip()[1:-1]}, True, 5, 'C', 6, '1', '/tmp', 'v')\n", r
            assert "carried by value (random, j, os, C, f, x, y, c)" in r.message, r.message
            for name, why in (("fh", "cannot pickle '_io.TextIOWrapper'"), ("g", "'generator'"), ("l", "lambda")):
                assert f"{name} (" in r.message and why in r.message.split(f"{name} (", 1)[1], r.message
            assert " at 0x" not in r.message  # the same state, the same words
        svc.exec(kids[0].id, "run_cell", {"code": "x.append(9)"})
        assert svc.exec(kids[1].id, "run_cell", {"code": "x"}).stdout == "[1, 2]\n"  # apart
        [grand] = svc.fork(kids[0].id, 1)
        [great] = svc.fork(grand.id, 1)  # its parent never ran a cell: what it carried goes on
        r = svc.exec(great.id, "run_cell", {"code": "x, y is x, c.v"})
        assert r.stdout == "([1, 2, 9], True, 5)\n", r
        snap = svc.snapshot(kids[1].id)
        [cl] = svc.clone(snap.id, 1)
        assert svc.exec(cl.id, "run_cell", {"code": "x, f(1)"}).stdout == "([1, 2], 2)\n"
        svc.delete_snapshot(snap.id)
        kids += [grand, great, cl]
    finally:
        for kid in kids:
            svc.delete(kid.id)


def test_values_that_will_not_pickle_cost_only_themselves(cellbox):
    """A value whose ``__reduce__`` raises is named as not carried; one whose ``__reduce__`` never returns ends the
    session at the fork (after 5 s: the fork itself succeeds, its copy starts with no variables)."""
    svc, sid = cellbox
    cell(cellbox, "class Bad:\n    def __reduce__(self):\n        raise RuntimeError('no')\nb = Bad()\nk = 1")
    [kid] = svc.fork(sid, 1)
    r = svc.exec(kid.id, "run_cell", {"code": "k, 'b' in dir()"})
    assert r.stdout == "(1, False)\n" and "b (RuntimeError: no)" in r.message, r
    svc.delete(kid.id)
    cell(cellbox, "class Slow:\n    def __reduce__(self):\n        import time\n        time.sleep(60)\ns = Slow()")
    t0 = time.monotonic()
    [kid] = svc.fork(sid, 1)
    assert time.monotonic() - t0 < 10
    r = svc.exec(kid.id, "run_cell", {"code": "'k' in dir()"})
    assert r.stdout == "False\n" and "with no variables: the session did not export its state" in r.message, r
    svc.delete(kid.id)
    r = cell(cellbox, "'k' in dir()")  # the parent's session was ended too (it would not answer), and is told why
    assert r.stdout == "False\n" and "it did not export its state (no answer within 5 s" in r.message, r


def first_cell(svc, sid, code="sorted(k for k in dir() if not k.startswith('_'))"):
    """The first cell of the one copy ``fork(1)`` of ``sid`` makes (the copy deleted after)."""
    [kid] = svc.fork(sid, 1)
    try:
        return svc.exec(kid.id, "run_cell", {"code": code})
    finally:
        svc.delete(kid.id)


def test_what_cannot_be_carried_costs_only_itself(cellbox):
    """A buffer past the state's bound, a value whose ``__reduce__`` raises SystemExit, a function defined inside an
    ``if`` (a copy could not find it by name) and a working directory since removed are each named, the rest
    carried; an export that dies (``os._exit`` in a value's code) costs the copy its variables, told, never the
    parent's session; a runner a cell rewrote to answer 200 MiB costs the session (told), never the agent, the
    sandbox or its workspace."""
    svc, sid = cellbox
    cell(cellbox, "import os, tempfile\nbig = bytearray(80 << 20)\nclass Quit:\n    def __reduce__(self):\n"
                  "        raise SystemExit(3)\nq = Quit()\nif True:\n    def hidden():\n        return 1\nv = 7\n"
                  "d = tempfile.mkdtemp()\nos.chdir(d)\nos.rmdir(d)")
    r = first_cell(svc, sid)
    assert r.stdout == "['Quit', 'd', 'os', 'tempfile', 'v']\n", r
    assert {"big", "q", "hidden", "(working directory)"} <= set(r.not_carried), r.not_carried
    assert "too large to carry" in r.not_carried["big"] and "SystemExit" in r.not_carried["q"]
    assert "not by a top-level def" in r.not_carried["hidden"]
    cell(cellbox, "del big, q, hidden\nos.chdir('/scratch')\nclass Die:\n    def __reduce__(self):\n"
                  "        os._exit(3)\nx = Die()")
    t0 = time.monotonic()
    r = first_cell(svc, sid, "'v' in dir()")
    assert time.monotonic() - t0 < 4 and r.stdout == "False\n", r
    assert "with no variables" in r.message and "exit status 3" in r.message, r.message
    assert cell(cellbox, "v").stdout == "7\n"  # the parent's session kept
    svc.exec(sid, "write_file", {"path": "precious.txt", "text": "kept"})
    cell(cellbox, "import sys\nf = sys._getframe()\nwhile '_export_in_child' not in f.f_globals:\n"
                  "    f = f.f_back\ndef flood(ns, answers, n, limit):\n"
                  "    os.write(answers.fileno(), b'{\"n\": %d, \"ok\": true, \"data\": \"' % n)\n"
                  "    for i in range(200):\n        os.write(answers.fileno(), b'A' * (1 << 20))\n"
                  "f.f_globals['_export_in_child'] = flood\ndel f")
    r = first_cell(svc, sid, "'v' in dir()")
    assert r.stdout == "False\n" and "did not export its state" in r.message, r
    assert svc.exec(sid, "cat", {"path": "precious.txt"}).stdout == "kept"  # not replaced: the agent lived
    r = cell(cellbox, "'v' in dir()")
    assert r.stdout == "False\n" and "ended at a snapshot" in r.message, r


def test_a_copy_reads_as_the_session_it_came_from(cellbox):
    """What re-running definitions would get wrong, a copy gets right: a mutable default and a default taken from a
    variable since changed, function and class attributes, a private name, a module the session imported before its
    file was edited (the copy runs the source as imported), the order of a set of strings (one hash seed); and what
    re-running prints (a decorator, a class body, a module) never reaches the copy's output."""
    svc, sid = cellbox
    svc.exec(sid, "write_file", {"path": "mod.py", "text": "print('importing mod')\ndef f():\n    return 'old'\n"})
    cell(cellbox, "def acc(v, bag=[]):\n    bag.append(v)\n    return bag\nacc(1); acc(2)\ny0 = 1\n"
                  "def g(x=y0):\n    return x\ny0 = 2\ndef h():\n    pass\nh.calls = 5\n"
                  "class K:\n    print('class body runs')\n    n = 0\nK.n += 1\n__secret = 3\n"
                  "import mod\nfrom mod import f\nwords = {'alpha', 'beta', 'gamma', 'delta', 'epsilon'}")
    svc.exec(sid, "write_file", {"path": "mod.py", "text": "def f():\n    return 'new'\n"})
    probe = "acc(3), g(), h.calls, K.n, __secret, f(), mod.f(), list(words)"
    want = cell(cellbox, probe).stdout
    assert "[1, 2, 3]" in want and "'old', 'old'" in want, want
    cell(cellbox, "acc.__defaults__[0].pop()")  # back to the state the copy will carry
    r = first_cell(svc, sid, probe)
    assert r.stdout == want and r.not_carried == {}, r


def test_copies_outlive_a_miss_and_a_crash(cellbox):
    """A rollback to a snapshot whose copy was dropped, and a crash of the live session, lose only the live
    session's variables: the other snapshots' copies still resume."""
    svc, sid = cellbox
    snaps = []
    for i in range(10):  # 10 snapshots: the first two copies are dropped (8 kept)
        cell(cellbox, f"v = {i}")
        snaps.append(svc.snapshot(sid))
    svc.rollback(sid, snaps[0].id)  # its copy was dropped: a new interpreter, the variables by value...
    r = cell(cellbox, "v")
    assert r.stdout == "0\n" and "new interpreter" in r.message and "carried by value" in r.message
    svc.rollback(sid, snaps[9].id)  # ...and the others still resume
    assert cell(cellbox, "v").stdout == "9\n"
    cell(cellbox, "import os; os._exit(1)")  # the live session crashes
    svc.rollback(sid, snaps[5].id)
    assert cell(cellbox, "v").stdout == "5\n"
    r = cell(cellbox, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
             timeout_s=1.0)
    assert "variables are gone" in r.message  # killed at its deadline...
    svc.rollback(sid, snaps[8].id)
    assert cell(cellbox, "v").stdout == "8\n"  # ...and a copy still resumes
    for snap in snaps:
        svc.delete_snapshot(snap.id)


def test_a_cell_cannot_wake_or_fake_a_copy(cellbox):
    """A copy waits for the agent's signal only: a cell's SIGCONT / SIGUSR1 to it changes nothing; a runner rewritten
    by a cell so that it reports itself as the copy gets no copy kept (the rollback says the interpreter is new)."""
    svc, sid = cellbox
    cell(cellbox, "v = 'snap'")
    snap = svc.snapshot(sid)
    cell(cellbox, "v = 'live'")
    r = cell(cellbox, "import os, signal\nme = os.getpid()\nkids = []\n"
                      "for p in os.listdir('/proc'):\n"
                      "    if p.isdigit() and int(p) != me:\n"
                      "        try:\n"
                      "            if open(f'/proc/{p}/cmdline','rb').read().startswith(b'python3\\x00-s\\x00-B'):\n"
                      "                os.kill(int(p), signal.SIGCONT); os.kill(int(p), signal.SIGUSR1)\n"
                      "                kids.append(p)\n"
                      "        except OSError:\n"
                      "            pass\n"
                      "len(kids)")
    assert r.stdout == "1\n", r  # the one copy, signalled
    assert [cell(cellbox, "v").stdout for _ in range(6)] == ["'live'\n"] * 6  # one interpreter answers
    svc.rollback(sid, snap.id)
    assert cell(cellbox, "v").stdout == "'snap'\n"
    cell(cellbox, "import sys, os\nf = sys._getframe()\nwhile f.f_back is not None:\n    f = f.f_back\n"
                  "f.f_globals['_fork_template'] = lambda: os.getpid()\ndel f")  # the runner's own function
    forged = svc.snapshot(sid)
    cell(cellbox, "v = 'after'")
    svc.rollback(sid, forged.id)
    r = cell(cellbox, "v")  # no copy kept: a new interpreter with the snapshot's variables, never the live 'after'
    assert r.stdout == "'snap'\n" and "new interpreter" in r.message, r
    svc.delete_snapshot(snap.id)
    svc.delete_snapshot(forged.id)


def test_an_unreaped_child_costs_nothing_later(cellbox):
    """A child a cell never waited for is a zombie of the stopped session: later calls do not wait for it."""
    svc, sid = cellbox
    cell(cellbox, "import subprocess\np = subprocess.Popen(['true'])\nimport time; time.sleep(0.2)")
    for _ in range(3):
        assert cell(cellbox, "1").duration_s < 1.0
        assert svc.exec(sid, "cat", {"path": "/data/manifest.json"}).duration_s < 1.0


def test_a_closed_workspace_is_opened_again(cellbox):
    """``chmod 000 /scratch`` from a cell or a shell leaves the sandbox usable: the next call, a snapshot, a fork
    and a rollback all work, and the workspace's files keep their contents."""
    svc, sid = cellbox
    svc.exec(sid, "write_file", {"path": "keep.txt", "text": "kept"})
    early = svc.snapshot(sid)
    cell(cellbox, "import os; os.chmod('/scratch', 0)")
    assert svc.exec(sid, "cat", {"path": "keep.txt"}).stdout == "kept"
    cell(cellbox, "import os; os.chmod('/scratch', 0)")
    late = svc.snapshot(sid)
    [kid] = svc.fork(sid, 1)
    assert svc.exec(kid.id, "cat", {"path": "keep.txt"}).stdout == "kept"
    assert svc.exec(kid.id, "run_cell", {"code": "open('keep.txt').read()"}).stdout == "'kept'\n"
    svc.delete(kid.id)
    cell(cellbox, "import os; os.chmod('/scratch', 0)")
    svc.rollback(sid, early.id)
    assert svc.exec(sid, "cat", {"path": "keep.txt"}).stdout == "kept"
    svc.rollback(sid, late.id)
    assert cell(cellbox, "open('keep.txt').read()").stdout == "'kept'\n"
    svc.delete_snapshot(early.id)
    svc.delete_snapshot(late.id)


def test_a_cell_that_closes_its_output_is_told(cellbox):
    r = cell(cellbox, "import os\nos.close(1)")
    assert "no longer reaches the caller" in r.message
    assert "no longer reaches the caller" in cell(cellbox, "print('lost')").message
