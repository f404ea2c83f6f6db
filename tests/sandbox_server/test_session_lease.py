"""Sessions a process opened are released when it ends, however it ends (field case S51): forkyard's HTTP clients
ask for a lease on every session they make and renew it from a background thread; a real server on loopback with a
600 s idle TTL closes the sessions of a client process ended by SIGTERM or SIGKILL within the lease plus the
reaper's period, keeps those of a live client however long it idles, and refuses a bad lease before anything runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from envs.wire import LEASE_HEADER
from sandbox_server.app import create_env_app
from sandbox_server.session_lease import MIN_LEASE_S
from tests.docker_support import ROOT, UvicornThread

CLUE = "forkyard/ClueProbe-v0"
LEASE = 5.0  # the shortest lease the server grants: the client below asks for it
#: A client process: RemoteEnv (forked twice), RemoteVectorEnv and TRL's factory instance, all over HTTP; it says
#: "ready" and then idles until it is ended.
CLIENT = f"""
import sys, time
import envs.session_lease as lease
lease.LEASE_S = {LEASE}
import envs
from envs.remote_vector import RemoteVectorEnv
from envs.trl import environment_factory
url = sys.argv[1]
env = envs.RemoteEnv("{CLUE}", server_url=url)
env.reset(seed=0)
kids = env.fork(2)
vec = RemoteVectorEnv("{CLUE}", url, num_envs=3)
vec.reset(seed=1)
trl_env = environment_factory("{CLUE}", server_url=url)()
trl_env.reset(seed=2)
print("ready", flush=True)
while True:
    time.sleep(0.5)
"""


@pytest.fixture()
def server():
    srv = UvicornThread(create_env_app(ttl_s=600)).start()
    yield srv
    srv.stop()


def open_sessions(srv: UvicornThread) -> int:
    return len(srv.server.config.app.state.env_sessions)


def start_client(srv: UvicornThread) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, srv.url], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def session_ids(srv: UvicornThread) -> set[str]:
    return set(srv.server.config.app.state.env_sessions.held())


def test_client_processes_ended_by_a_signal_leave_no_session_behind(server):
    """Two client processes at once, one ended by SIGTERM and one by SIGKILL (one lease wait for both)."""
    procs: dict[signal.Signals, subprocess.Popen] = {}
    owned: dict[signal.Signals, set[str]] = {}
    try:
        for how in (signal.SIGTERM, signal.SIGKILL):
            before = session_ids(server)
            procs[how] = start_client(server)
            owned[how] = session_ids(server) - before
            assert len(owned[how]) == 3 + 3 + 1  # RemoteEnv and its two forks, three vector sub-envs, the TRL instance
        time.sleep(3 * LEASE)  # idle far past their lease: renewed, none expires
        assert session_ids(server) == owned[signal.SIGTERM] | owned[signal.SIGKILL]
    finally:
        for how, proc in procs.items():
            proc.send_signal(how)
        for proc in procs.values():
            proc.wait(30)
    t0 = time.monotonic()
    while open_sessions(server) and time.monotonic() - t0 < LEASE + 5.0 + 10.0:  # lease + reaper + slack
        time.sleep(0.2)
    took = time.monotonic() - t0
    left = {how.name: sorted(owned[how] & session_ids(server)) for how in owned}
    assert open_sessions(server) == 0, f"sessions left {took:.1f} s after the clients ended: {left}"
    assert took > LEASE - 1.0  # released by their lease, not at once by anything else


def test_leases_are_granted_checked_and_renewed(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for bad in ("x", "nan", "inf", "-1", str(MIN_LEASE_S - 1), "1e9"):
            r = http.post("/v1/envs", json={"env_id": CLUE}, headers={LEASE_HEADER: bad})
            assert r.status_code == 422 and LEASE_HEADER in r.json()["detail"], (bad, r.text)
        assert open_sessions(server) == 0  # nothing ran
        leased = http.post("/v1/envs", json={"env_id": CLUE}, headers={LEASE_HEADER: "5"}).json()["session_id"]
        kids = http.post(f"/v1/envs/{leased}/fork", json={"n": 2}, headers={LEASE_HEADER: "5"}).json()["session_ids"]
        plain = http.post("/v1/envs", json={"env_id": CLUE}).json()["session_id"]  # no lease: the TTL alone
        sessions = server.server.config.app.state.env_sessions
        assert [sessions.peek(s).lease_s for s in (leased, *kids, plain)] == [5.0, 5.0, 5.0, None]
        for _ in range(4):  # 8 s of renewals every 2 s: the leased sessions stay
            time.sleep(2.0)
            r = http.post("/v1/envs/batch/renew", json={"session_ids": [leased, kids[0], "gone"]})
            assert r.json() == {"renewed": [leased, kids[0]], "missing": ["gone"]}
        t0 = time.monotonic()
        while sessions.peek(kids[1]) is not None and time.monotonic() - t0 < 15:
            time.sleep(0.2)
        assert sessions.peek(kids[1]) is None  # not renewed: closed after its lease
        assert sessions.peek(leased) is not None and sessions.peek(plain) is not None
        assert http.post("/v1/envs/batch/renew", json={"session_ids": ["x" * 201]}).status_code == 422
