"""Sokoban-v0 (envs/suite/sokoban.py): registration and Gymnasium's checker, the fork contract, seeding, rooms
solvable within the budget, the solver against a plain breadth-first search, the push rules and rewards, settings,
tool calls, illegal actions, and the demonstrator's success rates."""

import json
import random
import time
import warnings
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from envs import check_fork_contract
from envs.suite.sokoban import MOVES, SokobanEnv, generate_room, render_room, solve
from envs.tool_calls import call_to_action

SETTINGS = [
    {},
    {"dim": 6, "num_boxes": 2, "max_turns": 20},
    {"dim": [5, 7], "num_boxes": 3, "max_turns": 6},
    {"dim": 8, "num_boxes": 2, "max_turns": 30, "search_depth": 100},
]


def play(env, rng, skill, seed):
    env.reset(seed=seed)
    info = {}
    while not env.done:
        info = env.step(env.demo_action(rng, skill))[4]
    return info["episode_metrics"]["success"]


def with_position(env, rows, boxes=None, player=None):
    """Put ``env`` (after a reset) in the position drawn by ``rows`` (RAGEN's symbols), through its state codec."""
    cols = len(rows[0])
    layout = ["".join("O" if ch in "O√S" else "#" if ch == "#" else "_" for ch in row) for row in rows]
    boxes = [[r, c] for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "X√"]
    player = next([r, c] for r, row in enumerate(rows) for c, ch in enumerate(row) if ch in "PS")
    snap = env.snapshot()
    snap.state["task"] = {"layout": layout, "boxes": boxes, "player": player}
    env.restore(snap)
    assert env.grid() == "\n".join(rows) and env.cols == cols


def bfs_length(layout, boxes, player):
    """Fewest moves to solve, by a plain breadth-first search over (player, boxes) (no heuristic, no pruning)."""
    cols = len(layout[0])
    flat = "".join(layout)
    targets = {i for i, ch in enumerate(flat) if ch == "O"}
    start = (player, tuple(sorted(boxes)))
    seen, queue = {start}, deque([(start, 0)])
    while queue:
        (at, bx), g = queue.popleft()
        if set(bx) <= targets:
            return g
        for dr, dc in MOVES.values():
            d = dr * cols + dc
            nxt = at + d
            if flat[nxt] == "#":
                continue
            nbx = bx
            if nxt in bx:
                if flat[nxt + d] == "#" or nxt + d in bx:
                    continue
                nbx = tuple(sorted(nxt + d if b == nxt else b for b in bx))
            if (nxt, nbx) not in seen:
                seen.add((nxt, nbx))
                queue.append(((nxt, nbx), g + 1))
    return None


def test_registered_and_passes_gymnasium_checker():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gym.make("forkyard/Sokoban-v0")
        assert (env.unwrapped.max_turns, env.unwrapped.rows, env.unwrapped.num_boxes) == (10, 6, 1)
        check_env(env.unwrapped)
    assert SokobanEnv.fork_method == "state_codec"


@pytest.mark.parametrize("kwargs", SETTINGS)
def test_fork_contract(kwargs):
    check_fork_contract(SokobanEnv(**kwargs), seed=4)


def test_seeded_reset_is_the_same_room_and_seeds_differ():
    a, b = SokobanEnv(dim=7, num_boxes=2, max_turns=15), SokobanEnv(dim=7, num_boxes=2, max_turns=15)
    rooms = set()
    for seed in range(40):
        obs, info = a.reset(seed=seed)
        b.reset(seed=seed + 1)
        assert b.reset(seed=seed) == (obs, info)
        rooms.add(a.grid())
    assert len(rooms) >= 38  # rooms are drawn, not picked from a short list
    a.reset(seed=3)
    a.step("Up()")
    kid = a.fork(1)[0]
    assert kid.reset(seed=11)[0] == SokobanEnv(dim=7, num_boxes=2, max_turns=15).reset(seed=11)[0]


def test_the_first_observation_is_ragens_text_grid():
    env = SokobanEnv()
    obs, info = env.reset(seed=0)
    grid = env.grid().splitlines()
    assert len(grid) == 6 and all(len(row) == 6 and set(row) <= set("#_O√XPS") for row in grid)
    assert "\n".join(grid) in obs and "# wall" in obs and "√ box on target" in obs
    assert all(ch == "#" for ch in grid[0] + grid[-1] + "".join(r[0] + r[-1] for r in grid))  # walls all around
    text = "".join(grid)
    assert text.count("P") + text.count("S") == 1 and text.count("X") >= 1
    assert text.count("X") + text.count("√") == text.count("O") + text.count("√") + text.count("S") == 1
    assert info["legal_actions"] == ["Up()", "Down()", "Left()", "Right()"] == env.action_vocabulary
    json.dumps(env.snapshot().state["task"])  # plain JSON


