"""OpenEnv's wire protocol served by forkyard (sandbox_server/routes/openenv.py), judged by OpenEnv's own
client (openenv-core, pinned in the ``integrations`` extra) against a real uvicorn on loopback: episodes with
``GenericEnvClient`` and a typed ``EnvClient`` subclass, many concurrent sessions released with their
connections, the fork extension (fork, attach, delete), sealed snapshots (opaque, authenticated, restorable
over /ws and /v1/envs), errors that keep the connection usable, the HTTP routes, and FileQA with its
sandbox."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from dataclasses import dataclass

import httpx
import pytest
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import EnvironmentMetadata, SchemaResponse
from openenv.core.generic_client import GenericEnvClient
from websockets.sync.client import connect

from envs.clueprobe import ClueProbeEnv
from envs.openenv_client import ForkyardEnvClient
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread, require_bwrap

CLUE = "forkyard/ClueProbe-v0"
FILEQA = "forkyard/FileQA-v0"


@pytest.fixture(scope="module")
def server():
    srv = UvicornThread(create_env_app(ttl_s=600, max_sessions=64)).start()
    yield srv
    srv.stop()


def sessions(srv) -> int:
    return len(srv.server.config.app.state.env_sessions)


def base(srv, env_id: str = CLUE) -> str:
    return f"{srv.url}/openenv/{env_id}"


def wait_sessions(srv, n: int, timeout_s: float = 10.0) -> None:
    """Connections are released by the server after the client has gone: wait for it (bounded)."""
    import time

    deadline = time.monotonic() + timeout_s
    while sessions(srv) != n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sessions(srv) == n


def solve(env) -> StepResult:
    """Play ClueProbe (max_turns=4, bits=3) to the right answer through an OpenEnv sync client."""
    target = 0
    for k in range(3):
        text = env.step({"action": f"probe({k})"}).observation["text"]
        target |= int(re.search(rf"bit {k} of the target is (\d)", text).group(1)) << k
    return env.step({"action": f"answer({target})"})


# ------------------------------------------------------------------------------------ OpenEnv's clients
def test_generic_client_plays_an_episode_like_the_in_process_env(server):
    local = ClueProbeEnv(max_turns=4)
    obs0, _ = local.reset(seed=7)
    with GenericEnvClient(base_url=base(server)).sync() as env:
        first = env.reset(seed=7, kwargs={"max_turns": 4})
        assert first.observation["text"] == obs0 and first.reward is None and first.done is False
        for action in ["probe(0)", "probe(2)"]:
            remote = env.step({"action": action})
            obs, reward, term, trunc, info = local.step(action)
            assert (remote.observation["text"], remote.reward, remote.done) == (obs, reward, term or trunc)
            assert remote.observation["info"]["anchor_key"] == info["anchor_key"]
        state = env.state()
        assert state["step_count"] == 2 and state["env_id"] == CLUE and not state["done"]
        last = solve_from_reset(env, seed=7)
        assert last.done and last.reward == 1.0
        assert last.observation["info"]["termination_reason"] == "answered"
        assert sessions(server) == 1
    wait_sessions(server, 0)


def solve_from_reset(env, seed: int) -> StepResult:
    env.reset(seed=seed)
    return solve(env)


@dataclass
class ProbeAction:
    """The action class an OpenEnv user writes for a typed client."""

    action: str


@dataclass
class ProbeObservation:
    text: str
    turn: int
    legal_actions: list[str]


class ClueProbeClient(EnvClient[ProbeAction, ProbeObservation, dict]):
    """A typed client as OpenEnv's docs show one: three methods, nothing of forkyard's."""

    def _step_payload(self, action: ProbeAction) -> dict:
        return {"action": action.action}

    def _parse_result(self, payload: dict) -> StepResult[ProbeObservation]:
        o = payload["observation"]
        return StepResult(ProbeObservation(o["text"], o["info"]["turn"], o["info"].get("legal_actions", [])),
                          payload.get("reward"), payload.get("done", False))

    def _parse_state(self, payload: dict) -> dict:
        return payload


def test_a_typed_env_client_runs_episodes(server):
    async def play() -> list[float]:
        rewards = []
        async with ClueProbeClient(base_url=base(server)) as env:
            for seed in range(3):
                result = await env.reset(seed=seed, kwargs={"max_turns": 2})
                assert result.observation.legal_actions == ["probe(0)", "probe(1)", "probe(2)"]
                await env.step(ProbeAction("probe(0)"))
                result = await env.step(ProbeAction("answer(0)"))
                assert result.done and result.observation.turn == 2
                rewards.append(result.reward)
        return rewards

    rewards = asyncio.run(play())
    local = []
    for seed in range(3):
        e = ClueProbeEnv(max_turns=2)
        e.reset(seed=seed)
        e.step("probe(0)")
        local.append(e.step("answer(0)")[1])
    assert rewards == local
    wait_sessions(server, 0)


def test_many_concurrent_sessions_each_their_own_and_released_with_the_connection(server):
    n = 32

    async def one(seed: int) -> tuple[str, str]:
        env = GenericEnvClient(base_url=base(server))
        await env.connect()
        try:
            first = await env.reset(seed=seed, kwargs={"max_turns": 3})
            step = await env.step({"action": "probe(1)"})
            return first.observation["session_id"], step.observation["text"]
        finally:
            await env.close()

    async def main():
        return await asyncio.gather(*(one(s) for s in range(n)))

    results = asyncio.run(main())
    assert len({sid for sid, _ in results}) == n
    for seed, (_, text) in enumerate(results):
        e = ClueProbeEnv(max_turns=3)
        e.reset(seed=seed)
        assert text == e.step("probe(1)")[0]
    wait_sessions(server, 0)


def test_a_dropped_connection_releases_its_session_without_a_close_message(server):
    with connect(f"{base(server).replace('http', 'ws')}/ws") as ws:
        ws.send('{"type": "reset", "data": {"seed": 1}}')
        assert '"observation"' in ws.recv()
        assert sessions(server) == 1
        ws.socket.close()  # no close frame, no close message
        wait_sessions(server, 0)


# ------------------------------------------------------------------------------------ fork extension
def test_fork_attach_and_delete(server):
    local = ClueProbeEnv(max_turns=4)
    local.reset(seed=3)
    local.step("probe(0)")
    twins = local.fork(3)
    with ForkyardEnvClient(base_url=base(server)).sync() as parent:
        parent.reset(seed=3, kwargs={"max_turns": 4})
        parent.step({"action": "probe(0)"})
        children = parent.fork(3)
        assert len(set(children)) == 3 and sessions(server) == 4
        with ForkyardEnvClient(base_url=base(server)).sync() as a, ForkyardEnvClient(base_url=base(server)).sync() as b:
            first = a.attach(children[0])
            assert first.observation["text"] == local.last_observation and first.observation["info"]["turn"] == 1
            assert a.step({"action": "probe(1)"}).observation["text"] == twins[0].step("probe(1)")[0]
            b.attach(children[1])
            assert b.step({"action": "probe(2)"}).observation["text"] == twins[1].step("probe(2)")[0]
            with pytest.raises(RuntimeError, match="another connection"):
                b.attach(children[0])  # a drives it
            # the parent went on unchanged by its children
            assert parent.step({"action": "probe(2)"}).observation["text"] == local.step("probe(2)")[0]
        wait_sessions(server, 2)  # a's and b's sessions went with their connections; the parent and child 3 stay
        assert parent.delete([children[2], "nope"]) == {"deleted": [children[2]], "missing": ["nope"]}
        assert sessions(server) == 1
        more = parent.fork(2)
        assert sessions(server) == 3 and len(more) == 2
    wait_sessions(server, 0)  # the children nobody attached went with their parent's connection


def test_field_case_s58_forked_sessions_are_the_connections_not_v1_envs(server):
    """A fork a connection holds is reached only through a connection (its own, or one that attaches it), never
    over /v1/envs by its id: one ownership rule for every door (tests/sandbox_server/test_session_ownership.py)."""
    with ForkyardEnvClient(base_url=base(server)).sync() as env:
        env.reset(seed=2)
        child = env.fork(1)[0]
        got = httpx.post(f"{server.url}/v1/envs/{child}/step", json={"action": "probe(1)"})
        assert (got.status_code, got.json()["status"]) == (409, "held")
        with ForkyardEnvClient(base_url=base(server)).sync() as other:
            assert other.attach(child).observation["info"]["turn"] == 0
            assert other.step({"action": "probe(1)"}).observation["info"]["turn"] == 1
    wait_sessions(server, 0)


# ------------------------------------------------------------------------------------ snapshots
def test_snapshot_tokens_are_opaque_authenticated_and_restore(server):
    local = ClueProbeEnv(max_turns=4)
    local.reset(seed=11)
    local.step("probe(1)")
    target = local.snapshot().state["task"]
    with ForkyardEnvClient(base_url=base(server)).sync() as env:
        env.reset(seed=11, kwargs={"max_turns": 4})
        env.step({"action": "probe(1)"})
        token = env.snapshot()
        raw = base64.urlsafe_b64decode(token + "==")
        for secret in (str(target).encode(), b"target", b"ClueProbe", b"probe(1)"):
            assert secret not in raw  # encrypted: nothing of the hidden state (nor the history) is readable
        env.step({"action": "probe(0)"})
        restored = env.reset(snapshot=token)
        assert restored.observation["text"] == local.last_observation
        assert restored.observation["info"]["turn"] == 1
        assert env.step({"action": "probe(2)"}).observation["text"] == local.step("probe(2)")[0]
        for bad in (token[:-8] + ("A" * 8 if not token.endswith("A" * 8) else "B" * 8), token[:40], "x", ""):
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                env.reset(snapshot=bad)
        with pytest.raises(RuntimeError, match="takes no kwargs"):
            env.reset(snapshot=token, seed=1)
        # the connection still works after its errors, on the restored session
        assert env.state()["step_count"] == 2
    # over /v1/envs: the same token makes a new session; another server's key refuses it
    made = httpx.post(f"{server.url}/v1/envs/restore", json={"snapshot": token})
    assert made.status_code == 201 and made.json()["info"]["turn"] == 1
    sid = made.json()["session_id"]
    again = httpx.post(f"{server.url}/v1/envs/{sid}/snapshot").json()["snapshot"]
    assert again != token  # a fresh seal (Fernet tokens carry a time and IV)
    httpx.delete(f"{server.url}/v1/envs/{sid}")
    other = UvicornThread(create_env_app()).start()
    try:
        refused = httpx.post(f"{other.url}/v1/envs/restore", json={"snapshot": token})
        assert refused.status_code == 422 and "another key" in refused.json()["detail"]
    finally:
        other.stop()
    wait_sessions(server, 0)


def test_a_shared_key_restores_on_another_server(monkeypatch):
    from cryptography.fernet import Fernet

    monkeypatch.setenv("FORKYARD_SNAPSHOT_KEY", Fernet.generate_key().decode())
    one, two = UvicornThread(create_env_app()).start(), UvicornThread(create_env_app()).start()
    try:
        sid = httpx.post(f"{one.url}/v1/envs", json={"env_id": CLUE, "seed": 4}).json()["session_id"]
        httpx.post(f"{one.url}/v1/envs/{sid}/step", json={"action": "probe(2)"})
        token = httpx.post(f"{one.url}/v1/envs/{sid}/snapshot").json()["snapshot"]
        made = httpx.post(f"{two.url}/v1/envs/restore", json={"snapshot": token})
        assert made.status_code == 201 and made.json()["info"]["turn"] == 1
    finally:
        one.stop()
        two.stop()
    monkeypatch.setenv("FORKYARD_SNAPSHOT_KEY", "not-a-key-but-a-secret")
    with pytest.raises(ValueError, match="Fernet key") as refused:
        create_env_app()
    assert "not-a-key-but-a-secret" not in str(refused.value)  # an error never echoes the secret


# ------------------------------------------------------------------------------------ field case S62
def test_field_case_s62_the_websocket_reads_tool_calls_as_the_env_does(server):
    """What OpenEnv clients send: a model's raw reply as the action (verifiers' ``openenv`` taskset), a JSON
    call object as the action, and OpenEnv's own ``CallToolAction`` (the real package's model, as
    ``GenericEnvClient`` dumps it) all step as the env's ``name(args)`` text does."""
    from openenv.core.env_server.mcp_types import CallToolAction

    local = ClueProbeEnv(max_turns=4)
    local.reset(seed=7)
    sent = [
        {"action": '<think>bit 0 first</think>\n<tool_call>\n{"name": "probe", "arguments": {"k": 0}}\n</tool_call>'},
        {"action": {"name": "probe", "arguments": {"k": 1}}},
        CallToolAction(tool_name="probe", arguments={"k": 2}),
    ]
    with GenericEnvClient(base_url=base(server)).sync() as env:
        env.reset(seed=7, kwargs={"max_turns": 4})
        target = 0
        for k, action in enumerate(sent):
            got = env.step(action)
            obs, reward, _, _, info = local.step(f"probe({k})")
            assert (got.observation["text"], got.reward, got.observation["info"]) == (obs, reward, info)
            target |= int(re.search(rf"bit {k} of the target is (\d)", obs).group(1)) << k
        last = env.step({"action": {"type": "function", "function": {"name": "answer",
                                                                     "arguments": json.dumps({"c": target})}}})
        assert last.done and last.reward == 1.0
    wait_sessions(server, 0)


