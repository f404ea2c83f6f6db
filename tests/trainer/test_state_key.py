"""GiGPO's current-state key end to end: ``info["state_key"]`` on real envs (envs/core.py and the board games'
overrides), steps grouped by it (``anchor_by="state"``), a tabular policy keyed by it (``policy_key="state"``),
the fixed task pools the granularity study trains on (FrozenLake's ``map_name``, Sokoban's ``n_rooms``), and
``forkyard compare`` on an env other than ClueProbe, resumed."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.envs.toy_text.frozen_lake import MAPS

import envs  # noqa: F401 - registers the ids
from trainer.estimators import anchor_keys, anchor_stats
from trainer.rollout import Step

ROOT = Path(__file__).resolve().parents[2]


def make(env_id: str, **kwargs):
    return gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped


def test_the_same_board_by_two_paths_has_one_state_key_and_two_history_keys():
    env = make("forkyard/FrozenLake-v0", map_name="4x4", is_slippery=False, max_turns=10)
    _, start = env.reset(seed=0)
    _, _, _, _, info = env.step("Right()")
    _, _, _, _, back = env.step("Left()")  # back on the start cell, the observation says "Left(): reward 0."
    assert back["state_key"] == start["state_key"] and back["anchor_key"] != start["anchor_key"]
    assert info["state_key"] != start["state_key"]
    _, _, _, _, wall = env.step("Up()")  # into the edge: the board does not change, the echoed action does
    assert wall["state_key"] == start["state_key"]


def test_clueprobe_state_key_is_the_last_clue_without_the_turn_line():
    env = make("forkyard/ClueProbe-v0", max_turns=5)
    keys = []
    for target in (0, 1):  # bit 1 is 0 for both targets: the same clue at the same turn
        env.reset(seed=0, options={"target": target})
        keys.append(env.step("probe(1)")[4])
    assert keys[0]["state_key"] == keys[1]["state_key"] and keys[0]["anchor_key"] == keys[1]["anchor_key"]
    env.reset(seed=0, options={"target": 0})
    env.step("probe(2)")
    later = env.step("probe(1)")[4]  # the same clue one turn later: GiGPO's key cannot tell the turns apart
    assert later["state_key"] == keys[0]["state_key"] and later["anchor_key"] != keys[0]["anchor_key"]


def test_state_key_survives_fork_snapshot_and_the_server_form():
    env = make("forkyard/Sokoban-v0", n_rooms=2)
    env.reset(seed=3)
    info = env.step("Left()")[4]
    child = env.fork(1)[0]
    assert child.current_info()["state_key"] == info["state_key"]
    twin = make("forkyard/Sokoban-v0", n_rooms=2)
    twin.restore(env.snapshot())
    assert twin.current_info()["state_key"] == info["state_key"]
    assert env.step("Right()")[4]["state_key"] == child.step("Right()")[4]["state_key"]


def test_frozenlake_fixed_maps_and_settings():
    for name, rows in MAPS.items():
        env = make("forkyard/FrozenLake-v0", map_name=name, is_slippery=False)
        firsts = {env.reset(seed=s)[0] for s in range(5)}
        assert len(firsts) == 1  # every episode plays the fixed map
        grid = [ln for ln in next(iter(firsts)).splitlines() if len(ln) == len(rows) and set(ln) <= set("P_OG")]
        assert [r.replace("S", "P").replace("F", "_").replace("H", "O") for r in rows] == grid
        assert env.size == len(rows) and env.snapshot().kwargs["map_name"] == name
    assert "map_name" not in make("forkyard/FrozenLake-v0").snapshot().kwargs  # old records stay as they were
    with pytest.raises(ValueError, match="map_name"):
        make("forkyard/FrozenLake-v0", map_name="5x5")


def test_sokoban_room_pool():
    env = make("forkyard/Sokoban-v0", n_rooms=3)
    rooms = {}
    for s in range(60):
        env.reset(seed=s)
        rooms.setdefault(env.grid(), []).append(s)
    assert len(rooms) == 3
    again = make("forkyard/Sokoban-v0", n_rooms=3)
    for grid, seeds in rooms.items():
        again.reset(seed=seeds[-1])
        assert again.grid() == grid
    free = make("forkyard/Sokoban-v0")
    assert len({(free.reset(seed=s), free.grid())[1] for s in range(20)}) > 3  # no pool: a room per seed
    for bad in (0, -1, 10_001, True, "4"):
        with pytest.raises(ValueError, match="n_rooms"):
            make("forkyard/Sokoban-v0", n_rooms=bad)


def step(anchor: str, state: str) -> Step:
    return Step(0, anchor, "a", 0.0, 0.0, None, state)


def test_anchor_keys_and_stats_by_either_key():
    steps = [step("h1", "s1"), step("h2", "s1"), step("h3", "s2")]
    assert anchor_keys(steps) == ["h1", "h2", "h3"] and anchor_keys(steps, "state") == ["s1", "s1", "s2"]
    stats = anchor_stats(steps)
    assert stats["degeneration"] == 1.0 and stats["degeneration_state"] == 0.5
    with pytest.raises(ValueError, match="state key"):
        anchor_keys([step("h1", "")], "state")
    with pytest.raises(ValueError, match="anchor_by"):
        anchor_keys(steps, "turn")
    assert "degeneration_state" not in anchor_stats([step("h1", "")])


def test_training_with_state_grouping_and_a_state_keyed_policy():
    from trainer.tabular_config import TrainConfig
    from trainer.train import train

    def run(**kw):
        cfg = TrainConfig(env_id="forkyard/FrozenLake-v0", env_kwargs={"map_name": "4x4", "is_slippery": False,
                                                                        "max_turns": 8},
                          iterations=150, lr=1.0, seed=0, device="cpu", eval_episodes=4, **kw)
        return train(cfg)

    by_history = run(estimator="anchor_fallback")
    by_state = run(estimator="anchor_fallback", anchor_by="state", policy_key="state")
    for r in (by_history, by_state):
        assert all("degeneration_state" in m for m in r.metrics)
    # the Markov table learns each cell once, whatever the path that reached it: it has learned to walk to the goal
    # (sampled success of the last iterations), the history table not yet (measured: 0.99 against 0.0, seed 0)
    def late(r):
        return sum(m["reward_mean"] for m in r.metrics[-10:]) / 10

    assert by_state.evaluation["success"] == 1.0 and late(by_state) > 0.8 > late(by_history)
    assert sum(m["degeneration_state"] for m in by_state.metrics) < sum(m["degeneration"] for m in by_state.metrics)
    with pytest.raises(ValueError, match="anchor_by"):
        TrainConfig(anchor_by="turn")
    with pytest.raises(ValueError, match="policy_key"):
        TrainConfig(policy_key="turn")


def test_refreshing_the_changed_rows_gives_the_same_table_as_refreshing_all():
    import random

    import torch

    from trainer.tabular import TabularPolicy

    pol = TabularPolicy(device="cpu", lr=1.0)
    for i in range(50):
        pol.row(f"k{i}", ["a", "b", "c"][: 2 + i % 2])
    pol.refresh()
    rng = random.Random(0)
    steps = [Step(0, f"k{i}", "a", 0.0, 0.0, (pol.rows[f"k{i}"], rng.randrange(2))) for i in range(0, 50, 7)]
    logp = pol.log_probs(steps)
    (-(logp * torch.arange(1.0, len(steps) + 1)).sum()).backward()
    pol.sgd_step(1.0, sorted({s.data[0] for s in steps}))
    partial = ([list(p) for p in pol._probs], list(pol._entropy))
    pol.refresh()
    assert (pol._probs, pol._entropy) == partial
    assert pol._probs[pol.rows["k0"]] != [0.5, 0.5]  # the update did change the trained rows


def test_compare_on_frozenlake_resumes_and_refuses_another_sweep(tmp_path):
    out = tmp_path / "fl"
    cmd = [sys.executable, "-m", "trainer.cli", "compare", "--env", "forkyard/FrozenLake-v0", "--env-kwarg",
           'map_name="4x4"', "--env-kwarg", "is_slippery=false", "--max-turns", "6", "--variants", "traj",
           "gigpo_state", "--seeds", "2", "--budget-iterations", "5", "--eval-episodes", "2", "--out", str(out)]
    first = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "| 6 | gigpo_state |" in first.stdout and "degeneration, state key" in first.stdout
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 4 and all(int(r["env_calls_total"]) >= 5 * 16 * 6 for r in rows)
    assert all(0.0 <= float(r["degeneration_state"]) <= float(r["degeneration"]) for r in rows)
    (out / "rows" / "T6_traj_s1.json").unlink()
    saved = {p.name: p.stat().st_mtime_ns for p in (out / "rows").glob("*.json")}
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (out / "rows").glob("*.json") if p.name in saved} == saved
    assert (out / "rows" / "T6_traj_s1.json").exists()
    assert again.stdout.split("\n\n")[0] == first.stdout.split("\n\n")[0]  # the rerun run is the same run
    other = subprocess.run(cmd[:-2] + ["--lr", "0.5", "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                           timeout=300)
    assert other.returncode == 2 and "holds a sweep with other settings" in other.stderr
    assert json.loads((out / "sweep.json").read_text())["lr"] == 0.1


@pytest.mark.parametrize("argv, says", [
    (["--env", "forkyard/FrozenLake-v0", "--bits", "4"], "--bits is a ClueProbe setting"),
    (["--env", "forkyard/FrozenLake-v0", "--env-kwarg", 'map_name="9x9"'], "map_name"),
])
def test_compare_refuses_what_it_cannot_run(tmp_path, argv, says):
    res = subprocess.run([sys.executable, "-m", "trainer.cli", "compare", *argv, "--seeds", "1", "--iterations",
                          "2", "--variants", "traj", "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode != 0 and says in res.stderr, res.stderr
