"""Docker-only checks: container hardening, the image's corpus, orphan removal after a SIGKILL, compose."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from sandbox_server.client import SandboxClient
from tests.docker_support import ROOT, SERVER_NAME, free_port, leftover_containers, require_docker


def test_containers_are_hardened(docker_service):
    sb = docker_service.create()
    try:
        c = docker_service.backend.container(docker_service._session(sb.id).sid)
        c.reload()
        hc, cfg = c.attrs["HostConfig"], c.attrs["Config"]
        assert hc["ReadonlyRootfs"] and hc["NetworkMode"] == "none" and hc["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in hc["SecurityOpt"] and hc["PidsLimit"] > 0 and hc["Memory"] > 0
        assert hc["NanoCpus"] > 0 and set(hc["Tmpfs"]) == {"/scratch", "/tmp"} and hc["Init"]
        assert cfg["User"] == "1000:1000" and cfg["Labels"]["forkyard.sandbox"] == SERVER_NAME
        r = docker_service.exec_argv(sb.id, ["sh", "-c", "id -u; touch /data/x /x 2>&1; cat /proc/net/dev | wc -l"])
        lines = r.stdout.splitlines()
        assert lines[0] == "1000" and "Read-only" in r.stdout and lines[-1] == "3"  # header + lo only
    finally:
        docker_service.delete(sb.id)


def test_the_image_holds_the_corpus():
    require_docker()
    from sandbox_server.backends import DockerBackend

    b = DockerBackend(server_name=SERVER_NAME)  # no bind mount: the image's own /data
    try:
        sid = b.create()
        man = json.loads(b.exec(sid, ["cat", "/data/MANIFEST.json"]).stdout)
        assert len(man["files"]) >= 40 and not man["missing"]
        size = man["files"]["Lib/textwrap.py"]["size"]
        assert int(b.exec(sid, ["wc", "-c", "/data/Lib/textwrap.py"]).stdout.split()[0]) == size
        assert "Read-only" in b.exec(sid, ["touch", "/data/x"]).stderr
    finally:
        b.close()


def _server(port: int, name: str) -> subprocess.Popen:
    env = {**os.environ, "FORKYARD_SERVER_NAME": name, "FORKYARD_MIN_IDLE": "2", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "sandbox_server", "--backend", "docker", "--port", str(port),
                             "--log-level", "warning"], env=env, cwd=ROOT)


def _wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "server exited"
        try:
            if httpx.get(f"{url}/v1/pool", timeout=2).json()["idle"] >= 2:
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    raise AssertionError("server did not become ready")


def test_sigkilled_server_leaks_nothing_after_restart():
    require_docker()
    name, port = f"{SERVER_NAME}-kill", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _server(port, name)
    try:
        _wait_healthy(url, proc)
        with SandboxClient(url) as c:
            c.create()
            deadline = time.monotonic() + 30
            while c.pool_status().idle < 2 and time.monotonic() < deadline:  # the pool refills
                time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        before = leftover_containers(name)
        assert len(before) >= 3  # 2 idle + 1 busy left behind by the killed server
        proc = _server(port, name)
        _wait_healthy(url, proc)
        after = leftover_containers(name)
        assert not set(before) & set(after) and len(after) == 2  # old ones removed, a fresh warm pool
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        left = leftover_containers(name)
        _remove_by_label(name)
    assert left == []


def _remove_by_label(name: str) -> None:
    import docker

    c = docker.from_env()
    for ct in c.containers.list(all=True, sparse=True, filters={"label": f"forkyard.sandbox={name}"}):
        ct.remove(force=True)
    c.close()


@pytest.mark.slow
def test_compose_up_serves_the_api(monkeypatch):
    """compose with an API key: published on loopback only, 401 without the key, every client with it."""
    require_docker()
    name, port, key = f"{SERVER_NAME}-compose", free_port(), "compose-test-key-0123456789"
    env = {**os.environ, "FORKYARD_PORT": str(port), "FORKYARD_SERVER_NAME": name,
           "COMPOSE_PROJECT_NAME": f"forkyard-{name}", "PYTHON": sys.executable, "FORKYARD_API_KEY": key}
    up = subprocess.run([str(ROOT / "scripts" / "compose-up.sh")], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=400)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        published = subprocess.run(["docker", "compose", "port", "server", "8000"], cwd=ROOT, env=env,
                                   capture_output=True, text=True, timeout=60).stdout.strip()
        assert published == f"127.0.0.1:{port}", published  # the host's loopback only
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/v1/pool").status_code == 401
        monkeypatch.setenv("FORKYARD_API_KEY", key)  # what every client reads
        with SandboxClient(f"http://127.0.0.1:{port}") as c:
            assert c.health().status == "ok" and c.pool_status().backend == "docker"
            sb = c.create(files={"q.txt": b"hello"})
            assert c.exec(sb.id, "cat", {"path": "/scratch/q.txt"}).stdout == "hello"
            assert "def dedent" in c.exec(sb.id, "grep", {"pattern": "def dedent", "path": "Lib"}).stdout
            assert len(c.fork(sb.id, 2)) == 2
        # The same server hosts env sessions; FileQA runs on its docker pool, the trainer drives it remotely.
        import gymnasium as gym

        import envs  # noqa: F401
        from trainer.tabular_config import TrainConfig
        from trainer.train import train

        remote = gym.make("forkyard/FileQA-v0", server_url=f"http://127.0.0.1:{port}", kinds=["log_errors"]).unwrapped
        obs, info = remote.reset(seed=1)
        out, *_ = remote.step(info["legal_actions"][0])
        assert " ERROR " in out and "/scratch/app.log" in obs
        kid = remote.fork(1)[0]
        kid_out = kid.step(info["legal_actions"][0])[0]
        assert kid_out.splitlines()[1:-1] == out.splitlines()[1:-1]  # same scratch file in the forked sandbox
        kid.close()
        remote.close()
        result = train(TrainConfig(env_id="forkyard/FileQA-v0", env_kwargs={"max_turns": 3}, estimator="tree",
                                   n_base=2, branches=2, iterations=2, eval_episodes=4, device="cpu",
                                   server_url=f"http://127.0.0.1:{port}"))
        assert all(m["infra_failures"] == 0 and m["env_calls"] > 0 for m in result.metrics)
    finally:
        down = subprocess.run(["docker", "compose", "down", "-t", "10"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert down.returncode == 0, down.stderr[-2000:]
    assert leftover_containers(name) == []
