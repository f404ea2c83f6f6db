"""Field case S63: every server mode says how many env sessions it holds, by env id and transport, how many
expired and how many the cap refused, in ``/healthz`` and ``/metrics``, with no session id anywhere.

Real servers on loopback (the full server over an isolated local backend, a degraded one whose Docker engine
is unreachable, and ``--no-sandboxes``), real OpenEnv WebSocket connections, and prometheus-client's own
parser reading ``/metrics``.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from sandbox_server.app import create_app, create_env_app
from sandbox_server.backends import LocalBackend
from sandbox_server.service import SandboxService, ServiceConfig
from tests.docker_support import SERVER_NAME, UvicornThread, require_bwrap

CLUE = "forkyard/ClueProbe-v0"
TTL_S = 600.0  # expiry is driven below through the store's reaper with a later ``now``, never by sleeping
CAP = 3


@pytest.fixture(params=["full", "degraded", "no-sandboxes"])
def mode_server(request, monkeypatch, fixture_data):
    """(mode, app, server) of one server mode, env TTL :data:`TTL_S`, env-session cap :data:`CAP`."""
    mode = request.param
    if mode == "full":
        require_bwrap()
        svc = SandboxService(LocalBackend(fixture_data, server_name=f"{SERVER_NAME}-census"),
                             ServiceConfig(min_idle=0, max_total=2, env_ttl_s=TTL_S, max_env_sessions=CAP))
        app = create_app(service=svc)
    elif mode == "degraded":  # the backend cannot be built when the app starts: no sandbox service at all
        monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/forkyard-census.sock")
        app = create_app(backend="docker", config=ServiceConfig(min_idle=0, env_ttl_s=TTL_S, max_env_sessions=CAP))
    else:
        app = create_env_app(ttl_s=TTL_S, max_sessions=CAP)
    srv = UvicornThread(app).start()
    yield mode, app, srv
    srv.stop()


def ask(ws, kind: str, data: dict) -> dict:
    ws.send(json.dumps({"type": kind, "data": data}))
    return json.loads(ws.recv())


def scrape(http: httpx.Client) -> tuple[str, dict[tuple[str, tuple], float]]:
    """``/metrics`` as text and as ``{(sample name, sorted labels): value}`` (prometheus-client's parser)."""
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(r.text) for s in fam.samples}
    return r.text, samples


def group(env_id: str, transport: str) -> tuple:
    return (("env_id", env_id), ("transport", transport))


def wait_open(http: httpx.Client, n: int, timeout_s: float = 10.0) -> dict:
    """The health answer once it counts ``n`` open env sessions (a connection is released after it closed)."""
    deadline = time.monotonic() + timeout_s
    while (health := http.get("/healthz").json())["env_sessions"] != n and time.monotonic() < deadline:
        time.sleep(0.02)
    return health


