"""Forks through forkyard's own clients cost no more round trips than they must, and behave as before.

Against a real uvicorn server on loopback whose app is wrapped by :class:`Recorder` (an ASGI wrapper that notes
every HTTP request, every WebSocket connection the server accepts and every message it receives; it changes
nothing), and compared with the in-process env:

* ``RemoteEnv(transport="ws")``: a fork opens no WebSocket; a child opens (or reuses) one only when it is used;
  children closed unused are deleted in one message over the parent's connection; connections of closed
  children are kept for the next ones (at most ``IDLE_LINKS`` idle); children work after their parent closed,
  from threads at once, and are lost (an infrastructure error, then a new session on reset) with the parent's
  connection when it fails first;
* ``RemoteEnv`` over HTTP: ``close_many`` deletes the children in one ``POST /v1/envs/batch/delete``;
* ``RemoteVectorEnv.fork`` builds no Gymnasium space: the children share the parent's space objects;
* every forked child plays exactly what the parent would have played from the fork on.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson
import pytest

from envs.clueprobe import ClueProbeEnv
from envs.core import EnvInfraError
from envs.remote import RemoteEnv, close_many
from envs.remote_vector import RemoteVectorEnv
from envs.session_client import IDLE_LINKS
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread

CLUE = "forkyard/ClueProbe-v0"
KW = {"max_turns": 8}


class Recorder:
    """An ASGI app around the server's: records ``(method, path)`` of each HTTP request, the WebSocket
    connections accepted (``ws_opened``, and ``ws_live`` open now) and the ``type`` of each message received."""

    def __init__(self, app: Any):
        self.app = app
        self.state = app.state
        self.http: list[tuple[str, str]] = []
        self.messages: list[dict[str, Any]] = []
        self.ws_opened = self.ws_live = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.http.append((scope["method"], scope["path"]))
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        self.ws_opened += 1
        self.ws_live += 1

        async def noted():
            msg = await receive()
            if msg["type"] == "websocket.receive":
                self.messages.append(orjson.loads(msg.get("text") or msg.get("bytes")))
            return msg

        try:
            return await self.app(scope, noted, send)
        finally:
            self.ws_live -= 1

    def kinds(self, since: int = 0) -> list[str]:
        return [m["type"] for m in self.messages[since:]]


@pytest.fixture(scope="module")
def server():
    rec = Recorder(create_env_app(ttl_s=600, max_sessions=128))
    srv = UvicornThread(rec).start()
    srv.rec = rec
    yield srv
    srv.stop()


def requests(srv, since: int) -> list[tuple[str, str]]:
    """The HTTP requests since the ``since``-th, but the lease renewals a background thread may send."""
    return [r for r in srv.rec.http[since:] if r[1] != "/v1/envs/batch/renew"]


def sessions(srv) -> int:
    return len(srv.rec.state.env_sessions)


def eventually(check, timeout_s: float = 10.0) -> None:
    """Wait for ``check()`` (the server closes a connection's sessions once it sees the connection end)."""
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert check()


def local(seed: int, actions: list[str]) -> list[str]:
    """The in-process env's observations after each action."""
    env = ClueProbeEnv(**KW)
    env.reset(seed=seed)
    return [env.step(a)[0] for a in actions]


PREFIX = ["probe(0)", "probe(2)"]
BRANCHES = [["probe(1)", "probe(0)"], ["probe(2)", "probe(1)"], ["probe(0)", "probe(0)"], ["probe(1)", "probe(2)"]]


def test_ws_fork_opens_no_connection_until_a_child_is_used(server):
    rec = server.rec
    env = RemoteEnv(CLUE, server.url, transport="ws", **KW)
    try:
        env.reset(seed=5)
        for a in PREFIX:
            env.step(a)
        opened, n = rec.ws_opened, len(rec.messages)
        kids = env.fork(4)
        assert rec.ws_opened == opened and rec.kinds(n) == ["fork"]  # one message, no connection
        assert sessions(server) == 5
        for kid, branch in zip(kids[:2], BRANCHES, strict=False):  # two used: each attaches, on a new connection
            assert [kid.step(a)[0] for a in branch] == local(5, PREFIX + branch)[len(PREFIX):]
        assert rec.ws_opened == opened + 2 and rec.kinds(n).count("attach") == 2
        n = len(rec.messages)
        close_many(kids)  # the two unused: one message over the parent's connection; the used: one each
        deletes = [m["data"]["session_ids"] for m in rec.messages[n:]]
        assert rec.kinds(n) == ["delete"] * 3 and sorted(map(len, deletes)) == [1, 1, 2]
        assert sessions(server) == 1 and rec.ws_live == 3  # the children's connections are kept, idle
        n = len(rec.messages)
        again = env.fork(2)  # the next children attach over the kept connections: none opened
        for kid, branch in zip(again, BRANCHES[2:], strict=True):
            assert [kid.step(a)[0] for a in branch] == local(5, PREFIX + branch)[len(PREFIX):]
        assert rec.ws_opened == opened + 2 and rec.kinds(n) == ["fork", "attach", "step", "step", "attach", "step",
                                                                "step"]
        assert [env.step(a)[0] for a in BRANCHES[0]] == local(5, PREFIX + BRANCHES[0])[len(PREFIX):]
        close_many(again)
    finally:
        env.close()
    eventually(lambda: sessions(server) == 0 and rec.ws_live == 0)


def test_ws_children_outlive_their_parent_and_run_in_threads(server):
    env = RemoteEnv(CLUE, server.url, transport="ws", **KW)
    env.reset(seed=7)
    for a in PREFIX:
        env.step(a)
    kids = env.fork(4)
    env.close()  # the children it made are still unused: its connection stays open for them
    assert sessions(server) == 4
    results: dict[int, list[str]] = {}

    def play(i: int) -> None:
        results[i] = [kids[i].step(a)[0] for a in BRANCHES[i]]

    threads = [threading.Thread(target=play, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {i: local(7, PREFIX + b)[len(PREFIX):] for i, b in enumerate(BRANCHES)}
    close_many(kids)
    eventually(lambda: sessions(server) == 0 and server.rec.ws_live == 0)


def test_ws_idle_connections_are_bounded(server):
    rec = server.rec
    env = RemoteEnv(CLUE, server.url, transport="ws", **KW)
    env.reset(seed=1)
    kids = env.fork(IDLE_LINKS + 4)
    for kid in kids:
        kid.step("probe(0)")
    assert rec.ws_live == IDLE_LINKS + 5
    for kid in kids:
        kid.close()
    transport = env._client
    assert len(transport.idle) == IDLE_LINKS and transport.open_connections == IDLE_LINKS + 1
    eventually(lambda: rec.ws_live == IDLE_LINKS + 1 and sessions(server) == 1)
    env.close()
    eventually(lambda: rec.ws_live == 0 and sessions(server) == 0)


def test_ws_children_are_lost_with_the_parents_connection(server):
    env = RemoteEnv(CLUE, server.url, transport="ws", **KW)
    env.reset(seed=2)
    env.step("probe(0)")
    kids = env.fork(2)
    transport = env._client
    transport.links[env.session_id].sock.close()  # the parent's connection fails before the children are used
    eventually(lambda: sessions(server) == 0)
    with pytest.raises(EnvInfraError):
        env.step("probe(1)")
    with pytest.raises(EnvInfraError):
        kids[0].step("probe(1)")  # lost with the connection that owned it: never replayed
    assert sessions(server) == 0
    assert kids[1].reset(seed=3)[0] == ClueProbeEnv(**KW).reset(seed=3)[0]  # a reset opens a new session
    assert [kids[1].step(a)[0] for a in PREFIX] == local(3, PREFIX)
    close_many([*kids, env])
    eventually(lambda: sessions(server) == 0 and server.rec.ws_live == 0)


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_forked_children_play_what_the_parent_would_have(server, transport):
    env = RemoteEnv(CLUE, server.url, transport=transport, **KW)
    env.reset(seed=11)
    for a in PREFIX:
        env.step(a)
    kids = env.fork(4)
    assert all(k.observation_space is env.observation_space for k in kids)  # shared, not rebuilt
    for kid, branch in zip(kids, BRANCHES, strict=True):
        assert [kid.step(a)[0] for a in branch] == local(11, PREFIX + branch)[len(PREFIX):]
    assert [env.step(a)[0] for a in BRANCHES[3]] == local(11, PREFIX + BRANCHES[3])[len(PREFIX):]
    n = len(server.rec.http)
    close_many(kids)
    if transport == "http":  # one batched request for the four
        assert requests(server, n) == [("POST", "/v1/envs/batch/delete")]
    assert sessions(server) == 1 and all(k.session_id is None for k in kids)
    with pytest.raises(Exception, match="closed"):
        kids[0].step("probe(0)")
    env.close()
    eventually(lambda: sessions(server) == 0)


def test_close_many_of_unused_ws_children_is_one_message(server):
    rec = server.rec
    env = RemoteEnv(CLUE, server.url, transport="ws", **KW)
    env.reset(seed=4)
    env.step("probe(0)")
    kids = env.fork(4)
    ids = sorted(k.session_id for k in kids)
    n = len(rec.messages)
    close_many(kids)
    assert rec.kinds(n) == ["delete"] and sorted(rec.messages[n]["data"]["session_ids"]) == ids
    assert sessions(server) == 1
    env.close()
    eventually(lambda: sessions(server) == 0)


def test_vector_fork_shares_the_parents_spaces(server):
    rec = server.rec
    vec = RemoteVectorEnv(CLUE, server.url, 2, **KW)
    vec.reset(seed=20)
    for a in PREFIX:
        vec.step([a, a])
    same = vec.fork(1)  # as many sub-envs: the very same space objects
    assert same.observation_space is vec.observation_space and same.action_space is vec.action_space
    assert same.single_observation_space is vec.single_observation_space
    assert same.single_action_space is vec.single_action_space
    wide = vec.fork(2)  # twice as many: the single spaces shared, the batched ones built when read, once
    assert wide.single_observation_space is vec.single_observation_space and wide.num_envs == 4
    wider = vec.fork(2)
    assert wide.observation_space is wider.observation_space
    assert wide.observation_space.spaces == (vec.single_observation_space,) * 4
    obs = wide.step([b[0] for b in BRANCHES])[0]
    assert list(obs) == [local(20 + i // 2, PREFIX + [b[0]])[-1] for i, b in enumerate(BRANCHES)]
    n = len(rec.http)
    wide.close()
    assert requests(server, n) == [("POST", "/v1/envs/batch/delete")]  # the four children in one request
    for v in (same, wider, vec):
        v.close()
    eventually(lambda: sessions(server) == 0)
