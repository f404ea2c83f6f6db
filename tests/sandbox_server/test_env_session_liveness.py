"""Field case S48: what holds an env session open counts as activity for every clock that could expire it;
the TTL reclaims only what nobody holds.

Real servers on loopback with a short env TTL (1 s, so the waits below are several TTLs and reaper periods):
an OpenEnv WebSocket kept open (its pings answered by the client library) keeps its session and the forks it
owns; ``RemoteEnv(transport="ws")`` keeps its episode while the model thinks; a step longer than the TTL leaves
its session live; a REST session nobody touches still expires; a closed connection releases its sessions; the
sandbox under an env session outlives the sandbox service's own idle TTL while the session lives.
"""

from __future__ import annotations

import json
import time

import gymnasium as gym
import httpx
import pytest
from websockets.sync.client import connect

import envs
from envs import RemoteEnv
from envs.core import Outcome, TextEnv
from sandbox_server.app import create_app, create_env_app
from sandbox_server.service import ServiceConfig
from tests.docker_support import UvicornThread, require_bwrap

CLUE = "forkyard/ClueProbe-v0"
TTL_S = 1.0
THINK_S = 3.0  # three TTLs, a dozen reaper periods: what the field case's client spent between messages


class NapEnv(TextEnv):
    """A test env whose every step takes ``nap_s`` seconds (a sandbox tool call, a slow simulator)."""

    blocking = True  # the server runs it in a worker thread: the event loop and the reaper go on meanwhile
    max_observation_length = 256
    max_action_length = 64

    def __init__(self, nap_s: float = 0.0, max_turns: int = 5):
        super().__init__(max_turns=max_turns, kwargs={"nap_s": nap_s, "max_turns": max_turns})
        self.nap_s = nap_s

    def _reset_task(self, options):
        return "Wait."

    def _act(self, call):
        return Outcome(observation="waited")

    def step(self, action):
        time.sleep(self.nap_s)
        return super().step(action)


NAP = "test/Nap-v0"


@pytest.fixture
def env_server():
    """A factory of env-only servers (stopped at the end): ``start(**create_env_app kwargs) -> (app, server)``."""
    started = []

    def start(**kw):
        app = create_env_app(**kw)
        srv = UvicornThread(app).start()
        started.append(srv)
        return app, srv

    yield start
    for srv in started:
        srv.stop()


def ws_url(srv, env_id: str = CLUE) -> str:
    return srv.url.replace("http", "ws") + f"/openenv/{env_id}/ws"


def ask(ws, kind: str, data: dict) -> dict:
    ws.send(json.dumps({"type": kind, "data": data}))
    return json.loads(ws.recv())


def wait_until(pred, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.02)
    return pred()


def test_s48_an_open_websocket_holds_its_session_and_its_forks_past_the_ttl(env_server):
    app, srv = env_server(ttl_s=TTL_S)
    store = app.state.env_sessions
    with httpx.Client(base_url=srv.url, timeout=30) as http, connect(ws_url(srv)) as ws:
        first = ask(ws, "reset", {"seed": 5})["data"]["observation"]
        assert ask(ws, "step", {"action": "probe(0)"})["type"] == "observation"
        (child,) = ask(ws, "fork", {"n": 1})["data"]["session_ids"]
        nobody = http.post("/v1/envs", json={"env_id": CLUE, "seed": 5}).json()["session_id"]
        time.sleep(THINK_S)  # the client answers pings, sends nothing
        step = ask(ws, "step", {"action": "probe(1)"})
        assert step["type"] == "observation", step  # was: SESSION_ERROR ... expired after 1 s idle
        assert step["data"]["observation"]["session_id"] == first["session_id"]
        assert step["data"]["observation"]["info"]["turn"] == 2
        gone = http.get(f"/v1/envs/{nobody}")  # the TTL does run: a REST session nobody touches expires
        assert gone.status_code == 404 and "expired after 1 s idle" in gone.json()["detail"]
        with connect(ws_url(srv)) as other:  # the fork the first connection owned waited for its driver
            attached = ask(other, "attach", {"session_id": child})
            assert attached["type"] == "observation" and attached["data"]["observation"]["info"]["turn"] == 1
            time.sleep(THINK_S)
            assert ask(other, "step", {"action": "probe(2)"})["type"] == "observation"
        assert wait_until(lambda: store.peek(child) is None)  # its connection closed: released at once
        assert store.peek(first["session_id"]) is not None
    assert wait_until(lambda: len(store) == 0)
    counts = store.census()
    assert (counts.expired, counts.connection_held) == ({(CLUE, "rest"): 1}, 0)