def test_s63_every_server_mode_counts_its_env_sessions_by_env_and_transport(mode_server):
    mode, app, srv = mode_server
    ws_url = srv.url.replace("http", "ws") + f"/openenv/{CLUE}/ws"
    with httpx.Client(base_url=srv.url, timeout=30) as http, connect(ws_url) as ws:
        held = ask(ws, "reset", {"seed": 1})
        assert held["type"] == "observation", held
        made = [http.post("/v1/envs", json={"env_id": env_id, "seed": 2})
                for env_id in (CLUE, f"envs.clueprobe:{CLUE}")]  # Gymnasium's "module:Id" form: the same env
        assert [r.status_code for r in made] == [201, 201], [r.text for r in made]
        sids = [held["data"]["observation"]["session_id"]] + [r.json()["session_id"] for r in made]
        refused = http.post("/v1/envs", json={"env_id": CLUE})  # the cap (3) is full
        assert refused.status_code == 503 and refused.json()["status"] == "unavailable"
        with connect(ws_url) as late:
            assert ask(late, "reset", {"seed": 3})["data"]["code"] == "CAPACITY_REACHED"

        health = http.get("/healthz").json()
        assert health["status"] == ("degraded" if mode == "degraded" else "ok")
        assert health["env_sessions"] == 3
        assert health["env_session_counts"] == {
            "open": 3, "connection_held": 1, "in_use": 3, "max_sessions": CAP, "expired": 0, "refused": 2,
            "groups": [{"env_id": CLUE, "transport": "openenv", "open": 1, "expired": 0},
                       {"env_id": CLUE, "transport": "rest", "open": 2, "expired": 0}]}
        text, m = scrape(http)
        assert m[("forkyard_env_sessions", group(CLUE, "rest"))] == 2
        assert m[("forkyard_env_sessions", group(CLUE, "openenv"))] == 1
        assert m[("forkyard_env_sessions_connection_held", ())] == 1
        assert m[("forkyard_env_sessions_in_use", ())] == 3 and m[("forkyard_env_sessions_max", ())] == CAP
        assert m[("forkyard_env_sessions_refused_total", ())] == 2
        assert ("forkyard_pool_busy", ()) in m if mode == "full" else ("forkyard_pool_busy", ()) not in m
        for sid in sids:  # a session id is a bearer capability: never in a label or a health answer
            assert sid not in text and sid not in json.dumps(health)

        # The TTL passes for the REST sessions nobody touches; the connection holds its own (field case S48).
        assert app.state.env_sessions.reap(now=time.monotonic() + TTL_S + 1) == 2
        health = http.get("/healthz").json()["env_session_counts"]
        assert (health["open"], health["expired"], health["groups"]) == (1, 2, [
            {"env_id": CLUE, "transport": "openenv", "open": 1, "expired": 0},
            {"env_id": CLUE, "transport": "rest", "open": 0, "expired": 2}])
        _, m = scrape(http)
        assert m[("forkyard_env_sessions_expired_total", group(CLUE, "rest"))] == 2
        assert ("forkyard_env_sessions", group(CLUE, "rest")) not in m
        assert ask(ws, "step", {"action": "probe(0)"})["type"] == "observation"
    with httpx.Client(base_url=srv.url, timeout=30) as http:  # the connection closed: its session is released
        health = wait_open(http, 0)
        assert health["env_sessions"] == 0 and health["env_session_counts"]["connection_held"] == 0
        _, m = scrape(http)
        assert not any(name == "forkyard_env_sessions" for name, _ in m)
        assert m[("forkyard_env_sessions_in_use", ())] == 0


def test_s63_forks_count_under_the_transport_that_made_them_and_refusals_count_per_request():
    srv = UvicornThread(create_env_app(ttl_s=TTL_S, max_sessions=4)).start()
    try:
        ws_url = srv.url.replace("http", "ws") + f"/openenv/{CLUE}/ws"
        with httpx.Client(base_url=srv.url, timeout=30) as http, connect(ws_url) as ws:
            assert ask(ws, "reset", {"seed": 1})["type"] == "observation"
            assert len(ask(ws, "fork", {"n": 2})["data"]["session_ids"]) == 2
            sid = http.post("/v1/envs", json={"env_id": CLUE, "seed": 2}).json()["session_id"]
            too_many = http.post(f"/v1/envs/{sid}/fork", json={"n": 2})  # 4 held + 2 > 4: all or none
            assert too_many.status_code == 503
            counts = http.get("/healthz").json()["env_session_counts"]
            assert counts["groups"] == [{"env_id": CLUE, "transport": "openenv", "open": 3, "expired": 0},
                                        {"env_id": CLUE, "transport": "rest", "open": 1, "expired": 0}]
            assert (counts["connection_held"], counts["refused"]) == (3, 1)
            _, m = scrape(http)
            assert m[("forkyard_env_sessions", group(CLUE, "openenv"))] == 3
            assert m[("forkyard_env_sessions_refused_total", ())] == 1
    finally:
        srv.stop()