def test_field_case_s62_an_unreadable_call_is_an_observation_not_a_validation_error(server):
    with raw_session(server) as ws:
        assert ask(ws, '{"type": "reset", "data": {"seed": 0, "kwargs": {"max_turns": 3}}}')["type"] == "observation"
        for data, says in [
            ({"action": {"name": "peek", "arguments": {"k": 0}}}, "unknown tool 'peek'"),
            ({"action": {"name": "probe", "arguments": {"j": 0}}}, "has no argument 'j'"),
            ({"type": "call_tool", "tool_name": "probe", "arguments": {"k": "0"}, "metadata": {}}, "int k"),
        ]:
            got = ask(ws, json.dumps({"type": "step", "data": data}))
            assert got["type"] == "observation", got
            assert got["data"]["observation"]["info"]["invalid_action"] is True
            assert says in got["data"]["observation"]["text"], got["data"]["observation"]["text"]
        got = ask(ws, '{"type": "step", "data": {"action": 5}}')
        assert (got["data"]["code"], got["data"]["http_status"]) == ("VALIDATION_ERROR", 422)


# ------------------------------------------------------------------------------------ errors
def raw_session(srv, env_id: str = CLUE):
    return connect(f"{base(srv, env_id).replace('http', 'ws')}/ws")


def ask(ws, text: str) -> dict:
    ws.send(text)
    return json.loads(ws.recv())


