"""Field case S62 at the REST doors, on a real uvicorn on loopback: ``POST /v1/envs/{id}/step`` and the batched
step read a model's reply and a JSON call object with the env's one reader, as the in-process env does; what
cannot be read is the env's invalid-action observation (200), never a 422 or a 500."""

from __future__ import annotations

import httpx
import pytest

from envs.clueprobe import ClueProbeEnv
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread

CLUE = "forkyard/ClueProbe-v0"
REPLY = 'Bit 1 next.\n<tool_call>\n{"name": "probe", "arguments": {"k": 1}}\n</tool_call>'
FORMS = ["probe(k=1)", REPLY, '{"name": "probe", "arguments": {"k": 1}}',
         {"name": "probe", "arguments": {"k": 1}},
         {"type": "function", "function": {"name": "probe", "arguments": '{"k": 1}'}},
         [{"name": "probe", "arguments": {"k": 1}}]]


@pytest.fixture(scope="module")
def server():
    srv = UvicornThread(create_env_app(ttl_s=600)).start()
    yield srv
    srv.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def _session(http, seed: int) -> str:
    made = http.post("/v1/envs", json={"env_id": CLUE, "seed": seed, "kwargs": {"max_turns": 4}})
    assert made.status_code == 201, made.text
    return made.json()["session_id"]


def _local(seed: int, action: str) -> tuple:
    env = ClueProbeEnv(max_turns=4)
    env.reset(seed=seed)
    return env.step(action)


@pytest.mark.parametrize("form", FORMS, ids=range(len(FORMS)))
def test_field_case_s62_rest_step_reads_every_form_as_the_env_does(http, form):
    sid = _session(http, 9)
    got = http.post(f"/v1/envs/{sid}/step", json={"action": form})
    assert got.status_code == 200, got.text
    obs, reward, term, trunc, info = _local(9, "probe(1)")
    body = got.json()
    assert (body["observation"], body["reward"], body["terminated"], body["truncated"]) == (obs, reward, term, trunc)
    assert body["info"] == info and body["info"]["invalid_action"] is False
    http.delete(f"/v1/envs/{sid}")


@pytest.mark.parametrize("form, says", [
    ({"name": "peek", "arguments": {}}, "unknown tool 'peek'"),
    ({"name": "probe", "arguments": {"j": 1}}, "has no argument 'j'"),
    ([], "an empty JSON array"),
    ("probe(j=1)", "probe(k) with an int k in 0..2"),
    ('{"name": "probe", "arguments": {"k": 1}}\n{"name": "probe", "arguments": {"k": 2}}', "2 tool calls"),
])
def test_field_case_s62_rest_refusals_are_observations(http, form, says):
    sid = _session(http, 2)
    got = http.post(f"/v1/envs/{sid}/step", json={"action": form})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["info"]["invalid_action"] is True and says in body["observation"], body["observation"]
    assert body["reward"] == ClueProbeEnv.invalid_action_reward and body["info"]["turn"] == 1
    http.delete(f"/v1/envs/{sid}")


def test_field_case_s62_batched_step_reads_every_form_and_keeps_its_422s(http):
    sids = [_session(http, 9) for _ in FORMS]
    items = [{"session_id": s, "action": f} for s, f in zip(sids, FORMS, strict=True)]
    items += [{"session_id": sids[0], "action": 5}, {"session_id": sids[0], "action": None}]
    got = http.post("/v1/envs/batch/step", json={"items": items})
    assert got.status_code == 200, got.text
    results = got.json()["results"]
    obs = _local(9, "probe(1)")[0]
    for r in results[:len(FORMS)]:
        assert r["status_code"] == 200 and r["result"]["observation"] == obs
        assert r["result"]["info"]["invalid_action"] is False
    assert [r["status_code"] for r in results[len(FORMS):]] == [422, 422]  # neither text nor a JSON call
    for s in sids:
        http.delete(f"/v1/envs/{s}")


def test_a_number_or_null_as_the_action_is_still_a_422(http):
    sid = _session(http, 1)
    for bad in (5, None, True):
        got = http.post(f"/v1/envs/{sid}/step", json={"action": bad})
        assert got.status_code == 422 and "action" in got.json()["detail"]
    assert http.get(f"/v1/envs/{sid}").json()["turn"] == 0
    http.delete(f"/v1/envs/{sid}")