@pytest.mark.parametrize("kwargs", [{}, {"dim": 6, "num_boxes": 2, "max_turns": 20},
                                    {"dim": 10, "num_boxes": 3, "max_turns": 40}, {"dim": 5, "num_boxes": 3,
                                                                                   "max_turns": 3},
                                    {"dim": 5, "max_turns": 1, "search_depth": 1}])
def test_every_room_is_solvable_within_max_turns(kwargs):
    """By construction (the reverse play's own solution, replayed) and by the solver (a shortest one)."""
    env = SokobanEnv(**kwargs)
    n = 60
    lengths = []
    for seed in range(n):
        env.reset(seed=seed)
        start = env.snapshot()
        plan = env.optimal_plan()
        assert plan is not None and 1 <= len(plan) <= env.max_turns, (seed, env.grid())
        lengths.append(len(plan))
        for k, move in enumerate(plan):
            obs, r, term, trunc, info = env.step(f"{move}()")
            assert term == (k == len(plan) - 1) and not trunc
        assert info["termination_reason"] == "answered" and info["episode_metrics"]["success"] == 1.0
        env.restore(start)
    # the generator's own solution (independent of the solver) solves its room too
    rng = np.random.default_rng(7)
    for _ in range(20):
        layout, boxes, player, solution = generate_room(rng, env.rows, env.cols, env.num_boxes, env.max_turns,
                                                        env.search_depth)
        assert len(solution) <= env.max_turns
        cols = env.cols
        for move in solution:
            dr, dc = MOVES[move]
            d = dr * cols + dc
            if player + d in boxes:
                boxes = tuple(sorted(player + 2 * d if b == player + d else b for b in boxes))
            player += d
            assert "".join(layout)[player] != "#" and all("".join(layout)[b] != "#" for b in boxes)
        assert all("".join(layout)[b] == "O" for b in boxes)
    if env.max_turns >= 10:
        assert np.mean(lengths) >= 3  # not trivial rooms


def test_solver_is_shortest_against_plain_bfs():
    env = SokobanEnv(dim=6, num_boxes=2, max_turns=16)
    for seed in range(25):
        env.reset(seed=seed)
        plan = solve(env._layout, env._boxes, env._player)
        assert plan is not None and len(plan) == bfs_length(env._layout, env._boxes, env._player)
    # unsolvable: a box in a corner that is no target
    layout = ("#####", "#O__#", "#___#", "#___#", "#####")
    assert solve(layout, (3 * 5 + 3,), 2 * 5 + 2) is None
    assert solve(layout, (1 * 5 + 1,), 2 * 5 + 2) == ()
    assert bfs_length(layout, (3 * 5 + 3,), 2 * 5 + 2) is None


def test_push_rules_and_ragens_rewards():
    env = SokobanEnv(dim=6, num_boxes=2, max_turns=8)
    env.reset(seed=0)
    with_position(env, ["######",
                        "#_XO_#",
                        "#_P__#",
                        "#_X__#",
                        "#_O__#",
                        "######"])
    obs, r, term, trunc, info = env.step("Left()")  # a plain move
    assert (r, term, trunc) == (pytest.approx(-0.1), False, False) and "moved" in obs and info["action_is_effective"]
    obs, r, *_ = env.step("Left()")  # a wall: no move, the penalty all the same
    assert r == pytest.approx(-0.1) and "wall" in obs and env.grid().splitlines()[2] == "#P___#"
    env.step("Up()")
    obs, r, *_ = env.step("Right()")  # push the box onto its target: +1
    assert r == pytest.approx(0.9) and "onto a target" in obs and env.grid().splitlines()[1] == "#_P√_#"
    obs, r, *_ = env.step("Right()")  # push it off again: -1
    assert r == pytest.approx(-1.1) and "off a target" in obs and env.grid().splitlines()[1] == "#__SX#"
    obs, r, *_ = env.step("Right()")  # the box is against the wall: no move
    assert r == pytest.approx(-0.1) and "cannot move" in obs
    env.restore(env.snapshot())  # (a restore in the middle changes nothing)
    with_position(env, ["######",
                        "#_√__#",
                        "#_X__#",
                        "#_P__#",
                        "#_O__#",
                        "######"])
    obs, r, *_ = env.step("Up()")  # two boxes in a row do not move
    assert r == pytest.approx(-0.1) and "cannot move" in obs
    with_position(env, ["######",
                        "#_√__#",
                        "#_P__#",
                        "#_X__#",
                        "#_O__#",
                        "######"])
    obs, r, term, trunc, info = env.step("Down()")  # the last box home: +1 +10, terminated
    assert r == pytest.approx(10.9) and term and not trunc and "solved" in obs
    assert info["termination_reason"] == "answered" and info["episode_metrics"] == {"success": 1.0,
                                                                                    "boxes_on_target": 2}


