"""The one session host (sandbox_server/session_host.py) and its shims: its synchronous core over real ClueProbe
envs in-process, its async and batched operations (sandbox_server/session_batch.py) giving the same answers, the
Ray node host holding its sessions through it (in-process, without Ray), and the single and batched REST routes
giving the same answers and the same errors for the same inputs on a real uvicorn on loopback."""

from __future__ import annotations

import anyio
import gymnasium as gym
import httpx
import pytest

from envs.clueprobe import ClueProbeEnv
from envs.core import EnvInfraError, EpisodeFinishedError
from envs.errors import ActionTooLong, InvalidValue, SessionNotFound, UnknownEnv
from ray_cluster.nodes import NodeHost
from sandbox_server import session_batch
from sandbox_server.app import create_env_app
from sandbox_server.env_sessions import EnvSessions
from sandbox_server.errors import CapacityReached
from sandbox_server.http_contract import classify
from sandbox_server.session_host import SessionHost, resetter
from tests.docker_support import UvicornThread

CLUE = "forkyard/ClueProbe-v0"
KW = {"max_turns": 4, "bits": 3}


def new_host(max_sessions: int = 16) -> SessionHost:
    return SessionHost(EnvSessions(ttl_s=600, max_sessions=max_sessions))


def status(exc: BaseException) -> int:
    """The HTTP status the REST edge answers for ``exc`` (the one table, ``DOMAIN_ERRORS``)."""
    known = classify(exc)
    assert known is not None, repr(exc)
    return known[0]


class BrokenFork(ClueProbeEnv):
    """A ClueProbe whose fork fails as a lost sandbox would."""

    def fork(self, n: int = 1):
        raise RuntimeError("the copy's sandbox vanished")


# ------------------------------------------------------------------------------------ the synchronous core
def test_the_synchronous_core_plays_as_the_env_in_process():
    host = new_host()
    opened = host.open_now(host.sessions.recipe(CLUE, KW), resetter(5, None))
    local = ClueProbeEnv(**KW)
    assert (opened.observation, opened.info) == local.reset(seed=5)
    sid = opened.session_id
    for action in ("probe(0)", "nonsense", "probe(2)"):
        assert host.step_now(sid, action) == local.step(action)
    kids = host.fork_now(sid, 2)
    twins = local.fork(2)
    assert [host.step_now(k, "answer(3)") for k in kids] == [t.step("answer(3)") for t in twins]
    snap = host.snapshot_now(sid)
    assert snap.env_id == CLUE and snap.state["turn"] == 3
    adopted = host.adopt_now(host.sessions.recipe(CLUE, KW), snap.to_bytes(), 2)
    assert [host.sessions.get(a).env.current_info() for a in adopted] == [local.current_info()] * 2
    assert host.reset_now(sid, 9, None) == local.reset(seed=9)
    assert len(host.sessions) == 5
    assert host.close_now([sid, "nope", *kids, *adopted]) == [True, False, True, True, True, True]
    assert len(host.sessions) == 0 and host.sessions.in_use == 0


def test_the_core_raises_the_domain_errors_and_keeps_nothing_on_failure():
    host = new_host(max_sessions=3)
    recipe = host.sessions.recipe(CLUE, {"max_turns": 1})
    sid = host.open_now(recipe, resetter(0, None)).session_id
    # domain errors, each also the builtin an env in-process raises, and nothing of HTTP below the routes
    lost = pytest.raises(SessionNotFound, host.step_now, "unknown", "probe(0)").value
    assert isinstance(lost, KeyError) and isinstance(lost, EnvInfraError) and status(lost) == 404
    assert str(lost).startswith("no env session 'unknown'")  # not quoted as a KeyError's would be
    assert status(pytest.raises(ActionTooLong, host.step_now, sid, "x" * 40_000).value) == 413  # past a reply
    assert "Invalid action" in host.step_now(sid, "x" * 257)[0]  # a reply: the env's; the only turn: it ends
    assert status(pytest.raises(EpisodeFinishedError, host.step_now, sid, "probe(0)").value) == 409
    assert status(pytest.raises(InvalidValue, host.reset_now, sid, -1, None).value) == 422
    assert status(pytest.raises(InvalidValue, host.sessions.recipe, CLUE, {"max_turns": True}).value) == 422
    unknown = pytest.raises(UnknownEnv, host.sessions.recipe, "forkyard/Nope-v0", {}).value
    assert isinstance(unknown, ValueError) and isinstance(unknown, gym.error.UnregisteredEnv) and status(unknown) == 404
    with pytest.raises(CapacityReached):  # 1 held + 3 asked > 3: all or none
        host.fork_now(sid, 3)
    assert host.sessions.in_use == 1
    assert len(host.fork_now(sid, 3, force=True)) == 3 and host.sessions.in_use == 4  # forced past the cap
    # A fork that fails is the env's failure (503), and keeps no session nor any room.
    broken = host.sessions.recipe(CLUE, {})
    broken = type(broken)(broken.env_id, BrokenFork, broken.kwargs, broken.extra)
    bsid = host.open_now(broken, resetter(0, None), force=True).session_id
    with pytest.raises(EnvInfraError, match="fork failed: RuntimeError: the copy's sandbox vanished"):
        host.fork_now(bsid, 1, force=True)
    assert host.sessions.in_use == 5
    host.close_now(list(host.sessions.held()))
    assert host.sessions.in_use == 0


