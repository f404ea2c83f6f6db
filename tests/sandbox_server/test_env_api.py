"""Env sessions over a real uvicorn on loopback, and the remote Gymnasium client (S10, S11, 4xx paths)."""

import gymnasium as gym
import httpx
import pytest
from gymnasium.utils.env_checker import check_env

from envs import EnvInfraError, EpisodeFinishedError, RemoteEnv
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread


@pytest.fixture(scope="module")
def server():
    srv = UvicornThread(create_env_app(ttl_s=600)).start()
    yield srv
    srv.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def new(http, seed, **kwargs):
    r = http.post("/v1/envs", json={"env_id": "forkyard/ClueProbe-v0", "kwargs": kwargs, "seed": seed})
    assert r.status_code == 201, r.text
    return r.json()


def test_list_envs(http):
    listed = {e["env_id"]: e["kwargs"] for e in http.get("/v1/envs").json()}
    assert listed["forkyard/ClueProbe-v0"] == {"max_turns": 5, "bits": 3}


def test_s10_sessions_are_independent(http):
    a, b = new(http, 1), new(http, 2)
    assert a["session_id"] != b["session_id"]
    for action in ("probe(0)", "probe(1)", "probe(2)"):
        r = http.post(f"/v1/envs/{a['session_id']}/step", json={"action": action}).json()
        assert r["session_id"] == a["session_id"]
    assert r["info"]["turn"] == 3
    sb = http.get(f"/v1/envs/{b['session_id']}").json()
    assert sb["turn"] == 0 and not sb["done"]
    assert http.get("/v1/envs/nope").status_code == 404
    # Same seed, same episode: the server env follows the seed like a local one.
    local = gym.make("forkyard/ClueProbe-v0").unwrapped
    obs, info = local.reset(seed=1)
    assert (obs, info["anchor_key"]) == (a["observation"], a["info"]["anchor_key"])


@pytest.mark.parametrize(
    "method, path, body, status, says",
    [
        ("post", "/v1/envs", {"env_id": "forkyard/Nope-v0"}, 404, "unknown env id"),
        ("post", "/v1/envs", {"env_id": "forkyard/ClueProbe-v0", "kwargs": {"max_turns": 0}}, 422, "max_turns"),
        ("post", "/v1/envs", {"env_id": "forkyard/ClueProbe-v0", "kwargs": {"color": 1}}, 422, "color"),
        ("post", "/v1/envs", {"kwargs": {}}, 422, "env_id"),
        ("post", "/v1/envs", {"env_id": "forkyard/ClueProbe-v0", "seed": -1}, 422, "seed"),
        ("post", "/v1/envs", {"env_id": "forkyard/ClueProbe-v0", "kwargs": {"max_turns": True}}, 422, "max_turns"),
        ("post", "/v1/envs",
         {"env_id": "forkyard/ClueProbe-v0", "kwargs": {"max_turns": 5, "max_episode_steps": 2}}, 422,
         "max_episode_steps"),
        ("post", "/v1/envs", {"env_id": "forkyard/FileQA-v0"}, 422, "no sandbox service"),
        ("post", "/v1/envs/unknown/step", {"action": "probe(0)"}, 404, "no env session"),
        ("post", "/v1/envs/unknown/reset", {"seed": 1}, 404, "no env session"),
        ("post", "/v1/envs/unknown/fork", {"n": 1}, 404, "no env session"),
        ("delete", "/v1/envs/unknown", None, 404, "no env session"),
    ],
)
def test_error_paths(http, method, path, body, status, says):
    r = http.request(method.upper(), path, json=body)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"detail", "status"} and says in r.json()["detail"]


