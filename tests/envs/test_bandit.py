"""Bandit-v0 (envs/suite/bandit.py): registration and Gymnasium's checker, the fork contract, RAGEN's payoffs,
seeding, single- and multi-turn episodes, hidden roles, evaluation resets, settings, tool calls, illegal actions and
the demonstrator's success rates."""

import json
import random
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from envs import check_fork_contract
from envs.suite.bandit import BanditEnv
from envs.tool_calls import call_to_action


def play(env, rng, skill, seed, options=None):
    env.reset(seed=seed, options=options)
    info = {}
    while not env.done:
        info = env.step(env.demo_action(rng, skill))[4]
    return info["episode_metrics"]


def test_registered_and_passes_gymnasium_checker():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gym.make("forkyard/Bandit-v0")
        assert (env.unwrapped.pulls, env.unwrapped.max_turns, env.unwrapped.names) == (1, 2, ("phoenix", "dragon"))
        check_env(env.unwrapped)
        check_env(gym.make("forkyard/Bandit-v0", pulls=4, hidden_roles=True).unwrapped)


@pytest.mark.parametrize("kwargs", [{}, {"pulls": 1, "max_turns": 1}, {"pulls": 5}, {"pulls": 4, "hidden_roles": True},
                                    {"pulls": 3, "max_turns": 6, "describe_arms": True, "lo_arm_name": "Trader",
                                     "hi_arm_name": "Librarian"}])
def test_fork_contract(kwargs):
    check_fork_contract(BanditEnv(**kwargs), seed=2)


def test_ragens_payoffs_and_single_turn_episode():
    env = BanditEnv()
    hi_wins, n = 0, 2000
    for seed in range(n):
        obs, info = env.reset(seed=seed)
        assert "phoenix" in obs and "dragon" in obs and "related to its name" in obs
        assert sorted(info["legal_actions"]) == ["pull('dragon')", "pull('phoenix')"]
        arm = "dragon" if seed % 2 else "phoenix"
        obs, r, term, trunc, info = env.step(f"pull({arm!r})")
        assert term and not trunc and info["termination_reason"] == "answered" and info["legal_actions"] == []
        assert f"pull({arm!r}) -> {r:g} points" in obs
        if arm == "phoenix":
            assert r == 0.1 and info["episode_metrics"]["success"] == 0.0
        else:
            assert r in (0.0, 1.0) and info["episode_metrics"]["success"] == 1.0
            hi_wins += r == 1.0
    assert abs(hi_wins / (n / 2) - 0.25) < 0.045  # binomial sd 0.014 over 1,000 pulls


def test_seeding_orders_the_arms_both_ways_and_options_fix_the_order():
    env = BanditEnv()
    firsts = {env.reset(seed=s)[1]["legal_actions"][0] for s in range(40)}
    assert firsts == {"pull('dragon')", "pull('phoenix')"}
    assert BanditEnv().reset(seed=9) == env.reset(seed=9)
    assert env.reset(seed=0, options={"hi_arm_first": True})[1]["legal_actions"][0] == "pull('dragon')"
    assert env.reset(seed=0, options={"hi_arm_first": False})[1]["legal_actions"][0] == "pull('phoenix')"
    for bad in ({"hi_arm_first": 1}, {"colour": 1}, {"hi_arm": "dragon"}):  # hi_arm needs hidden_roles
        with pytest.raises(ValueError):
            env.reset(seed=0, options=bad)


def test_multi_turn_pulls_sum_and_forks_branch_on_the_arm():
    env = BanditEnv(pulls=4)
    env.reset(seed=5)
    total = 0.0
    obs, r, term, trunc, info = env.step("pull('dragon')")
    total += r
    assert not term and not trunc and "Pull 2 of 4" in obs and f"total {total:g} after 1 pull(s)" in obs
    same, other = env.fork(2)
    assert same.step("pull('dragon')")[:2] == env.step("pull('dragon')")[:2]  # the RNG travels with the fork
    assert other.step("pull('phoenix')")[1] == 0.1
    env.step("pull('phoenix')")
    obs, r, term, trunc, info = env.step("pull('dragon')")
    assert term and not trunc and info["termination_reason"] == "answered"
    m = info["episode_metrics"]
    assert m["best_arm_share"] == 0.75 and m["success"] == 1.0
    assert m["total_reward"] == pytest.approx(sum(p for _, p in env._pulls))
    restored = BanditEnv(pulls=4)
    restored.restore(json.loads(same.snapshot().to_bytes()))
    assert restored.step("pull('phoenix')")[:4] == same.step("pull('phoenix')")[:4]


def test_a_refused_call_takes_a_turn_and_the_budget_truncates():
    env = BanditEnv(pulls=2)  # max_turns 3: one refused call may be retried
    env.reset(seed=0)
    env.step("pull('phoenix')")
    obs, r, term, trunc, info = env.step("pull('unicorn')")
    assert (term, trunc, r) == (False, False, 0.0) and "Pull 2 of 2 (turn 3 of 3)" in obs
    obs, r, term, trunc, info = env.step("pull('griffin')")
    assert (term, trunc, r, info["termination_reason"]) == (False, True, 0.0, "invalid")
    assert info["episode_metrics"]["best_arm_share"] == 0.0
    env = BanditEnv()  # RAGEN's single pull, with a turn to retry a refused call
    env.reset(seed=0)
    assert env.step("pull(")[2:4] == (False, False)
    assert env.step("pull('dragon')")[2]  # the retry ends the episode: the task is done