def test_envs_held_outside_sessions_count_against_the_cap():
    store = EnvSessions(ttl_s=600, max_sessions=2)
    assert store.hold(2) and not store.hold(1) and store.in_use == 2
    with pytest.raises(CapacityReached):
        with store.reserve(1):
            pass
    assert store.hold(-5)  # fewer, never below zero
    assert store.in_use == 0


# ------------------------------------------------------------------------ async and batched: one answer
def test_async_single_and_batched_operations_answer_alike():
    async def main() -> None:
        host = new_host()
        single = [await host.create(CLUE, KW, seed=s) for s in range(3)]
        refused = [(CLUE, {"max_turns": "4"}, 0, None), ("forkyard/Nope-v0", {}, 0, None)]
        batched = await session_batch.batch_create(host, [(CLUE, KW, s, None) for s in range(3)] + refused)
        assert [(o.observation, o.info) for o in batched[:3]] == [(o.observation, o.info) for o in single]
        assert [status(e) for e in batched[3:]] == [422, 404]
        a = [o.session_id for o in single]
        b = [o.session_id for o in batched[:3]]
        actions = ["probe(1)", "answer(2)", "probe(0)"]
        one = [await host.step(s, x) for s, x in zip(a, actions, strict=True)]
        many = await session_batch.batch_step(host, [*b, "gone", b[0]], [*actions, "probe(0)", "x" * 40_000])
        assert many[:3] == one
        assert [status(e) for e in many[3:]] == [404, 413]
        short = (await session_batch.batch_create(host, [(CLUE, {"max_turns": 1}, 0, None)]))[0].session_id
        ended = await session_batch.batch_step(host, [short, short], ["answer(0)", "answer(0)"])
        assert ended[0][2] or ended[0][3]  # the only turn ends the episode; the same item again is a 409
        assert status(ended[1]) == 409 and await host.delete([short]) == [True]
        kids_a = await host.fork(a[0], 2)
        kids_b = await session_batch.batch_fork(host, [(b[0], 2), ("gone", 1)])
        assert len(kids_b[0]) == 2 and status(kids_b[1]) == 404
        assert ([await host.step(k, "probe(2)") for k in kids_a]
                == await session_batch.batch_step(host, kids_b[0], ["probe(2)"] * 2))
        resets = await session_batch.batch_reset(host, [(b[2], 4, None), (b[2], -1, None)])
        assert resets[0][1:] == (await host.reset(a[2], seed=4))[1:]
        assert status(resets[1]) == 422
        assert await host.snapshot(a[0]) != await host.snapshot(b[0])  # sealed tokens: never the same bytes
        held = await session_batch.batch_delete(host, b + kids_b[0] + [b[0]])
        assert held == [True] * 5 + [False]
        assert await host.delete(a + kids_a) == [True] * 5
        assert len(host.sessions) == 0 and host.sessions.in_use == 0

    anyio.run(main)


