"""No web page drives a forkyard server (sandbox_server/web_guard.py; field cases S46, S47): real servers on
loopback, keyed and keyless, full and env-only, asked by every documented route and the OpenEnv WebSocket with
foreign ``Host`` and ``Origin`` headers (refused 403 before anything runs), with loopback, own and listed ones
(served), and by the clients, which send no ``Origin`` (served)."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

import envs  # noqa: F401 - registers the forkyard ids
from envs.api_key import KEY_FILE_VAR, KEY_VAR
from envs.remote import RemoteEnv
from sandbox_server.app import create_app
from sandbox_server.settings import ServerSettings, ServiceConfig
from sandbox_server.web_guard import WebGuard, split_host
from tests.docker_support import ROOT, UvicornThread, require_bwrap

KEY = "fy-test-0123456789abcdef"
CLUE = "forkyard/ClueProbe-v0"
FOREIGN_HOSTS = ["attacker.example", "127.0.0.1.nip.io", "localhost.attacker.example", "10.0.0.1", "0.0.0.0",
                 "[2001:db8::1]", "xn--80ak6aa92e.com", "localhostx"]
FOREIGN_ORIGINS = ["https://attacker.example", "null", "http://attacker.example:{port}", "file://",
                   "chrome-extension://abcdef", "http://127.0.0.1.nip.io:{port}", "https://localhost.evil.example",
                   "http://[::ffff:7f00:1]x", "not an origin"]


@pytest.fixture(autouse=True)
def no_key_in_env(monkeypatch):
    monkeypatch.delenv(KEY_VAR, raising=False)
    monkeypatch.delenv(KEY_FILE_VAR, raising=False)


@pytest.fixture(scope="module", params=["full-keyless", "env-only-keyed"])
def server(request):
    """A keyless full server (local sandbox pool) and an env-only server that requires ``KEY``."""
    if request.param == "full-keyless":
        require_bwrap()
        app = create_app("local", ServiceConfig(min_idle=0, max_total=2), warm=False, api_key=None,
                         settings=ServerSettings())
        srv = UvicornThread(app).start()
        srv.headers = {}
    else:
        app = create_app(config=ServiceConfig(), sandboxes=False, api_key=KEY, settings=ServerSettings())
        srv = UvicornThread(app).start()
        srv.headers = {"Authorization": f"Bearer {KEY}"}
    yield srv
    srv.stop()


def every_route(app) -> list[tuple[str, str]]:
    """(method, concrete path) of every documented route, path parameters filled with ``x``."""
    out = [(m.upper(), re.sub(r"\{[^}]+\}", "x", p)) for p, ops in app.openapi()["paths"].items() for m in ops]
    return out + [("GET", "/docs"), ("GET", "/openapi.json"), ("GET", "/metrics"), ("GET", "/no/such/route")]


def test_a_foreign_host_is_refused_on_every_route(server):
    port = server.port
    with httpx.Client(base_url=server.url, timeout=30, headers=server.headers) as http:
        for method, path in every_route(server.server.config.app):
            for name in ("attacker.example", "127.0.0.1.nip.io"):
                r = http.request(method, path, headers={"Host": f"{name}:{port}"}, content=b'{"items": []}')
                assert r.status_code == 403, (method, path, name, r.status_code, r.text)
                assert r.json()["status"] == "forbidden" and "DNS rebinding" in r.json()["detail"]
        for host in FOREIGN_HOSTS:
            r = http.get("/v1/envs", headers={"Host": f"{host}:{port}"})
            assert r.status_code == 403, host
        for host in ("localhost", "LOCALHOST", "127.0.0.1", "127.1.2.3", "[::1]", "app.localhost", "localhost."):
            r = http.get("/v1/envs", headers={"Host": f"{host}:{port}"})
            assert r.status_code == 200, (host, r.text)
        assert http.get("/v1/envs", headers={"Host": "a b"}).json()["status"] == "forbidden"  # malformed


def test_a_foreign_origin_is_refused_and_nothing_runs(server):
    port = server.port
    with httpx.Client(base_url=server.url, timeout=30, headers=server.headers) as http:
        before = http.get("/v1/envs").json()
        for origin in FOREIGN_ORIGINS:
            origin = origin.format(port=port)
            r = http.post("/v1/envs", json={"env_id": CLUE}, headers={"Origin": origin})
            assert r.status_code == 403, (origin, r.text)
            assert r.json()["status"] == "forbidden"
        assert http.get("/v1/envs").json() == before  # no session was made
        for origin in (server.url, f"http://localhost:{port}", "http://localhost:3000", "http://[::1]:8080",
                       "https://app.localhost"):
            r = http.post("/v1/envs", json={"env_id": CLUE}, headers={"Origin": origin})
            assert r.status_code == 201, (origin, r.text)
            assert http.delete(f"/v1/envs/{r.json()['session_id']}").status_code == 204


def test_the_websocket_handshake_checks_origin_and_host(server):
    ws = server.url.replace("http", "ws") + f"/openenv/{CLUE}/ws"
    for origin in ("https://attacker.example", "null", f"http://attacker.example:{server.port}"):
        with pytest.raises(InvalidStatus) as err:
            connect(ws, origin=origin, additional_headers=server.headers, open_timeout=10)
        assert err.value.response.status_code == 403
        assert b"forbidden" in err.value.response.body
    with pytest.raises(InvalidStatus) as err:  # a rebound name, even with its own origin
        connect(ws, additional_headers={**server.headers, "Host": f"attacker.example:{server.port}"},
                origin=f"http://attacker.example:{server.port}", open_timeout=10)
    assert err.value.response.status_code == 403
    for origin in (None, "http://localhost:5173", server.url):  # no Origin (clients), loopback, its own
        with connect(ws, origin=origin, additional_headers=server.headers, open_timeout=10) as sock:
            sock.send('{"type": "reset", "data": {"seed": 0}}')
            assert '"observation"' in sock.recv(timeout=10)


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_clients_send_no_origin_and_are_served(server, transport):
    key = KEY if server.headers else None
    env = RemoteEnv(CLUE, server_url=server.url, transport=transport, api_key=key)
    try:
        obs, _ = env.reset(seed=0)
        assert "Turn 1 of" in obs
    finally:
        env.close()


def test_the_operator_lists_hosts_and_origins():
    app = create_app(config=ServiceConfig(), sandboxes=False, api_key=None,
                     settings=ServerSettings(allowed_hosts="forkyard.internal,*.lab.example",
                                             allowed_origins="https://app.example.com"))
    srv = UvicornThread(app).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            for host, status in (("forkyard.internal", 200), ("gpu1.lab.example", 200), ("lab.example.evil", 403),
                                 ("attacker.example", 403), ("localhost", 200)):
                assert http.get("/v1/envs", headers={"Host": f"{host}:{srv.port}"}).status_code == status, host
            for origin, status in (("https://app.example.com", 201), ("https://app.example.com:443", 201),
                                   ("http://app.example.com", 403), ("https://app.example.com:8443", 403)):
                r = http.post("/v1/envs", json={"env_id": CLUE}, headers={"Origin": origin})
                assert r.status_code == status, (origin, r.text)
        ws = srv.url.replace("http", "ws") + f"/openenv/{CLUE}/ws"
        with connect(ws, origin="https://app.example.com", open_timeout=10) as sock:
            sock.send('{"type": "reset", "data": {"seed": 0}}')
            assert '"observation"' in sock.recv(timeout=10)
    finally:
        srv.stop()


def _scope(host: str, server_addr: str, origin: str | None = None) -> dict:
    headers = [(b"host", host.encode())] + ([(b"origin", origin.encode())] if origin else [])
    return {"type": "http", "headers": headers, "server": (server_addr, 8000), "scheme": "http"}


def test_beyond_loopback_the_operator_list_is_the_rule():
    """A connection that arrived on another address (a LAN or container address): no Host check unless a list
    is set; the Origin check stays."""
    open_guard, listed = WebGuard(), WebGuard(allowed_hosts=["forkyard.example"])
    assert open_guard.refusal(_scope("anything.example:8000", "10.1.2.3")) is None
    assert open_guard.refusal(_scope("anything.example:8000", "127.0.0.1")) is not None
    assert listed.refusal(_scope("forkyard.example:8000", "10.1.2.3")) is None
    assert "FORKYARD_ALLOWED_HOSTS" in listed.refusal(_scope("other.example", "10.1.2.3"))
    assert open_guard.refusal(_scope("forkyard.example", "10.1.2.3", "https://attacker.example")) is not None
    assert open_guard.refusal(_scope("forkyard.example", "10.1.2.3", "http://forkyard.example")) is None
    assert open_guard.refusal(_scope("[::1]:8000", "::1")) is None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_host_header_is_read_or_refused_never_raised(value):
    guard = WebGuard()
    why = guard.refusal(_scope(value, "127.0.0.1", value))
    parsed = split_host(value)
    if parsed is not None and parsed[0] not in ("localhost",) and not parsed[0].endswith(".localhost"):
        try:
            import ipaddress

            loop = ipaddress.ip_address(parsed[0]).is_loopback
        except ValueError:
            loop = False
        if not loop:
            assert why is not None


def test_a_bad_origin_list_is_refused_at_start_naming_the_flag():
    run = subprocess.run([sys.executable, "-m", "sandbox_server", "--no-sandboxes", "--allowed-origins",
                          "https://ok.example,attacker"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "--allowed-origins / FORKYARD_ALLOWED_ORIGINS" in run.stderr and "attacker" in run.stderr