def test_bad_messages_get_errors_and_the_connection_goes_on(server):
    with raw_session(server) as ws:
        cases = [
            ("{not json", "INVALID_JSON"),
            ('{"type": "dance"}', "UNKNOWN_TYPE"),
            ('[1, 2]', "VALIDATION_ERROR"),
            ('{"type": "step", "data": {"action": "probe(0)"}}', "EXECUTION_ERROR"),  # no reset yet: 409
            ('{"type": "reset", "data": {"seed": -1}}', "VALIDATION_ERROR"),
            ('{"type": "reset", "data": {"seed": true}}', "VALIDATION_ERROR"),
            ('{"type": "reset", "data": {"kwargs": {"max_turns": "5"}}}', "VALIDATION_ERROR"),
            ('{"type": "reset", "data": {"kwargs": {"backend": "docker"}}}', "VALIDATION_ERROR"),
            ('{"type": "reset", "data": {"colour": 1}}', "VALIDATION_ERROR"),
        ]
        for text, code in cases:
            got = ask(ws, text)
            assert got["type"] == "error" and got["data"]["code"] == code, (text, got)
        assert ask(ws, '{"type": "reset", "data": {"seed": 0, "kwargs": {"max_turns": 2}}}')["type"] == "observation"
        for text, code, status in [
            ('{"type": "step", "data": {"action": 5}}', "VALIDATION_ERROR", 422),
            ('{"type": "step", "data": {"action": "probe(0)", "extra": 1}}', "VALIDATION_ERROR", 422),
            ('{"type": "step", "data": {"action": "' + "x" * 100_000 + '"}}', "VALIDATION_ERROR", 413),
            ('{"type": "fork", "data": {"n": 0}}', "VALIDATION_ERROR", 422),
            ('{"type": "attach", "data": {"session_id": "nope"}}', "SESSION_ERROR", 404),
        ]:
            got = ask(ws, text)
            assert (got["data"]["code"], got["data"]["http_status"]) == (code, status), (text[:80], got)
        bad = ask(ws, '{"type": "step", "data": {"action": "probe(99)"}}')  # the env's invalid-action observation
        assert bad["type"] == "observation" and "Invalid action" in bad["data"]["observation"]["text"]
        assert bad["data"]["observation"]["info"]["invalid_action"] is True
        assert ask(ws, '{"type": "step", "data": {"action": "answer(1)"}}')["data"]["done"] is True
        ended = ask(ws, '{"type": "step", "data": {"action": "answer(1)"}}')
        assert (ended["data"]["code"], ended["data"]["http_status"]) == ("EXECUTION_ERROR", 409)
        assert ask(ws, '{"type": "reset", "data": {}}')["type"] == "observation"
    with raw_session(server, "forkyard/Nope-v0") as ws:
        got = ask(ws, '{"type": "reset", "data": {}}')
        assert got["data"]["http_status"] == 404 and "unknown env id" in got["data"]["message"]
    wait_sessions(server, 0)