# ----------------------------------------------------------------------------------- the Ray node host
def test_the_node_host_holds_its_sessions_through_the_session_host():
    host = NodeHost("n1", capacity=4)
    sid = host.create(CLUE, {"max_turns": 2})
    assert sid == "n1/0" and isinstance(host.host, SessionHost) and host.sessions[sid] is host.store.get(sid).env
    local = ClueProbeEnv(max_turns=2)
    assert host.reset(sid, 3, None) == local.reset(seed=3)
    # An action longer than the env accepts is the env's invalid action, as in-process (no 413 over Ray).
    assert host.step(sid, "y" * 300) == local.step("y" * 300)
    kids = host.fork(sid, 2)
    assert kids == ["n1/1", "n1/2"] and host.live == 3
    assert host.reserve(1) and not host.reserve(1) and host.live == 4  # a rollout worker's own env
    assert host.adopt(CLUE, {"max_turns": 2}, host.snapshot(sid), 1) is None  # no room: nothing made
    host.release(1)
    adopted = host.adopt(CLUE, {"max_turns": 2}, host.snapshot(sid), 1)
    assert host.step(adopted[0], "answer(1)") == local.step("answer(1)")
    with pytest.raises(KeyError, match="no env session 'n1/99'"):
        host.step("n1/99", "probe(0)")
    with pytest.raises(EpisodeFinishedError):
        host.step(adopted[0], "probe(0)")
    with pytest.raises(ValueError, match="Seed must be"):
        host.reset(sid, -1, None)
    host.close(sid)
    host.close(sid)  # an unknown id is ignored
    assert host.shutdown() == 3 and host.live == 0 and host.sessions == {}


# ------------------------------------------------------------------------- REST: single = batched
@pytest.fixture(scope="module")
def server():
    srv = UvicornThread(create_env_app(ttl_s=600, max_sessions=6)).start()
    yield srv
    srv.stop()


def single_error(r: httpx.Response) -> dict:
    out = {"status_code": r.status_code, "error": r.json()}
    if r.status_code == 503:
        out["retry_after_s"] = int(r.headers["Retry-After"])
    return out


def test_single_and_batched_routes_answer_the_same_errors(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        def batched(route: str, item: dict) -> dict:
            r = http.post(f"/v1/envs/batch/{route}", json={"items": [item]})
            assert r.status_code == 200, r.text
            return r.json()["results"][0]

        creates = [{"env_id": "forkyard/Nope-v0"}, {"env_id": CLUE, "kwargs": {"max_turns": "4"}},
                   {"env_id": CLUE, "kwargs": {"backend": "local"}}, {"env_id": CLUE, "options": {"target": 99}}]
        for c in creates:
            assert batched("create", c) == single_error(http.post("/v1/envs", json=c)), c
        sid = http.post("/v1/envs", json={"env_id": CLUE, "seed": 1, "kwargs": {"max_turns": 1}}).json()["session_id"]
        too_long = "z" * 40_000  # past the longest reply a door takes
        for route, item in (("step", {"session_id": "gone", "action": "probe(0)"}),
                            ("step", {"session_id": sid, "action": too_long}),
                            ("reset", {"session_id": sid, "options": {"target": 99}}),
                            ("fork", {"session_id": "gone", "n": 1})):
            body = {k: v for k, v in item.items() if k != "session_id"}
            single = http.post(f"/v1/envs/{item['session_id']}/{route}", json=body)
            assert batched(route, item) == single_error(single), item
        assert http.post(f"/v1/envs/{sid}/step", json={"action": "probe(0)"}).status_code == 200  # the episode ends
        item = {"session_id": sid, "action": "probe(0)"}
        assert batched("step", item) == single_error(http.post(f"/v1/envs/{sid}/step", json={"action": "probe(0)"}))
        assert batched("step", item)["status_code"] == 409
        # The session cap (6): one held, five more fill it; the next create is a 503 either way.
        made = [http.post("/v1/envs", json={"env_id": CLUE}).json()["session_id"] for _ in range(5)]
        full = batched("create", {"env_id": CLUE})
        assert full == single_error(http.post("/v1/envs", json={"env_id": CLUE}))
        assert full["status_code"] == 503 and full["retry_after_s"] >= 1
        for s in [sid, *made]:
            assert batched("delete", {"session_id": s}) == {"status_code": 204}
        assert batched("delete", {"session_id": sid}) == single_error(http.delete(f"/v1/envs/{sid}"))
        assert len(server.server.config.app.state.env_sessions) == 0
