"""Service-level limits and hand-out checks: bounded snapshot storage (S30), idle sandboxes checked before
hand-out (S31), abandoned requests release what they took (S25), on every backend."""

from __future__ import annotations

import os
import time

import pytest

from sandbox_server.errors import ServiceUnavailable, ToolRefused
from sandbox_server.service import CancelToken, SandboxService, ServiceConfig
from tests.docker_support import SERVER_NAME, backend_for


@pytest.fixture(params=["local", "docker"])
def svc(request, fixture_data):
    backend = backend_for(request.param, f"{SERVER_NAME}-limits-{request.param}", fixture_data)
    s = SandboxService(backend, ServiceConfig(min_idle=2, max_total=6, acquire_timeout_s=5.0,
                                              max_snapshot_bytes=3 << 20)).start()
    yield s
    s.close()


def _settle(svc: SandboxService, sessions: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        st = svc.pool_status()
        if st.sessions == sessions and st.busy == sessions and len(svc.backend.ids()) == st.idle + st.busy:
            return
        time.sleep(0.05)
    raise AssertionError(svc.pool_status())


def test_stored_snapshots_are_bounded_in_bytes(svc):
    sb = svc.create(files={"big.bin": os.urandom(1 << 20)})  # incompressible: the tar holds ~1 MiB
    taken = []
    with pytest.raises(ToolRefused, match=r"bound is 3145728 bytes"):
        for _ in range(10):
            taken.append(svc.snapshot(sb.id))
    assert len(taken) == 2  # 2 x ~1 MiB fit under 3 MiB, the third does not
    assert sum(s.size_bytes for s in taken) <= svc.config.max_snapshot_bytes
    assert svc.pool_status().snapshots == 2
    svc.delete_snapshot(taken[0].id)
    svc.snapshot(sb.id)  # room again after a delete
    svc.delete(sb.id)


def test_a_dead_idle_sandbox_is_never_handed_out(svc):
    _settle(svc, 0)
    idle = list(svc.backend.ids())
    assert idle
    for sid in idle:  # kill every idle sandbox behind the pool's back
        if svc.backend.name == "docker":
            svc.backend.container(sid).kill()
        else:
            os.killpg(svc.backend.pid(sid), 9)
    sb = svc.create()
    first = svc.exec(sb.id, "head", {"path": "notes.txt", "lines": 1})
    assert first.status == "ok" and first.stdout == "alpha\n"
    svc.delete(sb.id)
    _settle(svc, 0)


def test_an_abandoned_request_keeps_nothing(svc):
    token = CancelToken()
    assert token.set()
    with pytest.raises(ServiceUnavailable, match="abandoned"):
        svc.create(files={"q.txt": b"x"}, cancel=token)
    parent = svc.create(files={"q.txt": b"x"})
    for call in (lambda t: svc.fork(parent.id, 3, cancel=t),
                 lambda t: svc.clone(svc.snapshot(parent.id).id, 2, cancel=t)):
        token = CancelToken()
        token.set()
        with pytest.raises(ServiceUnavailable):
            call(token)
    _settle(svc, 1)
    assert [s.id for s in svc.list()] == [parent.id]
    # a claimed token cannot be abandoned any more: the handler must then wait for the result
    token = CancelToken()
    kids = svc.fork(parent.id, 1, cancel=token)
    assert not token.set() and len(kids) == 1
    for s in [parent, *kids]:
        svc.delete(s.id)
    _settle(svc, 0)
