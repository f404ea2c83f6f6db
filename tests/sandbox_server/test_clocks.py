"""Field case S32: every duration, deadline, TTL and expiry is measured on the monotonic clock; the wall clock
(``time.time()``) only fills fields shown to people.

The wall clock is faked by replacing ``time.time`` (the clock a step of NTP or a VM resume moves), never
forkyard code: a step of it must neither delete a sandbox used 2 s earlier nor expire its snapshot nor
close an env session (forward step), and must not keep an abandoned one alive either (backward step:
reaped once the monotonic clock says the TTL has passed, given as the reaper's ``now``).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sandbox_server.errors import SandboxNotFound
from sandbox_server.models import SessionState
from sandbox_server.snapshots import SnapshotStore
from tests.docker_support import SERVER_NAME, UvicornThread, require_bwrap

ROOT = Path(__file__).resolve().parents[2]
TTL_S = 900.0


def shift_wall_clock(monkeypatch: pytest.MonkeyPatch, by_s: float) -> None:
    """Make ``time.time()`` read ``by_s`` seconds off from now on (an NTP step or a VM resume)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + by_s)


@pytest.fixture
def ttl_service(fixture_data):
    """A started in-process SandboxService (local backend) with ``idle_ttl_s=900`` and ``snapshot_ttl_s=900``."""
    from sandbox_server.backends import LocalBackend
    from sandbox_server.service import SandboxService, ServiceConfig

    require_bwrap()
    svc = SandboxService(LocalBackend(fixture_data, server_name=f"{SERVER_NAME}-clocks"),
                         ServiceConfig(min_idle=0, max_total=2, idle_ttl_s=TTL_S, snapshot_ttl_s=TTL_S))
    svc.start()
    yield svc
    svc.close()


@pytest.mark.parametrize("step_s", [3600.0, -3600.0, 86400.0 * 365])
def test_a_wall_clock_step_keeps_a_used_sandbox_and_its_snapshot(ttl_service, monkeypatch, step_s):
    """Field case S32 as reported (+3,600 s), a backward step, and a year: the sandbox used just before and
    its snapshot survive the reaper, and the snapshot still clones."""
    svc = ttl_service
    sb = svc.create(files={"q.txt": b"hello"})
    snap = svc.snapshot(sb.id)
    assert svc.exec(sb.id, "cat", {"path": "/scratch/q.txt"}).stdout == "hello"
    shift_wall_clock(monkeypatch, step_s)
    assert svc.reap() == (0, 0)
    assert svc.get(sb.id).id == sb.id
    assert svc.get_snapshot(snap.id).id == snap.id
    kid = svc.clone(snap.id)[0]
    assert svc.exec(kid.id, "cat", {"path": "/scratch/q.txt"}).stdout == "hello"
    # the fields shown to people are wall times: they follow the (stepped) wall clock
    assert abs(svc.get(kid.id).created_at - time.time()) < 60
    for i in (sb.id, kid.id):
        svc.delete(i)
    svc.delete_snapshot(snap.id)


def test_a_backward_wall_step_does_not_keep_an_abandoned_sandbox_alive(ttl_service, monkeypatch):
    """The wall clock stepped back an hour: once the monotonic clock is past the TTL (the reaper's ``now``),
    the abandoned sandbox is deleted and its snapshot expired all the same."""
    svc = ttl_service
    sb = svc.create()
    snap = svc.snapshot(sb.id)
    shift_wall_clock(monkeypatch, -3600.0)
    assert svc.reap(now=time.monotonic() + TTL_S / 2) == (0, 0)
    assert svc.reap(now=time.monotonic() + TTL_S + 1) == (1, 1)
    with pytest.raises(SandboxNotFound):
        svc.get(sb.id)
    with pytest.raises(SandboxNotFound):
        svc.get_snapshot(snap.id)


@settings(max_examples=200, deadline=None)
@given(step=st.floats(-1e9, 1e9, allow_nan=False), ttl=st.floats(0.001, 1e6), age=st.floats(0, 2e6))
def test_snapshot_expiry_follows_the_monotonic_clock_only(step, ttl, age):
    """Any wall step: a snapshot is live exactly while less than its TTL has passed on the monotonic clock."""
    assume(abs(age - ttl) > 1e-3)  # no float rounding at the very edge
    store = SnapshotStore(1 << 20)
    real = time.time
    try:
        time.time = lambda: real() + step  # the faked clock; restored below
        snap = store.put("sb-x", b"tar", SessionState(), ttl)
        now = snap.deadline - ttl + age
        expired = store.expire(now)
    finally:
        time.time = real
    assert expired == (1 if age >= ttl else 0)
    assert len(store) == 1 - expired
    assert snap.expires_at - snap.created_at == pytest.approx(ttl, abs=1e-3)  # the shown times keep the TTL


@pytest.mark.parametrize("step_s", [3600.0, -3600.0])
def test_a_wall_clock_step_keeps_an_env_session(monkeypatch, step_s):
    """The same for env sessions (``/v1/envs``, ``FORKYARD_ENV_TTL_S``), over a real server: a step of the wall
    clock closes nothing; the monotonic clock past the TTL closes an abandoned session."""
    from sandbox_server.app import create_env_app

    app = create_env_app(ttl_s=TTL_S)
    srv = UvicornThread(app).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            r = http.post("/v1/envs", json={"env_id": "forkyard/ClueProbe-v0", "seed": 3})
            assert r.status_code == 201, r.text
            sid = r.json()["session_id"]
            shift_wall_clock(monkeypatch, step_s)
            assert app.state.env_sessions.reap() == 0
            assert http.get(f"/v1/envs/{sid}").status_code == 200
            assert app.state.env_sessions.reap(now=time.monotonic() + TTL_S + 1) == 1
            assert http.get(f"/v1/envs/{sid}").status_code == 404
    finally:
        srv.stop()


def test_no_duration_is_computed_from_the_wall_clock():
    """Audit: ``time.time()`` appears in sandbox_server/, envs/ and trainer/ only where a wall time is shown
    to people or compared with another process's wall time; every such line is listed here."""
    allowed = {
        "sandbox_server/service.py": 2,  # created_at (shown) and touch()'s last_used_at (shown)
        "sandbox_server/snapshots.py": 1,  # created_at / expires_at (shown)
        "sandbox_server/backends/local.py": 1,  # owner.json created_at (shown)
        "sandbox_server/backends/docker.py": 1,  # a container's age: the engine reports wall times only
    }
    found: dict[str, int] = {}
    for folder in ("sandbox_server", "envs", "trainer"):
        for path in (ROOT / folder).rglob("*.py"):
            n = len(re.findall(r"\btime\.time\(\)|datetime\.now\(|datetime\.utcnow\(|\bfrom time import\b",
                               path.read_text()))
            if n:
                found[str(path.relative_to(ROOT))] = n
    assert found == allowed