def test_the_session_cap_answers_capacity_reached():
    srv = UvicornThread(create_env_app(max_sessions=2)).start()
    try:
        with raw_session(srv) as a, raw_session(srv) as b, raw_session(srv) as c:
            assert ask(a, '{"type": "reset", "data": {}}')["type"] == "observation"
            assert ask(b, '{"type": "reset", "data": {}}')["type"] == "observation"
            full = ask(c, '{"type": "reset", "data": {}}')
            assert full["data"]["code"] == "CAPACITY_REACHED" and full["data"]["retry_after_s"] > 0
            assert ask(a, '{"type": "fork", "data": {"n": 1}}')["data"]["code"] == "CAPACITY_REACHED"
        wait_sessions(srv, 0)
    finally:
        srv.stop()


# ------------------------------------------------------------------------------------ HTTP routes
def test_the_http_routes_answer_as_openenv_defines_them(server):
    b = base(server)
    assert httpx.get(f"{b}/health").json() == {"status": "healthy"}
    meta = EnvironmentMetadata.model_validate(httpx.get(f"{b}/metadata").json())
    assert meta.name == CLUE and meta.version
    schema = SchemaResponse.model_validate(httpx.get(f"{b}/schema").json())
    kinds = {a.get("type") for a in schema.action["properties"]["action"]["anyOf"]}
    assert kinds == {"string", "object", "array"}  # text, or a JSON tool call (field case S62)
    assert httpx.get(f"{b}/state").json() == {"episode_id": None, "step_count": 0}
    first = httpx.post(f"{b}/reset", json={"seed": 5, "kwargs": {"max_turns": 3}}).json()
    local = ClueProbeEnv(max_turns=3)
    assert first["observation"]["text"] == local.reset(seed=5)[0] and first["done"] is False
    assert httpx.post(f"{b}/reset").status_code == 200
    step = httpx.post(f"{b}/step", json={"action": {"action": "probe(0)"}})
    assert step.status_code == 409 and "/ws" in step.json()["detail"]
    assert httpx.post(f"{b}/reset", json={"seed": "x"}).status_code == 422
    assert httpx.get(f"{server.url}/openenv/forkyard/Nope-v0/health").status_code == 404
    assert sessions(server) == 0


