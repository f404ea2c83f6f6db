"""forkyard/FrozenLake-v0 (envs/suite/frozenlake.py): RAGEN's text form on Gymnasium's FrozenLake, a solvable map
per seed, fork by the state codec, settings validation, tools, and the demonstrator against random play."""

from __future__ import annotations

import json
import random
import warnings
from collections import deque

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import envs  # noqa: F401 - registers forkyard/FrozenLake-v0
from envs.checks import check_fork_contract
from envs.suite.frozenlake import FrozenLakeEnv

def make(**kwargs) -> FrozenLakeEnv:
    env = gym.make("forkyard/FrozenLake-v0", **kwargs).unwrapped
    assert isinstance(env, FrozenLakeEnv)
    return env


def grid_of(text: str, size: int) -> list[str]:
    """The grid lines of an observation: the ``size`` lines made of RAGEN's symbols only."""
    lines = [ln for ln in text.splitlines() if len(ln) == size and set(ln) <= set("P_OGX√")]
    assert len(lines) == size, text
    return lines


def solvable(rows: list[str]) -> bool:
    size = len(rows)
    todo, seen = deque([(0, 0)]), {(0, 0)}
    while todo:
        r, c = todo.popleft()
        if rows[r][c] == "G":
            return True
        for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if 0 <= nr < size and 0 <= nc < size and (nr, nc) not in seen and rows[nr][nc] != "O":
                seen.add((nr, nc))
                todo.append((nr, nc))
    return False


def test_gymnasium_make_and_check_env():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = make()
        check_env(env)
    assert (env.size, env.p, env.is_slippery, env.max_turns, env.fork_method) == (4, 0.8, True, 30, "state_codec")


def test_ragen_text_form():
    env = make(size=5, is_slippery=False)
    obs, info = env.reset(seed=0)
    assert "Symbols: P you | _ frozen ice | O hole | G goal | X you in a hole | √ you on the goal" in obs
    assert info["legal_actions"] == ["Left()", "Down()", "Right()", "Up()"]
    rows = grid_of(obs, 5)
    assert rows[0][0] == "P" and rows[-1][-1] == "G" and "does not slip" in obs
    assert [t["function"]["name"] for t in env.tool_schemas()] == ["Left", "Down", "Right", "Up"]
    obs, *_ = env.step("Right()")
    assert grid_of(obs, 5)[0][1] in "PX" and obs.startswith("Right(): reward 0.")
    env.reset(seed=0)
    rng = random.Random(0)
    while not env.done:
        obs, r, te, tr, info = env.step(env.demo_action(rng, 1.0))
    assert "√" in obs and (r, te, info["termination_reason"]) == (1.0, True, "answered")


def test_falling_into_a_hole_shows_x_and_terminates():
    for seed in range(50):
        env = make(is_slippery=False)
        obs, _ = env.reset(seed=seed)
        rows = grid_of(obs, 4)
        if rows[1][0] == "O":
            obs, r, te, tr, info = env.step("Down()")
            assert grid_of(obs, 4)[1][0] == "X"
            assert (r, te, tr, info["termination_reason"], info["episode_metrics"]["success"]) == (
                0.0, True, False, "answered", 0.0)
            return
    pytest.fail("no map among 50 seeds has a hole below the start")


def test_maps_follow_the_seed_and_are_solvable():
    env = make(size=6, p=0.6)
    maps = {}
    for s in range(60):
        rows = grid_of(env.reset(seed=s)[0], 6)
        assert rows[0][0] == "P" and rows[5][5] == "G" and solvable(rows)
        maps[s] = rows
    assert len({tuple(m) for m in maps.values()}) == 60
    assert all(grid_of(make(size=6, p=0.6).reset(seed=s)[0], 6) == maps[s] for s in (0, 17, 59))
    assert all(set("".join(grid_of(make(p=1.0).reset(seed=s)[0], 4))) == {"P", "_", "G"} for s in range(5))


@pytest.mark.parametrize("kwargs", [{}, {"size": 6, "is_slippery": False}, {"size": 8, "p": 0.6, "max_turns": 20},
                                    {"size": 2, "max_turns": 3}])
def test_fork_contract(kwargs):
    check_fork_contract(make(**kwargs), seed=3)


