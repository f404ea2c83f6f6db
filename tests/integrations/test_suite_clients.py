"""Every registered forkyard env through every client, with no per-env glue: one seeded episode of random legal
play (tests/suite_support.py) is played in this process, then replayed and compared step by step (observation,
reward, terminated / truncated, info) over ``/v1/envs`` (``gymnasium.make(id, server_url=...)``, with a fork and a
sealed snapshot restored there), over OpenEnv's unmodified ``GenericEnvClient`` (and a fork over the same WebSocket
transport, ``ForkyardEnvClient``), through the TRL factory's tool methods called as TRL calls them
(``envs.trl.environment_factory``: keyword arguments parsed from a JSON tool call) and through the SkyRL adapter
(``skyrl_gym.make("forkyard", ...)``: tool calls in model output, and a fork). The server's listings come from the
catalog. Then one real 2-step ``GRPOTrainer`` run on each of two suite envs (:data:`GRPO_ENVS`), with a tiny Qwen3
SFT'd on both envs' demonstrations (the helpers of tests/integrations/test_trl.py).

One real uvicorn server on loopback (sandboxed envs take the local backend's shared provider, as a served FileQA
does) and one model serve the whole module."""

from __future__ import annotations

import copy
import gc
import json
import time

import gymnasium as gym
import httpx
import pytest
import skyrl_gym
from openenv.core.generic_client import GenericEnvClient
from transformers.utils import get_json_schema

import envs
import envs.skyrl  # noqa: F401 - registers "forkyard" in SkyRL-gym's registry
from envs.catalog import catalog
from envs.openenv_client import ForkyardEnvClient
from envs.tool_calls import action_to_call
from envs.trl import environment_factory
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread, bwrap_reason
from tests.integrations.test_trl import PROMPT, check_run, grpo, tiny_policy
from tests.suite_support import SEED, id_params, plain, require_infra, scripted_episode, settings, suite_ids

#: The two suite envs of the GRPO runs: fast ones, with short tool calls.
GRPO_ENVS = ["forkyard/Sokoban-v0", "forkyard/FrozenLake-v0"]