def test_bad_requests_leave_the_session_unchanged(http):
    s = new(http, 3, max_turns=2)
    sid = s["session_id"]
    r = http.post(f"/v1/envs/{sid}/step", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = http.post(f"/v1/envs/{sid}/step", json={"action": "x" * 40_000})
    assert r.status_code == 413 and "at most 32768" in r.json()["detail"]
    r = http.post(f"/v1/envs/{sid}/fork", json={"n": 0})
    assert r.status_code == 422
    for bad in ({"n": True}, {"n": 2.0}):
        assert http.post(f"/v1/envs/{sid}/fork", json=bad).status_code == 422
    assert http.post(f"/v1/envs/{sid}/reset", json={"seed": -1}).status_code == 422
    assert http.get(f"/v1/envs/{sid}").json()["turn"] == 0
    http.post(f"/v1/envs/{sid}/step", json={"action": "probe(0)"})
    end = http.post(f"/v1/envs/{sid}/step", json={"action": "answer(1)"}).json()
    assert end["terminated"] and end["info"]["termination_reason"] == "answered"
    r = http.post(f"/v1/envs/{sid}/step", json={"action": "answer(1)"})
    assert r.status_code == 409 and "ended" in r.json()["detail"]
    assert http.post(f"/v1/envs/{sid}/reset", json={"seed": 3}).json()["info"]["turn"] == 0
    assert http.delete(f"/v1/envs/{sid}").status_code == 204
    assert http.get(f"/v1/envs/{sid}").status_code == 404


def test_s11_fork_through_http(http):
    s = new(http, 0)
    sid = s["session_id"]
    http.post(f"/v1/envs/{sid}/step", json={"action": "probe(0)"})
    child = http.post(f"/v1/envs/{sid}/fork", json={"n": 1}).json()["session_ids"][0]
    c = http.post(f"/v1/envs/{child}/step", json={"action": "probe(1)"}).json()
    p = http.post(f"/v1/envs/{sid}/step", json={"action": "probe(2)"}).json()
    assert c["info"]["turn"] == p["info"]["turn"] == 2
    assert c["info"]["anchor_key"] != p["info"]["anchor_key"]
    assert http.delete(f"/v1/envs/{child}").status_code == 204
    assert http.get(f"/v1/envs/{sid}").json()["turn"] == 2  # closing the child keeps the parent
    kids = http.post(f"/v1/envs/{sid}/fork", json={"n": 8}).json()["session_ids"]
    obs = {http.post(f"/v1/envs/{k}/step", json={"action": "probe(0)"}).json()["observation"] for k in kids}
    assert len(obs) == 1


def test_remote_env_through_gymnasium_make(server):
    env = gym.make("forkyard/ClueProbe-v0", server_url=server.url, max_turns=3).unwrapped
    assert isinstance(env, RemoteEnv)
    obs, info = env.reset(seed=5)
    local = gym.make("forkyard/ClueProbe-v0", max_turns=3).unwrapped
    lobs, linfo = local.reset(seed=5)
    assert (obs, info) == (lobs, linfo)
    for action in ("probe(1)", "probe(2)"):
        assert env.step(action) == local.step(action)
    a, b = env.fork(2)
    ra, rb = a.step("answer(3)"), b.step("answer(4)")
    assert ra[2] and rb[2] and ra[1] + rb[1] <= 1.0
    with pytest.raises(EpisodeFinishedError):
        a.step("answer(3)")
    assert env.step("answer(3)") == local.step("answer(3)")
    env.close()  # closing the parent first keeps its forks usable
    assert b.reset(seed=1)[1]["turn"] == 0
    for e in (a, b):
        e.close()
    assert a._client.is_closed


def test_remote_env_passes_check_env(server):
    env = gym.make("forkyard/ClueProbe-v0", server_url=server.url).unwrapped
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env, skip_render_check=True)
    env.close()


def test_server_failure_is_an_infra_error():
    env = RemoteEnv("forkyard/ClueProbe-v0", "http://127.0.0.1:9", timeout_s=2, connect_retries=0)
    with pytest.raises(EnvInfraError):
        env.reset(seed=0)
    env.close()


def test_trainer_runs_unchanged_against_remote_envs(server):
    from trainer.tabular_config import TrainConfig
    from trainer.train import train

    local = train(TrainConfig(estimator="tree", env_kwargs={"max_turns": 3}, iterations=4, seed=2, device="cpu"))
    remote = train(TrainConfig(estimator="tree", env_kwargs={"max_turns": 3}, iterations=4, seed=2, device="cpu",
                               server_url=server.url))
    assert [m["reward_mean"] for m in remote.metrics] == [m["reward_mean"] for m in local.metrics]
    assert [m["env_calls"] for m in remote.metrics] == [m["env_calls"] for m in local.metrics]
    assert remote.evaluation == local.evaluation
