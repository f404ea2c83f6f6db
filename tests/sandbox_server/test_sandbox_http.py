"""The HTTP API on a real uvicorn on loopback, through the sync and async clients (both backends)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from sandbox_server.app import create_app
from sandbox_server.backends import DockerBackend, LocalBackend
from sandbox_server.client import AsyncSandboxClient, SandboxClient
from sandbox_server.errors import LimitExceeded, SandboxNotFound, ServiceUnavailable, ToolRefused
from sandbox_server.service import MAX_WRITE_BYTES, SandboxService, ServiceConfig
from tests.docker_support import SERVER_NAME, UvicornThread, require_bwrap, require_docker


@pytest.fixture(scope="module", params=["local", "docker"])
def server(request, fixture_data):
    """A uvicorn server per backend, over its own service (so pool limits and metrics are its own)."""
    if request.param == "docker":
        require_docker()
        backend = DockerBackend(server_name=f"{SERVER_NAME}-http", data_dir=fixture_data)
    else:
        require_bwrap()
        backend = LocalBackend(fixture_data, server_name=f"{SERVER_NAME}-http")
    svc = SandboxService(backend, ServiceConfig(min_idle=3, max_total=8, default_timeout_s=5, max_timeout_s=10,
                                                acquire_timeout_s=2.0))
    srv = UvicornThread(create_app(service=svc)).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    with SandboxClient(server.url) as c:
        yield c


def test_round_trip_with_the_sync_client(client):
    assert client.health().status == "ok"
    names = {t.name: t.params for t in client.tools()}
    assert names["grep"][:2] == ["pattern", "path"]
    sb = client.create(files={"q.txt": b"question"}, metadata={"task": 1})
    try:
        r = client.exec(sb.id, "cat", {"path": "/scratch/q.txt"})
        assert r.status == "ok" and r.stdout == "question" and r.duration_s > 0
        assert client.exec(sb.id, "head", {"path": "notes.txt", "lines": 1}).stdout == "alpha\n"
        client.write_files(sb.id, {"b.bin": b"\xff\x00"})
        assert client.exec(sb.id, "cat", {"path": "/scratch/b.bin"}).stdout == "\ufffd\x00"
        assert client.update_state(sb.id, cwd="/scratch").state.cwd == "/scratch"
        assert client.exec(sb.id, "cat", {"path": "q.txt"}).stdout == "question"
        snap = client.snapshot(sb.id)
        assert client.get_snapshot(snap.id).size_bytes == snap.size_bytes
        clones = client.clone(snap.id, 2)
        kids = client.fork(sb.id, 2)
        for c in clones + kids:
            assert client.exec(c.id, "cat", {"path": "q.txt"}).stdout == "question"
            assert client.get(c.id).state.metadata == {"task": 1}
            client.delete(c.id)
        client.write_files(sb.id, {"q.txt": b"changed", "later.txt": b"x"})
        back = client.rollback(sb.id, snap.id)  # in place, to the snapshot's files and state
        assert back.id == sb.id and back.state.cwd == "/scratch"
        assert client.exec(sb.id, "cat", {"path": "q.txt"}).stdout == "question"
        assert client.exec(sb.id, "ls", {"path": "/scratch"}).stdout == "b.bin\nq.txt\n"
        workspace = client.create(cwd="/scratch", families=["workspace"])
        assert client.get(workspace.id).state.families == ["workspace"]
        assert client.exec(workspace.id, "write_file", {"path": "w.txt", "text": "hi"}).exit_code == 0
        client.delete(workspace.id)
        live = client.create(cwd="/scratch", families=["interpreter"])  # the live interpreter over HTTP
        assert client.exec(live.id, "run_cell", {"code": "seen = ['kept']"}).exit_code == 0
        mark = client.snapshot(live.id)
        client.exec(live.id, "run_cell", {"code": "seen.append('later')"})
        client.rollback(live.id, mark.id)
        assert client.exec(live.id, "run_cell", {"code": "seen"}).stdout == "['kept']\n"
        client.delete(live.id)
        client.delete_snapshot(mark.id)
        client.delete_snapshot(snap.id)
        assert client.pool_status().max_total == 8
    finally:
        client.delete(sb.id)
    with pytest.raises(SandboxNotFound):
        client.get(sb.id)


@pytest.mark.parametrize("body,words", [
    ({"tool": "cat", "args": {"path": "../../etc/passwd"}}, ".."),
    ({"tool": "cat", "args": {"path": "link"}}, "symbolic link"),
    ({"tool": "rm", "args": {"path": "x"}}, "unknown tool"),
    ({"tool": "find", "args": {"exec": "touch /tmp/pwned {} ;"}}, "no argument"),
    ({"tool": "cat", "args": {"path": "a.txt"}, "timeout_s": -1}, "positive"),
    ({"tool": "cat", "args": {"path": "a\u0000b"}}, "NUL"),
    ({"tool": 5}, ""),
    ({"args": {}}, ""),
])
def test_bad_calls_are_422_never_500(server, client, body, words):
    sb = client.create()
    try:
        resp = httpx.post(f"{server.url}/v1/sandboxes/{sb.id}/exec", json=body, timeout=30)
        assert resp.status_code == 422, resp.text
        assert set(resp.json()) == {"detail", "status"} and isinstance(resp.json()["detail"], str)  # one shape
        assert words in resp.json()["detail"]
    finally:
        client.delete(sb.id)


def test_malformed_requests(server, client):
    assert httpx.post(f"{server.url}/v1/sandboxes/nope/exec", json={"tool": "ls"}).status_code == 404
    assert httpx.post(f"{server.url}/v1/sandboxes", content=b"{not json",
                      headers={"content-type": "application/json"}).status_code == 422
    assert httpx.post(f"{server.url}/v1/snapshots/nope/clone", json={"n": 1}).status_code == 404
    sb = client.create()
    try:
        assert httpx.post(f"{server.url}/v1/sandboxes/{sb.id}/fork", json={"n": 0}).status_code == 422
        assert httpx.post(f"{server.url}/v1/sandboxes/{sb.id}/fork", json={"n": 10_000}).status_code == 422
        assert httpx.post(f"{server.url}/v1/sandboxes/{sb.id}/fork", json={"n": True}).status_code == 422
        assert httpx.put(f"{server.url}/v1/sandboxes/{sb.id}/files",
                         json={"files": {"x": "!!"}, "encoding": "base64"}).status_code == 422
        with pytest.raises(ToolRefused):
            client.write_files(sb.id, {"/abs": b"x"})
        with pytest.raises(LimitExceeded):  # 413 from the service's limit, named in the message
            client.write_files(sb.id, {"big.bin": b"x" * (MAX_WRITE_BYTES + 1)})
        assert client.exec(sb.id, "ls", {"path": "/scratch"}).stdout == ""  # nothing of it was kept
    finally:
        client.delete(sb.id)


def test_pool_exhausted_is_503_with_retry_after(server, client):
    held = []
    # a retry budget of 1 s, not the default 30: the client still waits what Retry-After says and gives up with
    # the 503 (the retry policy's own tests: tests/envs/test_client_retry.py)
    impatient = SandboxClient(server.url, busy_timeout_s=1.0)
    try:
        with pytest.raises(ServiceUnavailable) as exc:
            for _ in range(9):
                held.append(impatient.create())
        assert len(held) == 8 and exc.value.retry_after_s >= 1
        resp = httpx.post(f"{server.url}/v1/sandboxes", json={}, timeout=30)
        assert resp.status_code == 503 and "Retry-After" in resp.headers and "in use" in resp.json()["detail"]
    finally:
        impatient.close()
        for sb in held:
            client.delete(sb.id)


def test_metrics_and_openapi(server, client):
    sb = client.create()
    with pytest.raises(ToolRefused):
        client.exec(sb.id, "cat", {"path": "/etc/passwd"})
    client.exec(sb.id, "ls", {})
    client.delete(sb.id)
    text = httpx.get(f"{server.url}/metrics").text
    for name in ("forkyard_pool_idle", "forkyard_acquire_seconds_bucket", "forkyard_exec_seconds_bucket",
                 "forkyard_fork_seconds", "forkyard_timeouts_total", "forkyard_rejected_calls_total"):
        assert name in text
    assert httpx.get(f"{server.url}/metrics").headers["content-type"].startswith("text/plain")
    paths = httpx.get(f"{server.url}/openapi.json").json()["paths"]
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    for p in ("/v1/sandboxes", "/v1/sandboxes/{sandbox_id}/exec", "/v1/sandboxes/{sandbox_id}/fork",
              "/v1/snapshots/{snapshot_id}/clone", "/v1/tools", "/v1/pool", "/healthz", "/metrics"):
        assert p in paths


def test_async_client_concurrent_calls(server):
    async def main():
        async with AsyncSandboxClient(server.url) as c:
            sbs = await asyncio.gather(*[c.create() for _ in range(3)])
            results = await asyncio.gather(*[c.exec(s.id, "grep", {"pattern": "needle", "path": "sub"}) for s in sbs])
            timeout = await c.exec(sbs[0].id, "cat", {"path": "fifo"}, timeout_s=1)
            after = await c.exec(sbs[0].id, "cat", {"path": "a.txt"})
            kids = await c.fork(sbs[1].id, 2)
            await asyncio.gather(*[c.delete(s.id) for s in sbs + kids])
            return results, timeout, after

    results, timeout, after = asyncio.run(main())
    assert all(r.stdout == "sub/deep/file.txt:1:deep needle\n" for r in results)
    assert timeout.status == "timeout" and after.stdout == "apple\n"


def test_engine_down_is_503_not_a_hang():
    import os

    old = os.environ.get("DOCKER_HOST")
    os.environ["FORKYARD_BACKEND"], os.environ["DOCKER_HOST"] = "docker", "unix:///nonexistent/docker.sock"
    try:  # the settings are read once, by create_app; the engine is tried as the app starts
        app = create_app(backend=None, config=ServiceConfig(min_idle=0))
        srv = UvicornThread(app).start()
    finally:
        os.environ.pop("FORKYARD_BACKEND")
        os.environ.pop("DOCKER_HOST") if old is None else os.environ.__setitem__("DOCKER_HOST", old)
    try:
        assert httpx.get(f"{srv.url}/healthz").json()["status"] == "degraded"
        resp = httpx.post(f"{srv.url}/v1/sandboxes", json={}, timeout=10)
        assert resp.status_code == 503 and resp.headers["Retry-After"] and "Docker engine" in resp.json()["detail"]
    finally:
        srv.stop()