# ------------------------------------------------------------------------------------ FileQA, sandboxed
def test_fileqa_over_the_openenv_transport_with_forks():
    require_bwrap()
    from sandbox_server.embedded import shared_provider

    provider = shared_provider("local")
    srv = UvicornThread(create_env_app(sandbox_provider=provider)).start()
    try:
        kwargs = {"kinds": ["line_count"], "max_turns": 4}
        with ForkyardEnvClient(base_url=base(srv, FILEQA), message_timeout_s=120).sync() as env:
            first = env.reset(seed=1, kwargs=kwargs)
            assert "line" in first.observation["text"]
            env.step({"action": "ls('.')"})
            token = env.snapshot()
            children = env.fork(2)
            with ForkyardEnvClient(base_url=base(srv, FILEQA), message_timeout_s=120).sync() as branch:
                branch.attach(children[0])
                out = branch.step({"action": "wc('Lib/json/decoder.py')"}).observation
                assert out["info"]["turn"] == 2 and "decoder.py" in out["text"]
            restored = env.reset(snapshot=token)
            assert restored.observation["info"]["turn"] == 1
        wait_sessions(srv, 0)
    finally:
        srv.stop()
    assert provider.list() == []  # every session gave its sandbox back


def test_a_connection_outlives_its_session_and_keeps_its_kwargs(server):
    with raw_session(server) as ws:
        first = ask(ws, '{"type": "reset", "data": {"seed": 1, "kwargs": {"max_turns": 3}}}')["data"]["observation"]
        sid = first["session_id"]
        assert httpx.delete(f"{server.url}/v1/envs/{sid}").status_code == 409  # held: field case S58
        assert ask(ws, json.dumps({"type": "delete", "data": {"session_ids": [sid]}}))["data"]["deleted"] == [sid]
        again = ask(ws, '{"type": "reset", "data": {"seed": 1}}')
        assert again["type"] == "observation" and again["data"]["observation"]["session_id"] != sid
        assert again["data"]["observation"]["text"] == first["text"]  # a new session with the same kwargs
        made = httpx.post(f"{server.url}/v1/envs", json={"env_id": CLUE, "kwargs": {"max_turns": 7}}).json()
        assert ask(ws, json.dumps({"type": "attach", "data": {"session_id": made["session_id"]}}))["type"] == \
            "observation"
        back = ask(ws, '{"type": "reset", "data": {"seed": 1, "kwargs": {"max_turns": 3}}}')["data"]["observation"]
        assert back["session_id"] != made["session_id"] and back["text"] == first["text"]  # max_turns=3, not 7
        gone = ask(ws, json.dumps({"type": "delete", "data": {"session_ids": [back["session_id"]] * 2}}))
        assert gone["data"] == {"deleted": [back["session_id"]], "missing": []}
    wait_sessions(server, 0)


