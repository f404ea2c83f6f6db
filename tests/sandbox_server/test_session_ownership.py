"""One ownership rule for an env session, whatever door reaches it (field case S58).

A session no connection holds (made over ``/v1/envs``) is acted on by whoever holds its id; a session an OpenEnv
WebSocket connection holds (its own, its forks, the ones it attached) only through that connection until it
closes: every REST route, every batched route and every other connection is refused 409 ``held`` and nothing
runs. Real server on loopback, real WebSocket connections.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.sync.client import connect

from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread

CLUE = "forkyard/ClueProbe-v0"


@pytest.fixture(scope="module")
def server():
    srv = UvicornThread(create_env_app(ttl_s=600, max_sessions=64)).start()
    yield srv
    srv.stop()


def ws_url(srv) -> str:
    return f"{srv.url.replace('http', 'ws')}/openenv/{CLUE}/ws"


def ask(ws, kind: str, **data) -> dict:
    ws.send(json.dumps({"type": kind, "data": data}))
    return json.loads(ws.recv())


def turn(ws) -> int:
    return ask(ws, "state")["data"]["step_count"]


def rest_refusals(srv, sid: str) -> dict[str, tuple[int, str]]:
    """Every REST door on session ``sid``: (status, status word) of each."""
    v1, out = f"{srv.url}/v1/envs", {}
    with httpx.Client(timeout=10) as c:
        for name, method, path, body in [
            ("get", "GET", f"/{sid}", None), ("tools", "GET", f"/{sid}/tools", None),
            ("reset", "POST", f"/{sid}/reset", {"seed": 5}), ("step", "POST", f"/{sid}/step", {"action": "probe(1)"}),
            ("fork", "POST", f"/{sid}/fork", {"n": 2}), ("snapshot", "POST", f"/{sid}/snapshot", None),
            ("delete", "DELETE", f"/{sid}", None),
        ]:
            r = c.request(method, v1 + path, json=body)
            out[name] = (r.status_code, r.json().get("status") if r.content else None)
        for route, item in [("reset", {"session_id": sid, "seed": 5}),
                            ("step", {"session_id": sid, "action": "probe(1)"}),
                            ("fork", {"session_id": sid, "n": 2}), ("delete", {"session_id": sid})]:
            r = c.post(f"{v1}/batch/{route}", json={"items": [item]})
            assert r.status_code == 200, r.text
            res = r.json()["results"][0]
            out[f"batch/{route}"] = (res["status_code"], res.get("error", {}).get("status"))
    return out


HELD = {k: (409, "held") for k in ["get", "tools", "reset", "step", "fork", "snapshot", "delete", "batch/reset",
                                    "batch/step", "batch/fork", "batch/delete"]}


def count(srv) -> int:
    return len(srv.server.config.app.state.env_sessions)


def gone(srv, *sids: str, timeout_s: float = 10.0) -> bool:
    """Whether every session of ``sids`` answers 404 within ``timeout_s`` (a closed connection is released by
    the server after the client has gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(httpx.get(f"{srv.url}/v1/envs/{s}").status_code == 404 for s in sids):
            return True
        time.sleep(0.02)
    return False


def test_field_case_s58_a_connections_sessions_are_refused_at_every_rest_door(server):
    with connect(ws_url(server)) as a:
        own = ask(a, "reset", seed=1)["data"]["observation"]["session_id"]
        ask(a, "step", action="probe(0)")
        fork = ask(a, "fork", n=1)["data"]["session_ids"][0]
        n = count(server)
        for sid in (own, fork):  # its own session, and a fork it holds (nobody attached it)
            assert rest_refusals(server, sid) == HELD, sid
        assert count(server) == n  # nothing deleted, nothing forked
        assert turn(a) == 1  # nothing stepped or reset: the connection's session is as it left it
        # the connection itself acts on it: step, fork, snapshot, tools, delete of its fork
        assert ask(a, "step", action="probe(1)")["data"]["observation"]["info"]["turn"] == 2
        assert ask(a, "snapshot")["type"] == "snapshot"
        assert ask(a, "tools")["data"]["tools"][0]["function"]["name"] == "probe"
        assert ask(a, "delete", session_ids=[fork])["data"] == {"deleted": [fork], "missing": []}
    assert gone(server, own)  # the connection closed: its session went with it, for every door (404, not 409)


def test_field_case_s58_attaching_a_rest_session_moves_it_behind_the_connection(server):
    v1 = f"{server.url}/v1/envs"
    sid = httpx.post(v1, json={"env_id": CLUE, "seed": 2}).json()["session_id"]
    assert httpx.post(f"{v1}/{sid}/step", json={"action": "probe(0)"}).status_code == 200  # the id is the proof
    with connect(ws_url(server)) as a:
        assert ask(a, "attach", session_id=sid)["data"]["observation"]["info"]["turn"] == 1
        assert rest_refusals(server, sid) == HELD  # now only through the connection
        assert ask(a, "step", action="probe(1)")["data"]["observation"]["info"]["turn"] == 2
        kids = ask(a, "fork", n=2)["data"]["session_ids"]
        assert all(rest_refusals(server, k)["step"] == (409, "held") for k in kids)
    assert gone(server, sid, *kids)  # released with the connection: the session and its forks


def test_field_case_s58_other_connections_are_refused_and_attach_transfers(server):
    with connect(ws_url(server)) as a, connect(ws_url(server)) as b:
        own = ask(a, "reset", seed=3)["data"]["observation"]["session_id"]
        kids = ask(a, "fork", n=2)["data"]["session_ids"]
        ask(b, "reset", seed=4)
        n = count(server)
        # b may neither take a's driven session nor delete a's session or forks
        assert ask(b, "attach", session_id=own)["data"]["http_status"] == 409
        for target in ([own], [kids[0]], [kids[1], own]):
            got = ask(b, "delete", session_ids=target)
            assert (got["type"], got["data"]["http_status"], got["data"]["status"]) == ("error", 409, "held")
        assert count(server) == n
        # attach transfers a fork a holds but does not drive: b drives it now, a can no longer delete it
        assert ask(b, "attach", session_id=kids[0])["data"]["observation"]["session_id"] == kids[0]
        assert ask(b, "step", action="probe(2)")["data"]["observation"]["info"]["turn"] == 1
        assert ask(a, "delete", session_ids=[kids[0]])["data"]["http_status"] == 409
        assert ask(a, "attach", session_id=kids[0])["data"]["http_status"] == 409
        assert rest_refusals(server, kids[0])["step"] == (409, "held")
        assert ask(a, "delete", session_ids=[kids[1]])["data"]["deleted"] == [kids[1]]  # still a's
        assert ask(a, "step", action="probe(0)")["data"]["observation"]["info"]["turn"] == 1


def test_field_case_s58_rest_sessions_stay_open_to_their_id_on_every_door(server):
    v1 = f"{server.url}/v1/envs"
    sid = httpx.post(v1, json={"env_id": CLUE, "seed": 2}).json()["session_id"]
    got = rest_refusals(server, sid)  # the last ones delete it: every door answered as the id's holder
    assert {k: s for k, (s, _) in got.items()} == {
        "get": 200, "tools": 200, "reset": 200, "step": 200, "fork": 200, "snapshot": 200, "delete": 204,
        "batch/reset": 404, "batch/step": 404, "batch/fork": 404, "batch/delete": 404}
    sid = httpx.post(v1, json={"env_id": CLUE, "seed": 2}).json()["session_id"]
    for route, item in [("reset", {"session_id": sid}), ("step", {"session_id": sid, "action": "probe(1)"}),
                        ("fork", {"session_id": sid, "n": 1})]:
        assert httpx.post(f"{v1}/batch/{route}", json={"items": [item]}).json()["results"][0]["status_code"] == 200
    with connect(ws_url(server)) as c:  # a connection may delete a session no connection holds
        assert ask(c, "delete", session_ids=[sid])["data"]["deleted"] == [sid]


def test_field_case_s58_a_websocket_clients_tools_come_over_its_own_connection(server):
    """RemoteEnv over the WebSocket transport asks its session's tools over the connection that holds it (the
    REST route refuses a held session): the parent's and a fork child's."""
    from envs import RemoteEnv

    env = RemoteEnv(CLUE, server_url=server.url, transport="ws")
    try:
        env.reset(seed=0)
        assert [t["function"]["name"] for t in env.tool_schemas()] == ["probe", "answer"]
        (kid,) = env.fork(1)
        assert kid.tool_schemas() == env.tool_schemas()
        kid.close()
    finally:
        env.close()
