"""Reliability suite (issue 12, section 5): load and faults against real servers on loopback and a real
Docker engine. Each test ends with no leaked container, no stuck session and a clean error for the
affected request or episode only. Figures (requests sent, answers by status, leaks) are printed and,
when ``FORKYARD_RELIABILITY_OUT`` names a file, written there as JSON (``docs/reliability.md``).

Run alone: ``.venv/bin/python -m pytest -q -s tests/test_reliability.py``.
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
            while (res["fds"] > base["fds"] + FD_SLACK or res["threads"] > base["threads"]) and time.monotonic() < deadline:
                time.sleep(0.5)
                res = srv.resources()
            rounds.append({"sessions_got": got, **res, "containers": len(leftover_containers(srv.name))})
            assert res["fds"] <= base["fds"] + FD_SLACK and res["threads"] <= base["threads"], (base, rounds)
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


def test_a_killed_agent_costs_one_call_of_one_session(served):
    kind, svc, http = served
    a = http.post("/v1/sandboxes", json={"files": {"q.txt": "hello"}}).json()["id"]
    b = http.post("/v1/sandboxes", json={"files": {"q.txt": "other"}}).json()["id"]
    _kill_agent(kind, svc, svc._session(a).sid)
    r = http.post(f"/v1/sandboxes/{a}/exec", json={"tool": "cat", "args": {"path": "/scratch/q.txt"}})
    assert r.status_code == 200 and r.json()["status"] == "error" and "replaced" in r.json()["message"]
    # the session goes on, from its last restore point; the other session never noticed
    assert http.post(f"/v1/sandboxes/{a}/exec", json={"tool": "cat", "args": {"path": "/scratch/q.txt"}}).json()["stdout"] == "hello"
    assert http.post(f"/v1/sandboxes/{b}/exec", json={"tool": "cat", "args": {"path": "/scratch/q.txt"}}).json()["stdout"] == "other"
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
    assert http.post(f"/v1/sandboxes/{sb}/exec", json={"tool": "cat", "args": {"path": "/scratch/q.txt"}}).json()["stdout"] == "hello"
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
        assert http.post(f"/v1/sandboxes/{k['id']}/exec", json={"tool": "cat", "args": {"path": "/scratch/q.txt"}}).json()["stdout"] == "hello"
        http.delete(f"/v1/sandboxes/{k['id']}")
    http.delete(f"/v1/sandboxes/{parent}")
    _settled(svc, 0)
    _record(f"pool exhausted mid-fork ({kind})", status=503, sessions_left=1, leaked=0)