def test_s48_remote_env_over_ws_keeps_its_episode_while_the_model_thinks(env_server, monkeypatch):
    monkeypatch.setenv("FORKYARD_ENV_TTL_S", "1")  # the field case's configuration, read by the app
    app, srv = env_server()
    assert app.state.env_sessions.ttl_s == TTL_S
    env = RemoteEnv(CLUE, srv.url, transport="ws", timeout_s=30)
    try:
        env.reset(seed=3)
        env.step("probe(0)")
        time.sleep(THINK_S)
        obs, _, _, _, info = env.step("probe(1)")  # was: EnvInfraError, the episode lost as infra_error
        assert info["turn"] == 2 and "bit 1" in obs
    finally:
        env.close()
    assert wait_until(lambda: len(app.state.env_sessions) == 0)


@pytest.fixture
def nap_env():
    envs.register_env(NAP, f"{__name__}:NapEnv")
    yield
    gym.envs.registry.pop(NAP, None)


@pytest.mark.parametrize("transport", ["rest", "openenv"])
def test_s48_a_step_longer_than_the_ttl_leaves_its_session_live(env_server, nap_env, transport):
    app, srv = env_server(ttl_s=0.5)
    kwargs = {"nap_s": 1.5}
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        if transport == "rest":
            sid = http.post("/v1/envs", json={"env_id": NAP, "kwargs": kwargs}).json()["session_id"]
            for _ in range(2):  # the second one right after the first: was 404, expired after 0.5 s idle
                r = http.post(f"/v1/envs/{sid}/step", json={"action": "wait()"})
                assert r.status_code == 200, r.text
            time.sleep(1.5)  # now nobody holds it: it expires
            assert http.get(f"/v1/envs/{sid}").status_code == 404
        else:
            with connect(ws_url(srv, NAP)) as ws:
                sid = ask(ws, "reset", {"kwargs": kwargs})["data"]["observation"]["session_id"]
                for _ in range(2):
                    assert ask(ws, "step", {"action": "wait()"})["type"] == "observation"
            assert wait_until(lambda: app.state.env_sessions.peek(sid) is None)
    assert len(app.state.env_sessions) == 0


def test_s48_the_sandbox_under_an_env_session_outlives_the_sandbox_idle_ttl():
    """FileQA over the full server, whose sandbox service expires sandboxes idle for 1 s: the env session
    (env TTL 60 s) that holds one keeps it while it lives, over REST and over a WebSocket; the session's end
    gives it back."""
    require_bwrap()
    app = create_app(backend="local", config=ServiceConfig(min_idle=0, max_total=4, idle_ttl_s=TTL_S,
                                                           reap_interval_s=0.2, env_ttl_s=60))
    srv = UvicornThread(app).start()
    kwargs = {"kinds": ["line_count"], "max_turns": 4}
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as http, \
                connect(ws_url(srv, "forkyard/FileQA-v0"), open_timeout=60) as ws:
            made = http.post("/v1/envs", json={"env_id": "forkyard/FileQA-v0", "kwargs": kwargs, "seed": 1})
            assert made.status_code == 201, made.text
            sid = made.json()["session_id"]
            assert ask(ws, "reset", {"seed": 1, "kwargs": kwargs})["type"] == "observation"
            svc = app.state.service
            assert len(svc.list()) == 2
            time.sleep(THINK_S)
            step = http.post(f"/v1/envs/{sid}/step", json={"action": "ls('.')"})
            assert step.status_code == 200, step.text  # was: 503 infra_error, the sandbox expired under it
            assert "error" not in step.json()["observation"].lower()[:40], step.json()["observation"]
            over_ws = ask(ws, "step", {"action": "ls('.')"})
            assert over_ws["type"] == "observation", over_ws
            assert http.delete(f"/v1/envs/{sid}").status_code == 204
        assert wait_until(lambda: svc.list() == [])  # both sessions ended: both sandboxes given back
    finally:
        srv.stop()
