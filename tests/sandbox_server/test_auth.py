"""The API key on every route and transport (sandbox_server/auth.py, envs/api_key.py): a real server on loopback
with a key, every documented route and the OpenEnv WebSocket tried with a missing, a wrong and the right key,
and every client (RemoteEnv over HTTP and WebSocket, RemoteVectorEnv, SandboxClient, AsyncSandboxClient,
ForkyardEnvClient, OpenEnv's own GenericEnvClient) reaching it from FORKYARD_API_KEY or an explicit key."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import shutil
import subprocess
import sys
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

import envs  # noqa: F401 - registers the forkyard ids
from envs.api_key import KEY_FILE_VAR, KEY_VAR, api_key, check_key
from envs.remote import RemoteEnv
from envs.remote_vector import RemoteVectorEnv
from sandbox_server.app import create_app, create_env_app
from sandbox_server.client import AsyncSandboxClient, SandboxClient
from sandbox_server.settings import ServiceConfig
from tests.docker_support import ROOT, UvicornThread, free_port, require_bwrap

KEY = "fy-test-0123456789abcdef"
CLUE = "forkyard/ClueProbe-v0"


@pytest.fixture(scope="module")
def server():
    """A full server (local sandbox pool) that requires ``KEY``."""
    require_bwrap()
    srv = UvicornThread(create_app("local", ServiceConfig(min_idle=0, max_total=4), warm=False, api_key=KEY)).start()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def no_key_in_env(monkeypatch):
    monkeypatch.delenv(KEY_VAR, raising=False)
    monkeypatch.delenv(KEY_FILE_VAR, raising=False)


def routes(app) -> list[tuple[str, str]]:
    """(method, concrete path) of every documented route, path parameters filled with ``x``."""
    out = []
    for path, ops in app.openapi()["paths"].items():
        for method in ops:
            out.append((method.upper(), re.sub(r"\{[^}]+\}", "x", path)))
    return out


def test_every_route_but_healthz_refuses_a_missing_or_wrong_key(server):
    app = server.server.config.app
    every = routes(app) + [("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/metrics"),
                           ("GET", "/no/such/route"), ("POST", "/v1/envs/batch/step")]
    assert len(every) > 30
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for method, path in every:
            if path == "/healthz":
                continue
            for headers, word in (({}, "requires an API key"), ({"Authorization": f"Bearer {KEY}x"}, "wrong"),
                                  ({"Authorization": KEY}, "wrong"), ({"Authorization": f"Basic {KEY}"}, "wrong")):
                r = http.request(method, path, headers=headers, content=b'{"items": []}')
                assert r.status_code == 401, (method, path, headers, r.status_code, r.text)
                assert r.json()["status"] == "unauthorized" and word in r.json()["detail"]
                assert r.headers["www-authenticate"].startswith("Bearer") and KEY not in r.text
            ok = http.request(method, path, headers={"Authorization": f"Bearer {KEY}"}, content=b'{"items": []}')
            assert ok.status_code != 401, (method, path)
        assert http.get("/healthz").status_code == 200  # probes need no secret
        for method, path in (("GET", "/healthz/"), ("GET", "//v1/pool"), ("HEAD", "/v1/pool"), ("OPTIONS", "/v1/pool"),
                             ("GET", "/HEALTHZ"), ("GET", "/healthz/../v1/pool"), ("GET", "/v1/%70ool")):
            assert http.request(method, path).status_code == 401, (method, path)
        basic = base64.b64encode(f"anyone:{KEY}".encode()).decode()
        assert http.get("/v1/pool", headers={"Authorization": f"Basic {basic}"}).status_code == 200
        assert http.get("/v1/pool", headers={"Authorization": f"bearer {KEY}"}).status_code == 200


def test_a_refused_request_body_is_never_read(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:
        r = http.post("/v1/sandboxes", content=b"x" * (64 << 20))  # far over any limit: still a 401, first
        assert r.status_code == 401


def test_the_openenv_websocket_needs_the_key(server):
    ws = server.url.replace("http", "ws") + f"/openenv/{CLUE}/ws"
    for headers in ({}, {"Authorization": "Bearer nope"}):
        with pytest.raises(InvalidStatus) as err:
            connect(ws, additional_headers=headers, open_timeout=10)
        assert err.value.response.status_code == 401
    with connect(ws, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=10) as sock:
        sock.send('{"type": "reset", "data": {"seed": 0}}')
        assert '"observation"' in sock.recv(timeout=10)


def test_openenv_clients_send_the_key(server, monkeypatch):
    from openenv.core.generic_client import GenericEnvClient

    from envs.openenv_client import ForkyardEnvClient

    base = f"{server.url}/openenv/{CLUE}"
    with pytest.raises(ConnectionError, match="401"):
        with GenericEnvClient(base_url=base).sync() as env:
            env.reset(seed=0)
    with GenericEnvClient(base_url=base.replace("http://", f"http://forkyard:{KEY}@")).sync() as env:
        assert "Turn 1 of" in env.reset(seed=0).observation["text"]  # the key in the URL's user info
    with ForkyardEnvClient(base_url=base, api_key=KEY).sync() as env:
        env.reset(seed=0)
        assert len(env.fork(2)) == 2
    monkeypatch.setenv(KEY_VAR, KEY)
    with ForkyardEnvClient(base_url=base).sync() as env:  # from FORKYARD_API_KEY
        env.reset(seed=0)


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_remote_env_sends_the_key_from_the_environment_or_its_argument(server, monkeypatch, transport):
    with pytest.raises(PermissionError, match="401"):
        RemoteEnv(CLUE, server.url, transport=transport).reset(seed=0)
    with pytest.raises(PermissionError, match="401"):
        RemoteEnv(CLUE, server.url, transport=transport, api_key="wrong-key").reset(seed=0)
    env = RemoteEnv(CLUE, server.url, transport=transport, api_key=KEY)
    env.reset(seed=0)
    kid = env.fork(1)[0]
    assert kid.step("probe(0)")[4]["turn"] == 1
    kid.close()
    env.close()
    monkeypatch.setenv(KEY_VAR, KEY)
    env = RemoteEnv(CLUE, server.url, transport=transport)
    assert "Turn 1 of 5" in env.reset(seed=0)[0]
    env.close()


def test_vector_and_sandbox_clients_send_the_key(server, monkeypatch, tmp_path):
    with pytest.raises(PermissionError, match="401"):
        RemoteVectorEnv(CLUE, server.url, 2).reset(seed=0)
    vec = RemoteVectorEnv(CLUE, server.url, 2, api_key=KEY)
    obs, _ = vec.reset(seed=0)
    assert len(obs) == 2 and vec.step(["probe(0)", "probe(1)"])[0][0]
    vec.close()
    vec = RemoteVectorEnv(CLUE, server.url.replace("http://", f"http://forkyard:{KEY}@"), 1)  # as the others take it
    assert len(vec.reset(seed=0)[0]) == 1
    vec.close()
    with pytest.raises(PermissionError, match="401"):
        SandboxClient(server.url).pool_status()
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")  # as a mounted secret: a trailing newline
    monkeypatch.setenv(KEY_FILE_VAR, str(key_file))
    with SandboxClient(server.url) as c:
        sb = c.create(files={"q.txt": b"hi"})
        assert c.exec(sb.id, "cat", {"path": "/scratch/q.txt"}).stdout == "hi"
        c.delete(sb.id)

    async def go() -> int:
        async with AsyncSandboxClient(server.url, api_key=KEY) as c:
            return (await c.pool_status()).max_total

    assert asyncio.run(go()) == 4


def test_the_key_reader_refuses_what_cannot_be_a_key(tmp_path):
    assert api_key(environ={}) is None
    assert api_key(environ={KEY_VAR: KEY}) == KEY and api_key("explicit-key", environ={KEY_VAR: KEY}) == "explicit-key"
    (tmp_path / "k").write_text(f"  {KEY}\n")
    assert api_key(environ={KEY_FILE_VAR: str(tmp_path / "k")}) == KEY
    bad = {KEY_VAR: ""}, {KEY_VAR: "two words"}, {KEY_VAR: "clé"}, {KEY_VAR: KEY, KEY_FILE_VAR: "f"}, \
        {KEY_FILE_VAR: str(tmp_path / "missing")}
    for environ in bad:
        with pytest.raises(ValueError, match="FORKYARD_API_KEY") as err:
            api_key(environ=environ)
        assert "clé" not in str(err.value) and "two words" not in str(err.value)  # never echoes the value


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_check_key_accepts_exactly_visible_ascii(text):
    ok = bool(text) and all(33 <= ord(c) <= 126 for c in text)
    if ok:
        assert check_key(text, "k") == text
    else:
        with pytest.raises(ValueError):
            check_key(text, "k")


def test_apps_read_the_key_from_the_environment_and_never_show_it(monkeypatch):
    from envs.api_key import redact_url

    monkeypatch.setenv(KEY_VAR, KEY)
    app = create_env_app()
    assert KEY not in repr(app.user_middleware)
    srv = UvicornThread(app).start()
    try:
        assert httpx.post(f"{srv.url}/v1/envs", json={"env_id": CLUE}).status_code == 401
        assert httpx.post(f"{srv.url}/v1/envs", json={"env_id": CLUE},
                          headers={"Authorization": f"Bearer {KEY}"}).status_code == 201
        with pytest.raises(PermissionError) as err:
            RemoteEnv(CLUE, srv.url, api_key="not-the-key").reset(seed=0)
        assert "not-the-key" not in str(err.value) and KEY not in str(err.value)
    finally:
        srv.stop()
    assert redact_url(f"http://forkyard:{KEY}@127.0.0.1:1/x") == "http://***@127.0.0.1:1/x"


def test_an_env_server_without_a_key_stays_open():
    srv = UvicornThread(create_env_app()).start()
    try:
        assert httpx.post(f"{srv.url}/v1/envs", json={"env_id": CLUE, "seed": 0}).status_code == 201
    finally:
        srv.stop()


def _server(env: dict[str, str], *args: str, netns: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sandbox_server", "--no-sandboxes", *args]
    if netns:  # a network namespace of this test's own: listening on 0.0.0.0 there reaches no network
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
    full = {k: v for k, v in os.environ.items() if not k.startswith("FORKYARD_")}
    return subprocess.Popen(cmd, env={**full, "PYTHONPATH": str(ROOT), **env}, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_server_command_refuses_a_bad_key_and_warns_without_one_beyond_loopback(tmp_path):
    bad = _server({KEY_VAR: "has space"}, "--port", str(free_port()))
    out, err = bad.communicate(timeout=60)
    assert bad.returncode == 2 and "FORKYARD_API_KEY must be" in err and "has space" not in err
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs root, unshare and ip for a network namespace")
    proc = _server({}, "--host", "0.0.0.0", "--port", str(free_port()), netns=True)
    try:
        deadline, seen = time.monotonic() + 60, ""
        while "WARNING" not in seen and time.monotonic() < deadline and proc.poll() is None:
            seen += proc.stderr.readline()
        assert "WARNING: listening on 0.0.0.0" in seen and "FORKYARD_API_KEY" in seen
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    quiet = _server({KEY_VAR: KEY}, "--host", "0.0.0.0", "--port", str(free_port()), netns=True)
    try:
        time.sleep(3)
        assert quiet.poll() is None
    finally:
        quiet.terminate()
        _, err = quiet.communicate(timeout=30)
    assert "WARNING" not in err


def test_a_key_list_accepts_every_key_during_a_rotation(monkeypatch):
    """``FORKYARD_API_KEY=NEW,OLD`` (field case S54): the server accepts both, clients send the first, any other
    key is refused, and no key shows in the app's middleware records."""
    new, old = "fy-new-0123456789abcdef", "fy-old-0123456789abcdef"
    monkeypatch.setenv(KEY_VAR, f"{new},{old}")
    app = create_env_app()
    assert new not in repr(app.user_middleware) and old not in repr(app.user_middleware)
    srv = UvicornThread(app).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            for key, status in ((new, 200), (old, 200), (f"{new},{old}", 401), ("fy-other-0123456789abcdef", 401)):
                assert http.get("/v1/envs", headers={"Authorization": f"Bearer {key}"}).status_code == status, key
        env = RemoteEnv(CLUE, server_url=srv.url)  # from FORKYARD_API_KEY: sends NEW
        try:
            assert "Turn 1 of" in env.reset(seed=0)[0]
        finally:
            env.close()
    finally:
        srv.stop()
