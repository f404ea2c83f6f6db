"""The backend a server is started with is the backend of every sandbox it serves, env sessions included
(field case S29): the server is started exactly as the README writes it."""

from __future__ import annotations

import os

import httpx

from tests.docker_support import SERVER_NAME, leftover_containers, require_docker
from tests.test_reliability import ServerProcess


def _children(pid: int) -> list[str]:
    """Command lines of every process whose parent is ``pid`` (read from /proc)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    out.append(f.read().replace(b"\x00", b" ").decode())
        except (OSError, ValueError, IndexError):
            pass
    return out


def test_docker_server_runs_fileqa_sessions_in_containers():
    """``python -m sandbox_server --backend docker`` with no FORKYARD_BACKEND in the environment."""
    require_docker()
    srv = ServerProcess(f"{SERVER_NAME}-s29", FORKYARD_MIN_IDLE="1", FORKYARD_MAX_TOTAL="2")
    try:
        srv.wait_idle(1)
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            r = http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "kwargs": {"kinds": ["log_errors"]},
                                            "seed": 1})
            assert r.status_code == 201, r.text
            sid = r.json()["session_id"]
            step = http.post(f"/v1/envs/{sid}/step", json={"action": "cat('/scratch/nope.txt')"}).json()
            assert "/scratch/nope.txt" in step["observation"]
            assert "/.cache" not in step["observation"] and "/root" not in step["observation"]
            pool = srv.pool()
            assert pool["backend"] == "docker" and pool["busy"] == 1  # the session's sandbox is a container
            assert not [c for c in _children(srv.proc.pid) if "agent.py" in c]  # no host agent process
            # a pool of two: the second session takes the last container, the third gets a 503, never a 500
            r2 = http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "kwargs": {"kinds": ["log_errors"]}})
            assert r2.status_code == 201, r2.text
            r3 = http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "kwargs": {"kinds": ["log_errors"]}})
            assert r3.status_code == 503 and int(r3.headers["retry-after"]) >= 1, r3.text
            # a client cannot pick another backend for its session on this server
            r4 = http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "kwargs": {"backend": "local"}})
            assert r4.status_code == 422, r4.text
            for s in (sid, r2.json()["session_id"]):
                assert http.delete(f"/v1/envs/{s}").status_code == 204
    finally:
        srv.stop()
    assert leftover_containers(srv.name) == []