def test_snapshot_carries_the_map_and_restores_it():
    env = make(size=5)
    env.reset(seed=11)
    env.step("Down()")
    data = env.snapshot().to_bytes()
    task = json.loads(data)["state"]["task"]
    assert len(task["episode_kwargs"]["desc"]) == 5 and set(task["gym_state"]) == {"s", "lastaction", "rng"}
    other = make(size=5)
    other.reset(seed=99)  # another map, replaced by the snapshot's
    other.restore(data)
    assert other.last_observation == env.last_observation
    assert other.fork(1)[0].step("Right()") == env.fork(1)[0].step("Right()")


def test_copies_of_a_fork_draw_their_own_later_maps():
    env = make(size=6)
    first = env.reset(seed=0)[0]
    a, b = env.fork(2)
    assert len({a.reset()[0], b.reset()[0], env.reset()[0], first}) == 4


@pytest.mark.parametrize("kwargs, says", [
    ({"size": 1}, "size"), ({"size": 13}, "size"), ({"size": True}, "size"), ({"size": "4"}, "size"),
    ({"p": 0.4}, "p must"), ({"p": 1.5}, "p must"), ({"p": "x"}, "p must"), ({"is_slippery": 1}, "is_slippery"),
    ({"max_turns": 0}, "max_turns"), ({"max_turns": 201}, "max_turns"), ({"max_turns": 2.5}, "max_turns"),
])
def test_settings_are_validated(kwargs, says):
    with pytest.raises(ValueError, match=says):
        FrozenLakeEnv(**kwargs)


def test_default_turn_budget_scales_with_size():
    assert [FrozenLakeEnv(size=s).max_turns for s in (2, 4, 8, 12)] == [10, 30, 70, 110]
    assert FrozenLakeEnv(max_turns=10)._kwargs == {"size": 4, "p": 0.8, "is_slippery": True, "max_turns": 10}


def test_illegal_actions_explain_and_consume_the_turn():
    env = make()
    env.reset(seed=0)
    for bad, says in [("left()", "is not an action"), ("Left(1)", "takes no arguments"), ("jump", "tool call")]:
        obs, r, te, tr, info = env.step(bad)
        assert info["invalid_action"] and says in obs and (r, te, tr) == (0.0, False, False)
    assert env.turn == 3 and "Left(), Down(), Right(), Up()" in obs
    obs, r, te, tr, info = env.step("Down")  # not a call
    assert info["invalid_action"]


def success_rate(env: FrozenLakeEnv, skill: float, seeds: range) -> float:
    rng = random.Random(7)
    wins = 0.0
    for s in seeds:
        env.reset(seed=s)
        info = {}
        while not env.done:
            info = env.step(env.demo_action(rng, skill))[4]
        wins += info["episode_metrics"]["success"]
    return wins / len(seeds)


# Measured over 300 seeds: slippery 4x4 with 30 turns 0.64 scripted / 0.07 random (10 turns: 0.14 / 0.01; 8x8
# with 70 turns: 0.27 / 0.003); ice that does not slip: 1.0 scripted at every size, 0.08 random at 4x4.
@pytest.mark.parametrize("kwargs, seeds, scripted, rand", [
    ({}, range(80), (0.45, 0.85), (0.0, 0.16)),
    ({"is_slippery": False}, range(40), (1.0, 1.0), (0.0, 0.2)),
    ({"size": 8, "is_slippery": False}, range(20), (1.0, 1.0), (0.0, 0.1)),
])
def test_demonstrator_beats_random_play(kwargs, seeds, scripted, rand):
    env = make(**kwargs)
    best, random_play = success_rate(env, 1.0, seeds), success_rate(env, 0.0, seeds)
    assert scripted[0] <= best <= scripted[1] and rand[0] <= random_play <= rand[1], (best, random_play)


def test_scripted_play_takes_a_shortest_path_on_ice_that_does_not_slip():
    env = make(size=6, is_slippery=False)
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        rows = [r.replace("P", "_") for r in grid_of(obs, 6)]
        todo, dist = deque([(0, 0)]), {(0, 0): 0}
        while todo:
            r, c = todo.popleft()
            for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                if 0 <= nr < 6 and 0 <= nc < 6 and (nr, nc) not in dist and rows[nr][nc] != "O":
                    dist[(nr, nc)] = dist[(r, c)] + 1
                    todo.append((nr, nc))
        rng = random.Random(0)
        while not env.done:
            env.step(env.demo_action(rng, 1.0))
        assert env.turn == dist[(5, 5)]
