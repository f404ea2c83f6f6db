"""Reliability suite (docs/reliability.md): load and faults against real servers on loopback and a real
Docker engine. Each test ends with no leaked container, no stuck session and a clean error for the
affected request or episode only. Figures (requests sent, answers by status, leaks) are printed and,
when ``FORKYARD_RELIABILITY_OUT`` names a file, written there as JSON (``docs/reliability.md``).

Run alone: ``.venv/bin/python -m pytest -q -s tests/sandbox_server/test_reliability.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import Counter

import httpx
import pytest

from tests.docker_support import (
    SERVER_NAME, ServerProcess, UvicornThread, backend_for, leftover_containers, require_docker,
)

pytestmark = [pytest.mark.slow, pytest.mark.reliability]

FIGURES: dict[str, dict] = {}


def _record(name: str, **figures) -> None:
    FIGURES[name] = figures
    print(f"\n[reliability] {name}: {json.dumps(figures, sort_keys=True)}")
    out = os.environ.get("FORKYARD_RELIABILITY_OUT")
    if out:
        old = json.loads(open(out).read()) if os.path.exists(out) else {}
        old[name] = figures
        with open(out, "w") as f:
            json.dump(old, f, indent=2, sort_keys=True)


def _check_error_body(r: httpx.Response) -> None:
    """Every error answer has the one documented shape; a 503 says when to retry."""
    body = r.json()
    assert isinstance(body, dict) and isinstance(body.get("detail"), str), r.text
    if r.status_code == 503:
        assert int(r.headers["retry-after"]) >= 1


# ---------------------------------------------------------------------------------------------------
# load


async def _round(url: str, statuses: Counter, creates: int = 64, calls: int = 256) -> int:
    """One load round: ``creates`` concurrent creates, ``calls`` concurrent tool calls over the sessions
    obtained, then every session deleted. Returns how many sessions clients got."""
    # A client per phase: a connection kept alive through a phase's waits (creates wait up to the acquire
    # timeout) can pass the server's 5 s keep-alive timeout and be closed under a new request.
    limits = httpx.Limits(max_connections=creates + calls, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        made = await asyncio.gather(*[c.post("/v1/sandboxes", json={"files": {"q.txt": f"q{i}"}})
                                      for i in range(creates)])
        ids = []
        for r in made:
            statuses[f"create {r.status_code}"] += 1
            assert r.status_code in (201, 503), r.text
            if r.status_code == 201:
                ids.append(r.json()["id"])
            else:
                _check_error_body(r)
        assert ids, "no create succeeded"
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        ran = await asyncio.gather(*[
            c.post(f"/v1/sandboxes/{ids[i % len(ids)]}/exec",
                   json={"tool": "grep", "args": {"pattern": "def ", "path": "Lib/textwrap.py", "max_count": 3}})
            for i in range(calls)])
        for r in ran:
            statuses[f"exec {r.status_code}"] += 1
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "ok" and "def " in r.json()["stdout"]
        gone = await asyncio.gather(*[c.delete(f"/v1/sandboxes/{i}") for i in ids])
        for r in gone:
            statuses[f"delete {r.status_code}"] += 1
            assert r.status_code == 204, r.text
        return len(ids)


#: Descriptors a round may leave above the baseline (pooled engine connections; 5 rounds: a leak of one per
#: round ends above it).
FD_SLACK = 2
#: Threads worker pools may keep past their warm-up size after a round that overlapped more calls than the warm-up
#: (not a leak: it does not grow). Seen on machines loaded by other jobs: 16 and 17 against a baseline of 15. A
#: leak of one thread a round passes it by the fourth of the five rounds.
THREAD_SLACK = 3


def test_load_rounds_return_every_count_to_its_baseline():
    """5 rounds of 64 concurrent creates and 256 concurrent tool calls against a docker-backend server:
    only 2xx and documented 503s, and after each round descriptors, threads, sessions and containers
    are back at their baseline (taken after one warm-up round: thread pools and engine connections
    grow once, on first use)."""
    require_docker()
    min_idle = 4
    srv = ServerProcess(f"{SERVER_NAME}-load", FORKYARD_MIN_IDLE=str(min_idle), FORKYARD_MAX_TOTAL="16",
                        FORKYARD_ACQUIRE_TIMEOUT_S="3")
    statuses: Counter = Counter()
    rounds = []
    try:
        srv.wait_idle(min_idle)
        got = asyncio.run(_round(srv.url, statuses))  # warm-up
        srv.wait_idle(min_idle)
        time.sleep(1.0)
        base = srv.resources()
        for _ in range(5):
            got = asyncio.run(_round(srv.url, statuses))
            srv.wait_idle(min_idle)
            deadline = time.monotonic() + 30  # idle worker threads and closed sockets take a moment to go
            res = srv.resources()
            # The engine client's connection pool may keep one or two more connections after a round that ran
            # on a busier machine (seen once: 40 against 39 after 30 s); a leak grows every round and fails.
            # Worker pools may also keep a few more threads after a round that overlapped more calls than the
            # warm-up did (THREAD_SLACK).
            while ((res["fds"] > base["fds"] + FD_SLACK or res["threads"] > base["threads"] + THREAD_SLACK)
                   and time.monotonic() < deadline):
                time.sleep(0.5)
                res = srv.resources()
            rounds.append({"sessions_got": got, **res, "containers": len(leftover_containers(srv.name))})
            assert res["fds"] <= base["fds"] + FD_SLACK and res["threads"] <= base["threads"] + THREAD_SLACK, (
                base, rounds)
    finally:
        srv.stop()
        left = leftover_containers(srv.name)
    assert left == []
    _record("load", baseline=base, rounds=rounds, statuses=dict(statuses),
            requests=sum(statuses.values()), leaked_containers=len(left))


# ---------------------------------------------------------------------------------------------------
# faults (an in-thread uvicorn over a service the test can reach into, to find the sandbox it breaks)


@pytest.fixture(params=["docker", "local"])
def served(request, fixture_data):
    from sandbox_server.app import create_app
    from sandbox_server.service import SandboxService, ServiceConfig

    name = f"{SERVER_NAME}-faults-{request.param}"
    backend = backend_for(request.param, name, fixture_data)
    svc = SandboxService(backend, ServiceConfig(min_idle=2, max_total=5, default_timeout_s=5, max_timeout_s=10,
                                                acquire_timeout_s=2.0))
    try:
        srv = UvicornThread(create_app(service=svc)).start()
    except BaseException:
        svc.close()  # the app never started: its lifespan cannot close the service
        raise
    yield request.param, svc, httpx.Client(base_url=srv.url, timeout=60)
    srv.stop()
    if request.param == "docker":
        assert leftover_containers(name) == []


def _kill_agent(kind: str, svc, sid: str) -> None:
    """SIGKILL the agent process of backend sandbox ``sid`` (not its container or bubblewrap)."""
    pid = svc.backend._call(sid, {"op": "ping"})["pid"]  # the agent's pid in its own namespace
    if kind == "docker":
        svc.backend.container(sid).exec_run(["python3", "-c", f"import os; os.kill({pid}, 9)"], user="1000:1000")
    else:
        os.killpg(svc.backend.pid(sid), 9)


def _settled(svc, sessions: int) -> None:
    """Within 15 s: ``sessions`` sessions, and every sandbox the backend runs is idle or held by one."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        st = svc.pool_status()
        if st.sessions == sessions and st.busy == sessions and st.starting == 0 \
                and len(svc.backend.ids()) == st.idle + st.busy:
            return
        time.sleep(0.1)
    raise AssertionError(f"not settled: {svc.pool_status()}, backend holds {len(svc.backend.ids())}")