def test_a_snapshot_of_another_env_is_refused_before_anything_is_built(server):
    with ForkyardEnvClient(base_url=base(server)).sync() as env:
        env.reset(seed=0)
        token = env.snapshot()
    with raw_session(server, FILEQA) as ws:  # this env-only server could not even build FileQA
        got = ask(ws, json.dumps({"type": "reset", "data": {"snapshot": token}}))
        assert got["data"]["http_status"] == 422 and f"is of {CLUE}" in got["data"]["message"]
    wait_sessions(server, 0)


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_remote_env_plays_alike_over_both_transports(server, transport):
    import gymnasium as gym

    from envs.core import EpisodeFinishedError

    env = gym.make(CLUE, max_turns=4, server_url=server.url, transport=transport).unwrapped
    local = ClueProbeEnv(max_turns=4)
    assert env.reset(seed=3) == local.reset(seed=3)
    assert env.observation_space.max_length == local.observation_space.max_length
    assert env.step("probe(0)") == local.step("probe(0)")
    kids, twins = env.fork(2), local.fork(2)
    for kid, twin, k in zip(kids, twins, (1, 2), strict=True):
        assert kid.step(f"probe({k})") == twin.step(f"probe({k})")
    assert env.step("probe(2)") == local.step("probe(2)")  # the parent goes on alone
    assert sessions(server) == 3
    with pytest.raises(ValueError, match="at most"):
        env.step("x" * 40_000)  # past the longest reply a door takes
    for _ in range(2):
        env.step("probe(1)")
    with pytest.raises(EpisodeFinishedError):
        env.step("probe(1)")
    for e in kids + [env]:
        e.close()
    wait_sessions(server, 0)
    with pytest.raises(ValueError, match="transport"):
        gym.make(CLUE, server_url=server.url, transport="carrier-pigeon")