@pytest.fixture(scope="module")
def server():
    """One env server for the module; with bubblewrap, the local backend's shared provider for sandboxed envs."""
    provider = None
    if bwrap_reason() is None:
        from sandbox_server.embedded import shared_provider

        provider = shared_provider("local")
    srv = UvicornThread(create_env_app(ttl_s=600, max_sessions=256, sandbox_provider=provider)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def episodes() -> dict[str, dict]:
    """The scripted episode of each id, played once in this process (lazily)."""
    return {}


def episode(episodes: dict[str, dict], env_id: str) -> dict:
    require_infra(env_id)
    if env_id not in episodes:
        episodes[env_id] = scripted_episode(env_id)
    return episodes[env_id]


def held(srv) -> int:
    return len(srv.server.config.app.state.env_sessions)


# ------------------------------------------------------------------------------------ the server's listings
def test_the_server_lists_the_catalog_over_v1_envs_and_openenvs_route(server):
    ids = suite_ids()
    listed = httpx.get(f"{server.url}/v1/envs").json()
    assert [e["env_id"] for e in listed] == ids
    cards = {c.env_id: c for c in catalog(tools=False)}
    for item in listed:
        card = cards[item["env_id"]]
        assert (item["kwargs"], item["fork_method"], item["sandboxed"], item["max_turns"]) == (
            card.kwargs, card.fork_method, card.sandboxed, card.max_turns)
        assert [s["name"] for s in item["settings"]] == [s.name for s in card.settings]
        assert "tools" not in item and "entry_point" not in item  # tools are a session's (GET .../tools)
    names = httpx.get(f"{server.url}/openenv/list_environments").json()
    assert names == ids  # OpenEnv's listing: a JSON list of names
    for name in names:  # each name is the path of its OpenEnv base
        assert httpx.get(f"{server.url}/openenv/{name}/health").json() == {"status": "healthy"}


# ------------------------------------------------------------------------------------ /v1/envs
def same_step(got: tuple, want: tuple, where: str) -> None:
    obs, reward, terminated, truncated, info = got
    assert (obs, float(reward), bool(terminated), bool(truncated), plain(info)) == tuple(want), where


@pytest.mark.parametrize("env_id", id_params())
def test_an_episode_a_fork_and_a_snapshot_over_v1_envs(env_id, server, episodes):
    ep = episode(episodes, env_id)
    k = len(ep["actions"]) // 2  # fork and snapshot here
    remote = gym.make(env_id, server_url=server.url, **settings(env_id)).unwrapped
    kids = []
    try:
        obs, info = remote.reset(seed=SEED)
        assert (obs, plain(info)) == tuple(ep["first"])
        for i, action in enumerate(ep["actions"][:k]):
            same_step(remote.step(action), ep["steps"][i], f"{env_id} over /v1/envs, step {i}")
        kids = remote.fork(2)
        token = httpx.post(f"{server.url}/v1/envs/{remote.session_id}/snapshot").json()["snapshot"]
        for i, action in enumerate(ep["actions"][k:], k):  # the parent and a child play on alike
            same_step(remote.step(action), ep["steps"][i], f"{env_id}: the parent, step {i}")
            same_step(kids[0].step(action), ep["steps"][i], f"{env_id}: a fork's child, step {i}")
        restored = httpx.post(f"{server.url}/v1/envs/restore", json={"snapshot": token})
        assert restored.status_code == 201, restored.text
        want = ep["steps"][k - 1][0] if k else ep["first"][0]
        assert restored.json()["observation"] == want  # the state the snapshot sealed, not the parent's later one
        sid = restored.json()["session_id"]
        again = httpx.post(f"{server.url}/v1/envs/{sid}/reset", json={"seed": SEED}).json()
        assert (again["observation"], plain(again["info"])) == tuple(ep["first"])  # a seeded reset, round trip
        assert httpx.delete(f"{server.url}/v1/envs/{sid}").status_code == 204
    finally:
        for e in [remote, *kids]:
            e.close()
    assert held(server) == 0


# ------------------------------------------------------------------------------------ OpenEnv's client
@pytest.mark.parametrize("env_id", id_params())
def test_openenvs_generic_client_plays_the_episode_and_the_fork_extension_forks_it(env_id, server, episodes):
    ep = episode(episodes, env_id)
    base = f"{server.url}/openenv/{env_id}"
    with GenericEnvClient(base_url=base, message_timeout_s=120).sync() as env:
        first = env.reset(seed=SEED, kwargs=settings(env_id))
        assert (first.observation["text"], plain(first.observation["info"]), first.done) == (*ep["first"], False)
        for i, action in enumerate(ep["actions"]):
            got = env.step({"action": action})
            o = got.observation
            same_step((o["text"], got.reward, o["terminated"], o["truncated"], o["info"]), ep["steps"][i],
                      f"{env_id} over OpenEnv, step {i}")
            assert got.done == (o["terminated"] or o["truncated"])
    k = len(ep["actions"]) - 1  # fork before the last step: the child takes it
    with ForkyardEnvClient(base_url=base, message_timeout_s=120).sync() as env:
        env.reset(seed=SEED, kwargs=settings(env_id))
        for action in ep["actions"][:k]:
            env.step({"action": action})
        child = env.fork(1)[0]
        with ForkyardEnvClient(base_url=base, message_timeout_s=120).sync() as branch:
            at = branch.attach(child).observation
            assert at["text"] == (ep["steps"][k - 1][0] if k else ep["first"][0])
            got = branch.step({"action": ep["actions"][k]})
            o = got.observation
            same_step((o["text"], got.reward, o["terminated"], o["truncated"], o["info"]), ep["steps"][k],
                      f"{env_id}: a fork's child over OpenEnv's transport")
    deadline = time.monotonic() + 10
    while held(server) and time.monotonic() < deadline:  # the connections' sessions go with them, shortly after
        time.sleep(0.02)
    assert held(server) == 0


# ------------------------------------------------------------------------------------ TRL, SkyRL
def json_call(action: str, tools: list[dict]) -> dict:
    """The tool call a model writes for ``action``, as it arrives: JSON text, parsed."""
    return json.loads(json.dumps(action_to_call(action, tools)))


@pytest.mark.parametrize("env_id", id_params())
def test_the_trl_factorys_tool_methods_play_the_episode_as_trl_calls_them(env_id, episodes):
    ep = episode(episodes, env_id)
    Env = environment_factory(env_id, **settings(env_id))
    tools = Env._tools
    for tool in tools:  # TRL describes each method to the model from its signature and docstring
        assert get_json_schema(getattr(Env, tool["function"]["name"]))["function"]["name"] == tool["function"]["name"]
    env = Env()
    try:
        assert env.reset(seed=SEED, prompt=[{"role": "user", "content": ""}]) == ep["first"][0]  # the row's columns
        for i, action in enumerate(ep["actions"]):
            call = json_call(action, tools)
            assert getattr(env, call["name"])(**call["arguments"]) == ep["steps"][i][0], f"{env_id}: {action}"
        assert env.done and env.get_reward() == pytest.approx(sum(s[1] for s in ep["steps"]))
    finally:
        env._release()


@pytest.mark.parametrize("env_id", id_params())
def test_the_skyrl_adapter_plays_the_episode_and_forks(env_id, episodes):
    ep = episode(episodes, env_id)
    env = skyrl_gym.make("forkyard", env_config={"env_id": env_id, "kwargs": settings(env_id)}, extras={"seed": SEED})
    twins = []
    try:
        prompt, meta = env.init([{"role": "user", "content": ""}])
        assert prompt[-1]["content"] == ep["first"][0]
        tools = meta["tools"]
        assert tools, f"{env_id}: SkyRL's chat template gets no tools"
        k = len(ep["actions"]) - 1
        for i, action in enumerate(ep["actions"]):
            if i == k:
                twins = env.fork(1)
            output = f"<tool_call>\n{json.dumps(json_call(action, tools))}\n</tool_call>"
            for adapter in [env, *twins]:
                out = adapter.step(output)
                obs, reward, terminated, truncated, info = ep["steps"][i]
                assert (out["reward"], out["done"], plain(out["metadata"])) == (reward, terminated or truncated, info)
                assert out["observations"] == ([] if out["done"] else [{"role": "user", "content": obs}])
    finally:
        for adapter in [env, *twins]:
            adapter.close()


# ------------------------------------------------------------------------------------ GRPO
#: The GRPO runs' env settings: two-move episodes (fast rollouts, short completions).
GRPO_SETTINGS = {"max_turns": 2}


def first_call_chats(env_id: str, n: int) -> tuple[list[list[dict]], list[dict]]:
    """``n`` one-turn chats of ``env_id`` (seeds 0..n-1): the first observation, then the tool call of the first
    legal action; and the env's tools. What the SFT teaches is the tool-call form after a long prompt (a constant
    call per env learns in a fraction of the steps whole demonstrations take, tests/integrations/test_trl.py)."""
    env = gym.make(env_id, **{**settings(env_id), **GRPO_SETTINGS}).unwrapped
    tools, chats = env.tool_schemas(), []
    try:
        for seed in range(n):
            obs, info = env.reset(seed=seed)
            call = action_to_call(info["legal_actions"][0], tools)
            chats.append([{"role": "user", "content": PROMPT + obs},
                          {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]}])
    finally:
        env.close()
    return chats, tools


@pytest.fixture(scope="module")
def policy():
    """A tiny Qwen3 SFT'd to call the tools of both GRPO envs (each chat rendered with its env's tools)."""
    missing = [i for i in GRPO_ENVS if i not in envs.forkyard_specs()]
    assert not missing, f"the GRPO envs {missing} are not registered"
    chats, tools = [], []
    for env_id in GRPO_ENVS:
        c, t = first_call_chats(env_id, 16)
        chats, tools = chats + c, tools + [t] * len(c)
    return tiny_policy(chats, tools, steps=150, batch=4, max_loss=1.0)  # 28 of 32 sampled replies parse (measured)


@pytest.mark.slow
@pytest.mark.parametrize("env_id", GRPO_ENVS)
def test_two_grpo_steps_in_trls_trainer(env_id, policy, tmp_path):
    model, tok = policy
    factory = environment_factory(env_id, **{**settings(env_id), **GRPO_SETTINGS})
    model = copy.deepcopy(model)  # each run starts from the SFT'd weights (a run trains its model)
    trainer = grpo(tmp_path, model, tok, factory, list(range(4)), max_completion_length=128)
    check_run(trainer, "".join(ch for ch in env_id.split("/")[1] if ch.isalnum()))
    del trainer
    gc.collect()
