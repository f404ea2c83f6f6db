"""Countdown-v0 (envs/suite/countdown.py): registration and Gymnasium's checker, the fork contract, the safe
expression reader, puzzles solvable by construction, RAGEN's rewards, the single-turn menu, multi-turn combinations,
settings, tool calls, illegal actions and the demonstrator's success rates."""

import json
import random
import warnings
from fractions import Fraction

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs import check_fork_contract
from envs.suite.countdown import CountdownEnv, ExpressionError, evaluate, expression_of, generate_puzzle, solve
from envs.tool_calls import call_to_action


def play(env, rng, skill, seed):
    env.reset(seed=seed)
    info = {}
    while not env.done:
        info = env.step(env.demo_action(rng, skill))[4]
    return info["episode_metrics"]["success"]


def puzzle(env, nums, target):
    """Give ``env`` (after a reset) the puzzle ``nums`` -> ``target`` through its state codec."""
    snap = env.snapshot()
    snap.state["task"].update(nums=list(nums), target=target, pool=list(nums))
    env.restore(snap)


def test_registered_and_passes_gymnasium_checker():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gym.make("forkyard/Countdown-v0")
        assert (env.unwrapped.mode, env.unwrapped.num_count, env.unwrapped.max_turns) == ("single", 4, 2)
        check_env(env.unwrapped)
        multi = gym.make("forkyard/Countdown-v0", mode="multi", num_count=3).unwrapped
        assert multi.max_turns == 3
        check_env(multi)


@pytest.mark.parametrize("kwargs", [{}, {"mode": "single", "max_turns": 1}, {"mode": "multi"},
                                    {"mode": "multi", "num_count": 5, "use_all": False},
                                    {"mode": "multi", "num_count": 3, "max_turns": 4, "max_number": 20}])
def test_fork_contract(kwargs):
    check_fork_contract(CountdownEnv(**kwargs), seed=1)


@pytest.mark.parametrize("text, value, numbers", [
    ("(8 - 2) * 4", Fraction(24), [8, 2, 4]),
    ("7 / 2 + 1", Fraction(9, 2), [7, 2, 1]),
    ("-3 + 5", Fraction(2), [3, 5]),
    ("1 / (2 - 2)", None, [1, 2, 2]),
    (" 12 ", Fraction(12), [12]),
])
def test_expressions_are_read_exactly(text, value, numbers):
    assert evaluate(text) == (value, numbers)


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "2 ** 10", "1.5 + 2", "x + 1", "abs(-3)",
                                  "[1, 2]", "3 // 2", "3 % 2", "lambda: 1", "(1 +", "True + 1", "1" * 201,
                                  "(" * 150 + "1" + ")" * 150, "1 if 1 else 2", "'a' + 'b'"])
def test_anything_but_arithmetic_is_refused(text):
    with pytest.raises(ExpressionError):
        evaluate(text)


@pytest.mark.parametrize("kwargs", [{}, {"num_count": 3}, {"num_count": 5}, {"use_all": False},
                                    {"min_number": 1, "max_number": 9, "max_target": 50},
                                    {"min_number": 2, "max_number": 2, "use_all": False}])
def test_puzzles_follow_the_settings_and_are_solvable_by_construction(kwargs):
    env = CountdownEnv(**kwargs)
    targets = []
    for seed in range(40):
        env.reset(seed=seed)
        nums, target = env._nums, env._target
        assert len(nums) == env.num_count and all(env.min_number <= n <= env.max_number for n in nums)
        assert target >= 1 and (env.use_all or target not in nums)
        plan = solve(tuple(sorted(nums)), target, env.use_all)
        assert plan is not None
        value, used = evaluate(expression_of(nums, plan))
        assert value == target and (sorted(used) == sorted(nums) if env.use_all else set(used) <= set(nums))
        targets.append(target)
    if env.max_number > env.min_number:
        assert np.mean([t <= env.max_target for t in targets]) >= 0.95 and len(set(targets)) > 10


def test_seeded_reset_is_the_same_puzzle():
    a, b = CountdownEnv(), CountdownEnv()
    for seed in range(10):
        obs, info = a.reset(seed=seed)
        b.reset(seed=seed + 100)
        assert b.reset(seed=seed) == (obs, info)
        assert f"Target: {a._target}, nums: {a._nums}" in obs  # RAGEN's wording of the task
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    assert generate_puzzle(rng1, 4, 1, 100, 100, True) == generate_puzzle(rng2, 4, 1, 100, 100, True)