def _cat_q(http: httpx.Client, sandbox_id: str) -> str:
    """The stdout of ``cat /scratch/q.txt`` run over HTTP in sandbox ``sandbox_id``."""
    return http.post(f"/v1/sandboxes/{sandbox_id}/exec",
                     json={"tool": "cat", "args": {"path": "/scratch/q.txt"}}).json()["stdout"]


def test_a_killed_agent_costs_one_call_of_one_session(served):
    kind, svc, http = served
    a = http.post("/v1/sandboxes", json={"files": {"q.txt": "hello"}}).json()["id"]
    b = http.post("/v1/sandboxes", json={"files": {"q.txt": "other"}}).json()["id"]
    _kill_agent(kind, svc, svc._session(a).sid)
    r = http.post(f"/v1/sandboxes/{a}/exec", json={"tool": "cat", "args": {"path": "/scratch/q.txt"}})
    assert r.status_code == 200 and r.json()["status"] == "error" and "replaced" in r.json()["message"]
    # the session goes on, from its last restore point; the other session never noticed
    assert _cat_q(http, a) == "hello"
    assert _cat_q(http, b) == "other"
    for sid in (a, b):
        assert http.delete(f"/v1/sandboxes/{sid}").status_code == 204
    _settled(svc, 0)
    _record(f"kill agent ({kind})", affected_calls=1, leaked=0)


