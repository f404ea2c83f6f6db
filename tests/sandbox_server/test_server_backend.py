"""The backend a server is started with is the backend of every sandbox it serves, env sessions included
(field case S29): the server is started exactly as the README writes it."""

from __future__ import annotations

import os

import httpx

from tests.docker_support import (
    ROOT, SERVER_NAME, ServerProcess, fake_bin, free_port, leftover_containers, require_docker,
)


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
            assert not [c for c in _children(srv.proc.pid) if "agent.pyz" in c]  # no host agent process
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


def test_local_server_refuses_to_start_without_isolation_unless_told_it_is_unsafe(tmp_path):
    """No bubblewrap on PATH: ``python -m sandbox_server`` exits 2 saying how to install it; with
    ``--unsafe-no-isolation`` it serves; ``--unsafe-no-isolation`` with docker is an error."""
    import subprocess
    import sys
    import time

    env = {k: v for k, v in os.environ.items() if k != "FORKYARD_BACKEND"}
    env.update(PATH=fake_bin(tmp_path, None), PYTHONPATH=str(ROOT), FORKYARD_SERVER_NAME=f"{SERVER_NAME}-nobwrap")
    port = free_port()
    cmd = [sys.executable, "-m", "sandbox_server", "--port", str(port), "--log-level", "warning"]
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "apt-get install bubblewrap" in r.stderr, r.stderr
    proc = subprocess.Popen(cmd + ["--unsafe-no-isolation"], env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert health["backend"] == "local"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            sb = http.post("/v1/sandboxes").json()["id"]
            r = http.post(f"/v1/sandboxes/{sb}/exec", json={"tool": "ls", "args": {"path": "/data"}})
            assert r.status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
    bad = subprocess.run(cmd[:-2] + ["--backend", "docker", "--unsafe-no-isolation"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "local backend only" in bad.stderr