def test_the_budget_truncates():
    env = SokobanEnv(max_turns=3)
    env.reset(seed=1)
    with_position(env, ["######",
                        "#_P__#",
                        "#____#",
                        "#_X__#",
                        "#_O__#",
                        "######"])
    for action in ("Right()", "Left()"):
        obs, r, term, trunc, info = env.step(action)
        assert not (term or trunc) and "termination_reason" not in info
    obs, r, term, trunc, info = env.step("Right()")
    assert (term, trunc, info["termination_reason"]) == (False, True, "max_turns") and "No turns left" in obs
    assert info["episode_metrics"] == {"success": 0.0, "boxes_on_target": 0} and info["legal_actions"] == []


@pytest.mark.parametrize("kwargs, says", [
    ({"dim": 4}, "dim"), ({"dim": 11}, "dim"), ({"dim": "6"}, "dim"), ({"dim": True}, "dim"), ({"dim": [6]}, "dim"),
    ({"dim": [6, 11]}, "cols"), ({"num_boxes": 0}, "num_boxes"), ({"num_boxes": 4}, "num_boxes"),
    ({"max_turns": 0}, "max_turns"), ({"max_turns": 201}, "max_turns"), ({"max_turns": 5.0}, "max_turns"),
    ({"search_depth": 0}, "search_depth"), ({"search_depth": 2001}, "search_depth"),
])
def test_settings_are_validated(kwargs, says):
    with pytest.raises(ValueError, match=says):
        SokobanEnv(**kwargs)
    with pytest.raises(ValueError, match="no reset options"):
        SokobanEnv().reset(seed=0, options={"room": 1})


def test_tool_schemas_and_keyword_calls():
    env = SokobanEnv()
    env.reset(seed=2)
    tools = env.tool_schemas()
    assert [t["function"]["name"] for t in tools] == ["Up", "Down", "Left", "Right"]
    assert all(t["function"]["parameters"]["properties"] == {} for t in tools)
    action = call_to_action({"name": "Down", "arguments": {}}, tools)
    assert action == "Down()"
    obs, r, *_, info = env.step(action)
    assert not info["invalid_action"] and obs.startswith("Down: ") and info["turn"] == 1


@pytest.mark.parametrize("action, says", [
    ("jump()", "four tools"), ("up()", "four tools"), ("Up(2)", "no arguments"), ("Left(steps=1)", "no arguments"),
    ("Up(", "could not parse"), ("", "empty"),
])
def test_illegal_actions_are_explained_and_cost_the_turn(action, says):
    env = SokobanEnv(max_turns=5)
    env.reset(seed=0)
    grid = env.grid()
    obs, r, term, trunc, info = env.step(action)
    assert says in obs and r == 0.0 and not term and not trunc and info["invalid_action"] and info["turn"] == 1
    assert env.grid() == grid


@pytest.mark.parametrize("kwargs, lo, hi", [
    ({}, 0.01, 0.25),  # measured: random 0.10 over 1,000 seeds (0.053 on these 150)
    ({"dim": 8, "num_boxes": 2, "max_turns": 30}, 0.05, 0.35),  # measured 0.15 (0.153 on these)
])
def test_demonstrator_success_rates(kwargs, lo, hi):
    env = SokobanEnv(**kwargs)
    n = 40
    good, rand = random.Random(1), random.Random(2)  # one stream over the episodes
    assert sum(play(env, good, 1.0, s) for s in range(n)) == n  # every room, shortest play
    rate = sum(play(env, rand, 0.0, s) for s in range(150)) / 150
    assert lo <= rate <= hi
    env.reset(seed=0)
    rng = random.Random(0)
    assert all(env.demo_action(rng, 0.5) in env.action_vocabulary for _ in range(20))
    with pytest.raises(ValueError, match="skill"):
        env.demo_action(rng, 1.5)


def test_reset_stays_fast_at_the_largest_settings():
    env = SokobanEnv(dim=10, num_boxes=3, max_turns=200, search_depth=2000)
    times = []
    for seed in range(8):
        t = time.perf_counter()
        env.reset(seed=seed)
        times.append(time.perf_counter() - t)
    assert max(times) < 3.0  # measured: p50 34 ms, p99 0.32 s on a shared 2-core machine


def test_render_room_symbols():
    layout = ("#####", "#O_O#", "#___#", "#___#", "#####")
    assert render_room(layout, (6, 18), 8) == "#####\n#√_S#\n#___#\n#__X#\n#####"