def test_hidden_roles_draw_the_high_risk_arm_per_episode():
    env = BanditEnv(pulls=2, hidden_roles=True)
    his = set()
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        assert "names say nothing" in obs
        his.add(env._hi)
    assert his == {"phoenix", "dragon"}
    env.reset(seed=0, options={"hi_arm": "phoenix"})
    assert env.step("pull('dragon')")[1] == 0.1


def test_describe_arms_states_the_payoffs():
    obs, _ = BanditEnv(describe_arms=True, lo_arm_score=0.2, hi_arm_hiscore=2).reset(seed=0)
    assert "phoenix pays 0.2 on every pull" in obs and "dragon pays 2 with probability 0.25, else 0" in obs


def test_evaluation_resets_balance_the_tasks():
    resets = BanditEnv.evaluation_resets({}, 10)
    assert len(resets) == 10 and sum(o["hi_arm_first"] for _, o in resets) == 5
    hidden = BanditEnv.evaluation_resets({"hidden_roles": True, "pulls": 3}, 2)
    assert len(hidden) == 4 and {(o["hi_arm_first"], o["hi_arm"]) for _, o in hidden} == {
        (True, "phoenix"), (True, "dragon"), (False, "phoenix"), (False, "dragon")}
    env = BanditEnv(hidden_roles=True, pulls=3)
    for seed, options in hidden:
        env.reset(seed=seed, options=options)
        assert env._hi == options["hi_arm"] and (env._order[0] == env._hi) == options["hi_arm_first"]
    with pytest.raises(ValueError):
        BanditEnv.evaluation_resets({"pulls": 0}, 4)


@pytest.mark.parametrize("kwargs, says", [
    ({"max_turns": 0}, "max_turns"), ({"max_turns": 201}, "max_turns"), ({"max_turns": True}, "max_turns"),
    ({"pulls": 3, "max_turns": 2}, "max_turns"), ({"pulls": 0}, "pulls"), ({"pulls": 101}, "pulls"),
    ({"pulls": 2.0}, "pulls"),
    ({"lo_arm_name": ""}, "lo_arm_name"), ({"hi_arm_name": "x" * 33}, "hi_arm_name"),
    ({"hi_arm_name": "Phoenix"}, "distinct"), ({"lo_arm_name": "a'b"}, "lo_arm_name"), ({"lo_arm_name": 3}, "lo_arm"),
    ({"lo_arm_score": float("nan")}, "lo_arm_score"), ({"hi_arm_hiscore": 1e9}, "hi_arm_hiscore"),
    ({"hi_arm_loscore": "0"}, "hi_arm_loscore"), ({"hi_arm_hiscore_prob": 1.5}, "prob"),
    ({"hi_arm_hiscore_prob": True}, "prob"), ({"describe_arms": 1}, "describe_arms"),
    ({"hidden_roles": "yes"}, "hidden_roles"),
])
def test_settings_are_validated(kwargs, says):
    with pytest.raises(ValueError, match=says):
        BanditEnv(**kwargs)


def test_tool_schemas_and_keyword_calls():
    env = BanditEnv(pulls=3)
    env.reset(seed=1)
    tools = env.tool_schemas()
    assert [t["function"]["name"] for t in tools] == ["pull"]
    assert tools[0]["function"]["parameters"]["properties"]["arm"]["enum"] == ["phoenix", "dragon"]
    assert call_to_action({"name": "pull", "arguments": {"arm": "dragon"}}, tools) == "pull('dragon')"
    for action in ("pull(arm='dragon')", "pull('DRAGON')", "pull(' Dragon ')"):
        obs, r, term, trunc, info = env.step(action)
        assert not info["invalid_action"] and obs.startswith("pull('dragon') ->")


@pytest.mark.parametrize("action, says", [
    ("pull('unicorn')", "needs arm"), ("pull(1)", "needs arm"), ("pull()", "needs arm"), ("spin('dragon')", "one tool"),
    ("pull('dragon', 'x')", "at most 1"), ("pull(side='dragon')", "no argument 'side'"), ("pull(", "could not parse"),
])
def test_illegal_actions_are_explained_and_cost_the_turn(action, says):
    env = BanditEnv(pulls=3)
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step(action)
    assert says in obs and r == 0.0 and not term and not trunc and info["invalid_action"] and info["turn"] == 1
    assert env._pulls == []


@pytest.mark.parametrize("kwargs, random_lo, random_hi", [
    ({}, 0.4, 0.6),  # measured: random 0.506 over 4,000 seeds
    ({"pulls": 5, "hidden_roles": True}, 0.4, 0.6),  # measured 0.506
    ({"pulls": 10, "hidden_roles": True}, 0.28, 0.48),  # measured 0.379 (a 5-5 split is no success)
    ({"lo_arm_score": 0.3}, 0.4, 0.6),  # the low-risk arm is the better one here
])
def test_demonstrator_success_rates(kwargs, random_lo, random_hi):
    env = BanditEnv(**kwargs)
    n = 300
    skilled, rand = random.Random(1), random.Random(2)  # one stream over the episodes
    good = [play(env, skilled, 1.0, s) for s in range(60)]
    assert all(m["success"] == 1.0 for m in good)
    if env.hidden_roles:  # one exploratory pull at most
        assert all(m["best_arm_share"] >= (env.pulls - 1) / env.pulls for m in good)
    else:
        assert all(m["best_arm_share"] == 1.0 for m in good)
    rate = sum(play(env, rand, 0.0, s)["success"] for s in range(n)) / n
    assert random_lo <= rate <= random_hi
    env.reset(seed=0)
    rng = random.Random(0)
    assert all(env.demo_action(rng, 0.5) in env.action_vocabulary for _ in range(20))
    with pytest.raises(ValueError, match="skill"):
        env.demo_action(rng, -0.1)