def test_single_turn_rewards_as_ragen():
    env = CountdownEnv()
    for answer, reward, success in [("(8 - 2) * 4 - 0", 1.0, 1.0), ("8 - 2 * (4 - 0)", 0.1, 0.0),
                                    ("8 * 4 - 2", 0.0, 0.0), ("8 * 4 - 2 - 0 + 0", 0.0, 0.0),
                                    ("eight times four", 0.0, 0.0), ("8 / 0 - 2 + 4", 0.1, 0.0)]:
        env.reset(seed=0)
        puzzle(env, [8, 2, 4, 0], 24)  # (0 is outside the settings' range: a hand-made puzzle)
        obs, r, term, trunc, info = env.step(f"answer({answer!r})")
        assert (r, term, trunc, info["termination_reason"]) == (reward, True, False, "answered"), answer
        assert info["episode_metrics"] == {"success": success}
    loose = CountdownEnv(use_all=False)
    loose.reset(seed=0)
    puzzle(loose, [8, 2, 4, 7], 24)
    assert loose.step("answer('(8 - 2) * 4')")[1] == 1.0  # each number at most once


def test_single_turn_menu_holds_exactly_one_right_answer():
    env = CountdownEnv()
    for seed in range(15):
        _, info = env.reset(seed=seed)
        menu = info["legal_actions"]
        assert menu == sorted(menu) and 4 <= len(menu) <= 5
        rewards = [kid.step(action)[1] for kid, action in zip(env.fork(len(menu)), menu, strict=True)]
        assert sorted(rewards)[-1] == 1.0 and rewards.count(1.0) == 1 and 0.0 in rewards


def test_a_refused_call_takes_a_turn_and_leaves_a_retry():
    env = CountdownEnv()
    env.reset(seed=2)
    obs, r, term, trunc, info = env.step("answer(24)")
    assert "quoted string" in obs and (r, term, trunc) == (0.0, False, False) and info["invalid_action"]
    obs, r, term, trunc, info = env.step("combine(1, '+', 2)")
    assert "one tool: answer" in obs and (term, trunc, info["termination_reason"]) == (False, True, "invalid")


def test_multi_turn_combinations_shrink_the_pool():
    env = CountdownEnv(mode="multi")
    env.reset(seed=0)
    puzzle(env, [8, 2, 4, 3], 18)
    legal = env.current_info()["legal_actions"]
    assert "combine(8, '-', 2)" in legal and "combine(2, '-', 8)" not in legal and "combine(8, '/', 3)" not in legal
    assert "combine(4, '/', 2)" in legal and len(legal) == len(set(legal))
    obs, r, term, trunc, info = env.step("combine(2, '-', 8)")  # a negative result
    assert "not a positive integer" in obs and info["invalid_action"] and env._pool == [8, 2, 4, 3]
    obs, r, term, trunc, info = env.step("combine(a=8, op='-', b=2)")
    assert (r, term, obs.startswith("8 - 2 = 6. Numbers left: [4, 3, 6]")) == (0.0, False, True)
    kid = env.fork(1)[0]
    obs, r, term, trunc, info = env.step("combine(6, '*', 3)")
    assert (r, term) == (0.0, False)  # 18 is made, but 4 is left: use_all needs the last number
    obs, r, term, trunc, info = env.step("combine(18, '+', 4)")
    assert (r, term, trunc, info["episode_metrics"]["success"]) == (0.1, True, False, 0.0)
    assert kid._pool == [4, 3, 6]  # the fork kept its own pool
    obs, r, term, trunc, info = kid.step("combine(4, '*', 3)")
    obs, r, term, trunc, info = kid.step("combine(12, '+', 6)")
    assert (r, term, info["termination_reason"], info["episode_metrics"]["success"]) == (1.0, True, "answered", 1.0)
    loose = CountdownEnv(mode="multi", use_all=False)
    loose.reset(seed=0)
    puzzle(loose, [8, 2, 4, 3], 6)
    assert loose.step("combine(8, '-', 2)")[1:3] == (1.0, True)  # made on the way: enough without use_all


