"""The app mounted inside another ASGI app (field case S49): without its lifespan it refuses every request at
once with a message that says how to run it (never a half-started server: no reaper, no sandbox backend);
with the parent running its lifespan it works as it does served directly (real uvicorn on loopback: files
uploaded past the small-body limit, env sessions stepped and forked, the OpenEnv WebSocket, /healthz open
without the key, the key required elsewhere, the sandboxes closed when the parent stops)."""

from __future__ import annotations

import base64
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI
from websockets.sync.client import connect

import envs  # noqa: F401 - registers the forkyard ids
from envs.api_key import KEY_FILE_VAR, KEY_VAR
from sandbox_server.app import create_app
from sandbox_server.http_contract import SMALL_BODY_BYTES
from sandbox_server.settings import ServiceConfig
from tests.docker_support import UvicornThread, require_bwrap

KEY = "fy-test-0123456789abcdef"
CLUE = "forkyard/ClueProbe-v0"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(autouse=True)
def no_key_in_env(monkeypatch):
    monkeypatch.delenv(KEY_VAR, raising=False)
    monkeypatch.delenv(KEY_FILE_VAR, raising=False)


def parent_app(fy: FastAPI, run_lifespan: bool) -> FastAPI:
    """A user's app with forkyard under ``/fy``, running forkyard's lifespan inside its own when told to."""

    @asynccontextmanager
    async def lifespan(_parent: FastAPI):
        async with fy.router.lifespan_context(fy):
            yield

    parent = FastAPI(lifespan=lifespan if run_lifespan else None)

    @parent.get("/hello")
    def hello() -> dict:
        return {"hello": "world"}

    parent.mount("/fy", fy)
    return parent


def test_mounted_without_its_lifespan_it_refuses_at_once_and_says_how():
    srv = UvicornThread(parent_app(create_app(config=ServiceConfig(), sandboxes=False, api_key=None), False)).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            assert http.get("/hello").json() == {"hello": "world"}  # the parent's own routes are untouched
            for method, path in (("GET", "/fy/healthz"), ("POST", "/fy/v1/envs"), ("GET", "/fy/v1/envs"),
                                 ("GET", "/fy/metrics")):
                r = http.request(method, path, json={"env_id": CLUE})
                assert r.status_code == 500, (path, r.text)
                assert r.json()["status"] == "not_started"
                assert "lifespan" in r.json()["detail"] and "lifespan_context" in r.json()["detail"]
        ws = srv.url.replace("http", "ws") + f"/fy/openenv/{CLUE}/ws"
        from websockets.exceptions import InvalidStatus

        with pytest.raises(InvalidStatus) as err:
            connect(ws, open_timeout=10)
        assert err.value.response.status_code == 500 and b"lifespan" in err.value.response.body
    finally:
        srv.stop()


def test_mounted_with_its_lifespan_it_works_as_served_directly():
    require_bwrap()
    fy = create_app("local", ServiceConfig(min_idle=0, max_total=2), warm=False, api_key=KEY)
    srv = UvicornThread(parent_app(fy, True)).start()
    try:
        with httpx.Client(base_url=srv.url + "/fy", timeout=60) as http:
            assert http.get("/healthz").json()["status"] == "ok"  # open without the key, as served directly
            assert http.get("/v1/envs").status_code == 401
            payload = b"y" * (2 * SMALL_BODY_BYTES)  # over the small-body limit: a creation with files takes it
            sid = http.post("/v1/sandboxes", headers=AUTH,
                            json={"files": {"big.txt": base64.b64encode(payload).decode()}, "encoding": "base64"})
            assert sid.status_code == 201, sid.text
            sandbox = sid.json()["id"]
            call = http.post(f"/v1/sandboxes/{sandbox}/exec", headers=AUTH,
                             json={"tool": "wc", "args": {"path": "/scratch/big.txt"}})
            assert call.status_code == 200 and str(len(payload)) in call.json()["stdout"], call.text
            env = http.post("/v1/envs", json={"env_id": CLUE}, headers=AUTH).json()["session_id"]
            http.post(f"/v1/envs/{env}/reset", json={"seed": 0}, headers=AUTH).raise_for_status()
            step = http.post(f"/v1/envs/{env}/step", json={"action": "probe(0)"}, headers=AUTH)
            assert step.status_code == 200 and "Turn 2 of" in step.json()["observation"], step.text
            assert "forkyard_" in http.get("/metrics", headers=AUTH).text
        with connect(srv.url.replace("http", "ws") + f"/fy/openenv/{CLUE}/ws", additional_headers=AUTH,
                     open_timeout=10) as sock:
            sock.send('{"type": "reset", "data": {"seed": 0}}')
            assert '"observation"' in sock.recv(timeout=10)
        service = fy.state.service
        assert service is not None
    finally:
        srv.stop()
    assert service._stop.is_set() and service.list() == []  # the parent's stop ran forkyard's clean-up
