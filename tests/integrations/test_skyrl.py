"""forkyard envs as SkyRL-gym ``BaseTextEnv``s (envs/skyrl.py; skyrl-gym pinned in the ``integrations``
extra), driven exactly as SkyRL's generator drives an env: ``skyrl_gym.make(env_class, env_config=...,
extras=...)``, ``init(prompt)``, ``step(model_output)`` until ``done`` with the observations appended to the
chat history, ``close()``. In this process and on a server over HTTP, ClueProbe and FileQA (local backend)."""

from __future__ import annotations

import json
import re

import pytest
import skyrl_gym

import envs.skyrl  # noqa: F401 - registers "forkyard" in SkyRL-gym's registry
from envs.clueprobe import ClueProbeEnv
from sandbox_server.app import create_env_app
from tests.docker_support import UvicornThread, require_bwrap

CLUE = "forkyard/ClueProbe-v0"


def call(name: str, **arguments) -> str:
    """Model output as Qwen-style chat templates write a tool call."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def generate(env, prompt: list[dict], replies) -> tuple[list[dict], list[float]]:
    """SkyRL's generator loop with a scripted 'model' (``replies(chat_history) -> text``): the chat history
    it builds (the model's own text kept as it was written) and the per-step rewards."""
    chat, _ = env.init(prompt)
    rewards, done = [], False
    while not done:
        output = replies(chat)
        out = env.step(output)
        assert out.get("postprocessed_action") is None  # the model's own tokens are what is trained on
        chat = chat + [{"role": "assistant", "content": output}] + out["observations"]
        rewards.append(out["reward"])
        done = out["done"]
    env.close()
    return chat, rewards


def solver(chat: list[dict]) -> str:
    """Probe bits 0..2, then answer the target they spell (ClueProbe, max_turns=4)."""
    bits = re.findall(r"bit (\d) of the target is (\d)", " ".join(m["content"] for m in chat))
    if len(bits) < 3:
        return call("probe", k=len(bits))
    return call("answer", c=sum(int(v) << int(k) for k, v in bits))


def test_clueprobe_episodes_as_skyrls_generator_runs_them():
    for seed in range(3):
        env = skyrl_gym.make("forkyard", env_config={"env_id": CLUE, "kwargs": {"max_turns": 4}}, extras={"seed": seed})
        chat, rewards = generate(env, [{"role": "user", "content": "Find the target."}], solver)
        assert rewards == [0.0, 0.0, 0.0, 1.0]
        local = ClueProbeEnv(max_turns=4)
        assert chat[0]["content"] == "Find the target.\n" + local.reset(seed=seed)[0]
        assert chat[-1]["role"] == "assistant" and chat[-1]["content"].startswith("<tool_call>")
        assert env.get_metrics() == {"turns": 4, "answered": 1.0}


def test_unparseable_output_gets_the_envs_invalid_action_observation():
    env = skyrl_gym.make("forkyard", env_config={"env_id": CLUE, "kwargs": {"max_turns": 3}}, extras={"seed": 0})
    env.init([{"role": "user", "content": ""}])
    out = env.step("I think the answer is five")
    assert out["reward"] == 0.0 and not out["done"] and out["metadata"]["invalid_action"] is True
    assert "Invalid action" in out["observations"][0]["content"]
    out = env.step(call("probe", k="x"))
    assert out["metadata"]["invalid_action"] is True
    env.close()
    with pytest.raises(ValueError, match="env_id"):
        skyrl_gym.make("forkyard", env_config={}, extras={})


def test_fork_gives_independent_adapters():
    env = skyrl_gym.make("forkyard", env_config={"env_id": CLUE, "kwargs": {"max_turns": 4}}, extras={"seed": 5})
    env.init([{"role": "user", "content": ""}])
    env.step(call("probe", k=0))
    a, b = env.fork(2)
    assert a.step(call("probe", k=1))["observations"] != b.step(call("probe", k=2))["observations"]
    assert env.env.turn == 1 and a.env.turn == b.env.turn == 2
    for e in (a, b, env):
        e.close()


def test_on_a_server_sessions_end_with_close():
    srv = UvicornThread(create_env_app()).start()
    try:
        env = skyrl_gym.make("forkyard", env_config={"env_id": CLUE, "kwargs": {"max_turns": 4}, "server_url": srv.url},
                             extras={"extra_info": {"seed": 2}})
        _, rewards = generate(env, [{"role": "user", "content": "Find the target."}], solver)
        assert rewards[-1] == 1.0
        assert len(srv.server.config.app.state.env_sessions) == 0
    finally:
        srv.stop()


def test_fileqa_on_the_local_backend():
    require_bwrap()
    from sandbox_server.embedded import shared_provider

    env = skyrl_gym.make("forkyard", env_config={"env_id": "forkyard/FileQA-v0", "kwargs": {
        "backend": "local", "kinds": ["line_count"], "max_turns": 3}}, extras={"seed": 1})
    path = {}

    def replies(chat: list[dict]) -> str:
        if not path:
            path["p"] = re.search(r"/data/(\S+) have", chat[0]["content"]).group(1)
            return call("wc", path=path["p"])
        return call("answer", value=int(re.search(r"^\s*(\d+)", chat[-1]["content"], re.M).group(1)))

    _, rewards = generate(env, [{"role": "user", "content": ""}], replies)
    assert rewards == [0.0, 1.0]
    assert shared_provider("local").list() == []


def test_omegaconf_configs_as_skyrl_passes_them_reach_a_server_as_plain_json():
    require_bwrap()
    from omegaconf import OmegaConf

    from sandbox_server.embedded import shared_provider

    provider = shared_provider("local")
    srv = UvicornThread(create_env_app(sandbox_provider=provider)).start()
    try:
        cfg = OmegaConf.create({"env_id": "forkyard/FileQA-v0", "server_url": srv.url,
                                "kwargs": {"kinds": ["line_count"], "max_turns": 2}})
        env = skyrl_gym.make("forkyard", env_config=cfg, extras=OmegaConf.create({"extra_info": {"seed": 4}}))
        prompt, meta = env.init([{"role": "user", "content": ""}])
        assert "How many lines" in prompt[-1]["content"] and meta["tools"]
        env.close()
        assert len(srv.server.config.app.state.env_sessions) == 0
    finally:
        srv.stop()


@pytest.mark.parametrize("extras, seed", [({"seed": 3}, 3), ({"seed": "7"}, 7),
                                          ({"seed": None, "extra_info": {"seed": 2}}, 2), ({}, None)])
def test_row_seeds(extras, seed):
    env = skyrl_gym.make("forkyard", env_config={"env_id": CLUE}, extras=extras)
    assert env.seed == seed
    env.close()


@pytest.mark.parametrize("bad", [{"seed": 1.5}, {"seed": True}, {"seed": -1}, {"seed": "abc"}, {"seed": [1]}])
def test_bad_row_seeds_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="extras.seed must be a non-negative integer"):
        skyrl_gym.make("forkyard", env_config={"env_id": CLUE}, extras=bad)
    with pytest.raises(ValueError, match="kwargs must be a mapping"):
        skyrl_gym.make("forkyard", env_config={"env_id": CLUE, "kwargs": [1]}, extras={})