def test_delete_refuses_other_connections_forks_and_other_env_ids(server):
    with raw_session(server) as a, raw_session(server) as c:
        ask(a, '{"type": "reset", "data": {"seed": 0}}')
        kids = ask(a, '{"type": "fork", "data": {"n": 2}}')["data"]["session_ids"]
        ask(c, '{"type": "reset", "data": {"seed": 0}}')
        refused = ask(c, json.dumps({"type": "delete", "data": {"session_ids": kids}}))
        assert refused["data"]["http_status"] == 409 and sessions(server) == 4  # nothing deleted
        other = httpx.post(f"{server.url}/v1/envs", json={"env_id": CLUE}).json()["session_id"]
        ok = ask(c, json.dumps({"type": "delete", "data": {"session_ids": [other]}}))  # no connection holds it
        assert ok["data"]["deleted"] == [other]
        bad_meta = ask(c, '{"type": "step", "data": {"action": "probe(0)", "metadata": 5}}')
        assert bad_meta["data"]["code"] == "VALIDATION_ERROR"
        before = ask(c, '{"type": "state", "data": {}}')["data"]["episode_id"]
        assert ask(c, '{"type": "reset", "data": {"kwargs": {"max_turns": "x"}}}')["type"] == "error"
        assert ask(c, '{"type": "state", "data": {}}')["data"]["episode_id"] == before  # a failed reset changes nothing
    wait_sessions(server, 0)


def test_a_closed_remote_env_says_so(server):
    import gymnasium as gym

    for transport in ("http", "ws"):
        env = gym.make(CLUE, server_url=server.url, transport=transport).unwrapped
        env.reset(seed=0)
        env.close()
        with pytest.raises(gym.error.ClosedEnvironmentError):
            env.reset(seed=0)
        with pytest.raises(gym.error.ClosedEnvironmentError):
            env.step("probe(0)")
    wait_sessions(server, 0)


def test_a_json_reply_sent_whole_as_the_step_data_is_read_as_the_action(server):
    """verifiers' ``openenv`` taskset sends a model's reply that is itself a JSON object as the whole step data:
    the env reads it like any action (field case S62); data that holds no call is the env's invalid action."""
    with connect(f"{base(server).replace('http', 'ws')}/ws") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        for data, turn, invalid in (({"name": "probe", "arguments": {"k": 1}}, 1, False),
                                    ({"type": "function", "function": {"name": "probe", "arguments": '{"k": 2}'}}, 2,
                                     False),
                                    ({"thoughts": "no call here"}, 3, True)):
            ws.send(json.dumps({"type": "step", "data": data}))
            got = json.loads(ws.recv(timeout=10))
            assert got["type"] == "observation", got
            info = got["data"]["observation"]["info"]
            assert info["turn"] == turn and info["invalid_action"] is invalid
        ws.send(json.dumps({"type": "step", "data": {}}))  # nothing at all: still the validation error
        assert json.loads(ws.recv(timeout=10))["data"]["code"] == "VALIDATION_ERROR"