@pytest.mark.parametrize("served", ["docker"], indirect=True)  # `docker kill` is a docker fault
def test_docker_kill_of_a_busy_and_an_idle_container(served):
    kind, svc, http = served
    sb = http.post("/v1/sandboxes", json={"files": {"q.txt": "hello"}}).json()["id"]
    out: dict = {}

    def long_call():  # `cat` of a FIFO blocks until its timeout: the container is busy
        out["r"] = http.post(f"/v1/sandboxes/{sb}/exec", json={"tool": "cat", "args": {"path": "fifo"}, "timeout_s": 8})

    t = threading.Thread(target=long_call)
    t.start()
    time.sleep(1.0)
    svc.backend.container(svc._session(sb).sid).kill()
    t.join(30)
    r = out["r"]
    assert r.status_code == 200 and r.json()["status"] == "error", r.text
    assert _cat_q(http, sb) == "hello"
    # every idle container killed: a new session's first call still works (S31)
    with svc.pool._cond:
        idle = list(svc.pool._idle)
    assert idle
    for sid in idle:
        svc.backend.container(sid).kill()
    fresh = http.post("/v1/sandboxes").json()["id"]
    first = http.post(f"/v1/sandboxes/{fresh}/exec", json={"tool": "head", "args": {"path": "notes.txt", "lines": 1}})
    assert first.json()["status"] == "ok" and first.json()["stdout"] == "alpha\n"
    for sid in (sb, fresh):
        assert http.delete(f"/v1/sandboxes/{sid}").status_code == 204
    _settled(svc, 0)
    _record("docker kill busy + idle", killed_idle=len(idle), leaked=0)


def test_pool_exhausted_mid_fork_leaves_only_the_parent(served):
    kind, svc, http = served
    parent = http.post("/v1/sandboxes", json={"files": {"q.txt": "hello"}}).json()["id"]
    r = http.post(f"/v1/sandboxes/{parent}/fork", json={"n": 5})  # max_total 5: the parent holds one
    assert r.status_code == 503
    _check_error_body(r)
    assert [s["id"] for s in http.get("/v1/sandboxes").json()["sandboxes"]] == [parent]
    _settled(svc, 1)
    kids = http.post(f"/v1/sandboxes/{parent}/fork", json={"n": 2})
    assert kids.status_code == 201
    for k in kids.json()["sandboxes"]:
        assert _cat_q(http, k["id"]) == "hello"
        http.delete(f"/v1/sandboxes/{k['id']}")
    http.delete(f"/v1/sandboxes/{parent}")
    _settled(svc, 0)
    _record(f"pool exhausted mid-fork ({kind})", status=503, sessions_left=1, leaked=0)


# ---------------------------------------------------------------------------------------------------
# load on one sandbox (field case S38)


def test_s38_one_saturated_sandbox_leaves_another_within_twice_its_idle_latency(served):
    """Field case S38 as the load suite runs it: 60 concurrent one-second calls on sandbox A (``cat`` of a
    FIFO, blocked until its ``timeout_s=1``; no CPU, so the 2-core machine measures queueing, not CPU).
    Meanwhile 20 quick ``cat`` calls on sandbox B stay within twice B's idle latency, measured just before
    (plus 50 ms at the median, 500 ms at the worst call); A's calls run one at a time, and every one answered
    503 (it waited in A's queue past its deadline, 1 + 2 + 10 s here) never ran."""
    import statistics

    from sandbox_server.work import work_queues
    from tests.sandbox_server.test_sandbox_fairness import QUICK, SLOW, Flood, cat_latencies, ran, wait_for, within

    kind, svc, http = served
    url = str(http.base_url).rstrip("/")
    a = http.post("/v1/sandboxes", json={}).json()["id"]
    b = http.post("/v1/sandboxes", json={"files": {"q.txt": "b"}}).json()["id"]
    assert http.post(f"/v1/sandboxes/{b}/exec", json=QUICK).json()["stdout"] == "b"
    cat_latencies(http, b, 5)  # warm-up
    idle = cat_latencies(http, b, 20)
    t0 = time.monotonic()
    flood = Flood(url, [("POST", f"/v1/sandboxes/{a}/exec", SLOW)] * 60).start()
    wait_for(lambda: work_queues(svc).queued(a) == 59)  # every call of A has arrived: one runs, 59 wait
    busy = cat_latencies(http, b, 20)
    answers = flood.join()
    elapsed = time.monotonic() - t0
    time.sleep(1.5)  # a 503 that still ran (the bug) would have run by now
    statuses = Counter(r.status_code for r in answers)
    assert set(statuses) <= {200, 503}, statuses
    for r in answers:
        if r.status_code == 503:
            _check_error_body(r)
    ran_a = ran(svc, "cat", "timeout")
    assert ran_a == statuses[200] >= 2 and elapsed >= statuses[200] * 0.9
    assert within(busy, idle), (kind, idle, busy)
    for sid in (a, b):
        assert http.delete(f"/v1/sandboxes/{sid}").status_code == 204
    _settled(svc, 0)
    ms = lambda xs, f: round(f(xs) * 1000, 1)  # noqa: E731
    _record(f"one saturated sandbox ({kind})", a_calls=60, a_answers={str(k): v for k, v in sorted(statuses.items())},
            a_calls_run=ran_a, a_seconds=round(elapsed, 1),
            b_idle_ms={"p50": ms(idle, statistics.median), "max": ms(idle, max)},
            b_busy_ms={"p50": ms(busy, statistics.median), "max": ms(busy, max)},
            b_p50_ratio=round(statistics.median(busy) / statistics.median(idle), 2))