@pytest.mark.parametrize("action, says", [
    ("combine(9, '+', 2)", "numbers of the pool"), ("combine(8, '+', 8)", "numbers of the pool"),
    ("combine(8, '^', 2)", "op one of"), ("combine(8, '/', 3)", "not a positive integer"),
    ("combine(8.0, '+', 2)", "two ints"), ("combine(8, '+')", "two ints"), ("answer('8 + 2')", "one tool: combine"),
    ("combine(8, '+', 2, 1)", "at most 3"), ("combine(8, '+', c=2)", "no argument 'c'"),
])
def test_illegal_combinations_are_explained_and_cost_the_turn(action, says):
    env = CountdownEnv(mode="multi")
    env.reset(seed=0)
    puzzle(env, [8, 2, 4, 3], 18)
    obs, r, term, trunc, info = env.step(action)
    assert says in obs and r == 0.0 and not term and not trunc and info["invalid_action"] and info["turn"] == 1
    assert env._pool == [8, 2, 4, 3]


@pytest.mark.parametrize("kwargs, says", [
    ({"mode": "both"}, "mode"), ({"num_count": 2}, "num_count"), ({"num_count": 6}, "num_count"),
    ({"num_count": 4.0}, "num_count"), ({"min_number": 0}, "min_number"), ({"max_number": 1001}, "max_number"),
    ({"min_number": 50, "max_number": 10}, "max_number"), ({"max_target": 0}, "max_target"),
    ({"max_target": 10**7}, "max_target"), ({"use_all": 1}, "use_all"), ({"max_turns": 0}, "max_turns"),
    ({"max_turns": 65}, "max_turns"), ({"max_turns": True}, "max_turns"),
])
def test_settings_are_validated(kwargs, says):
    with pytest.raises(ValueError, match=says):
        CountdownEnv(**kwargs)
    with pytest.raises(ValueError, match="no reset options"):
        CountdownEnv().reset(seed=0, options={"target": 24})


def test_tool_schemas_and_keyword_calls():
    single = CountdownEnv()
    single.reset(seed=0)
    tools = single.tool_schemas()
    assert [t["function"]["name"] for t in tools] == ["answer"]
    action = call_to_action({"name": "answer", "arguments": {"expression": "1 + 2"}}, tools)
    assert action == "answer('1 + 2')"
    assert single.fork(1)[0].step("answer(expression='1 + 2')")[2]  # a keyword call is an answer
    multi = CountdownEnv(mode="multi")
    multi.reset(seed=0)
    tools = multi.tool_schemas()
    assert [t["function"]["name"] for t in tools] == ["combine"]
    assert list(tools[0]["function"]["parameters"]["properties"]) == ["a", "op", "b"]
    a, b = sorted(multi._pool)[-1], sorted(multi._pool)[0]
    action = call_to_action({"name": "combine", "arguments": {"a": a, "op": "+", "b": b}}, tools)
    assert action == f"combine({a}, '+', {b})" and action in multi.current_info()["legal_actions"]
    assert not multi.step(action)[4]["invalid_action"]
    json.dumps(multi.snapshot().state["task"])


@pytest.mark.parametrize("kwargs, lo, hi", [
    ({}, 0.1, 0.3),  # measured: random 0.18 over 2,000 seeds (one right answer among 5; 0.225 on these 200)
    ({"mode": "multi", "num_count": 3}, 0.04, 0.2),  # measured 0.10 (0.12 on these)
    ({"mode": "multi"}, 0.005, 0.1),  # measured 0.029 (0.04 on these)
    ({"mode": "multi", "num_count": 5, "use_all": False}, 0.005, 0.15),  # 0.05 on these
])
def test_demonstrator_success_rates(kwargs, lo, hi):
    env = CountdownEnv(**kwargs)
    good, rand = random.Random(1), random.Random(2)  # one stream over the episodes
    assert sum(play(env, good, 1.0, s) for s in range(40)) == 40
    n = 200
    rate = sum(play(env, rand, 0.0, s) for s in range(n)) / n
    assert lo <= rate <= hi
    env.reset(seed=0)
    rng = random.Random(0)
    assert all(env.demo_action(rng, 0.5) in env.current_info()["legal_actions"] or env.mode == "single"
               for _ in range(20))
    with pytest.raises(ValueError, match="skill"):
        env.demo_action(rng, 2.0)