# ---------------------------------------------------------------------------------------------------
# shutdown (field case S39)


def _descendants(root_pid: int) -> set[tuple[int, str]]:
    """(pid, start time) of every live descendant of ``root_pid`` (a server's sandbox processes)."""
    parent, start = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parent[int(pid)], start[int(pid)] = int(fields[1]), fields[19]
    out, todo = set(), [root_pid]
    while todo:
        p = todo.pop()
        for child in [c for c, pp in parent.items() if pp == p]:
            out.add((child, start[child]))
            todo.append(child)
    return out


def _still_alive(procs: set[tuple[int, str]]) -> list[int]:
    """The pids of ``procs`` that still run (the same process: same start time, not a zombie)."""
    alive = []
    for pid, started in procs:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and fields[19] == started:
            alive.append(pid)
    return alive


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_sigterm_drains_within_a_bound(fixture_data, tmp_path, sig):
    """Field case S39: SIGTERM (``docker stop``; and SIGINT, Ctrl-C) to ``python -m sandbox_server --backend
    local`` while a 30 s tool call runs (``cat`` of a FIFO, ``timeout_s=30``) and an idle keep-alive connection
    is open. The in-flight call is answered 503 (with ``Retry-After``) after the drain's grace, every sandbox
    is destroyed, and the process exits within 5 s (well inside ``docker stop``'s 10 s), cleanly (no
    traceback), leaving no sandbox process or folder."""
    import signal
    import subprocess
    import sys

    from tests.docker_support import ROOT, free_port, require_bwrap, wait_http_ok

    require_bwrap()
    cache = tmp_path / "cache"  # XDG_CACHE_HOME: the local backend keeps its sandboxes under it
    name = f"{SERVER_NAME}-drain"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKYARD_")}
    env.update(PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(cache), FORKYARD_SERVER_NAME=name,
               FORKYARD_CORPUS=str(fixture_data), FORKYARD_MIN_IDLE="2")
    proc = subprocess.Popen([sys.executable, "-m", "sandbox_server", "--backend", "local", "--port", str(port),
                             "--log-level", "warning"], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    out: dict = {}
    try:
        assert wait_http_ok(f"{url}/healthz", 120, proc)
        keep_alive = httpx.Client(base_url=url, timeout=60)
        sb = keep_alive.post("/v1/sandboxes", json={}).json()["id"]
        keep_alive.post("/v1/sandboxes", json={"files": {"q.txt": "idle"}}).raise_for_status()  # a second session

        def long_call():
            with httpx.Client(base_url=url, timeout=60) as c:
                try:
                    out["r"] = c.post(f"/v1/sandboxes/{sb}/exec",
                                      json={"tool": "cat", "args": {"path": "fifo"}, "timeout_s": 30})
                except httpx.TransportError as exc:  # cut: allowed, but the drain answers first
                    out["r"] = exc

        caller = threading.Thread(target=long_call)
        caller.start()
        time.sleep(1.0)  # the call is in flight, blocked on the FIFO
        root = cache / "forkyard" / "local" / name
        sandboxes = _descendants(proc.pid)  # the bubblewrap and agent processes of its 3+ sandboxes
        assert caller.is_alive() and root.is_dir() and len(sandboxes) >= 3
        t0 = time.monotonic()
        proc.send_signal(getattr(signal, sig))
        status = proc.wait(30)
        exit_s = time.monotonic() - t0
        stderr = proc.stderr.read()
        caller.join(30)
        keep_alive.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    r = out["r"]
    assert isinstance(r, httpx.Response) and r.status_code == 503, r
    _check_error_body(r)
    assert status in (0, -signal.SIGTERM) and "Traceback" not in stderr, stderr[-2000:]
    left_folders = sorted(str(p) for p in root.rglob("*")) if root.exists() else []
    left_processes = _still_alive(sandboxes)
    assert left_folders == [] and left_processes == []
    assert exit_s < 5.0, exit_s
    _record(f"{sig} drain (local)", exit_s=round(exit_s, 2), in_flight_call=r.status_code,
            sandbox_folders_left=len(left_folders), sandbox_processes_left=len(left_processes))
