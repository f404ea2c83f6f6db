"""ClueProbe-v0 and the TextEnv core: registration, checker, optimal accuracy, invalid actions, fork, snapshot."""

import copy
import json
import random
import subprocess
import sys
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from envs import EpisodeFinishedError, forkyard_specs, Snapshot, check_fork_contract

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def make(**kwargs):
    return gym.make("forkyard/ClueProbe-v0", **kwargs).unwrapped


def play(env, policy, seed):
    obs, info = env.reset(seed=seed)
    total = 0.0
    while not env.done:
        obs, r, term, trunc, info = env.step(policy(env, info))
        total += r
    return total, info


def test_registration_both_forms():
    env = gym.make("forkyard/ClueProbe-v0", max_turns=3)
    assert env.unwrapped.max_turns == 3
    code = "import gymnasium as g; e = g.make('envs:forkyard/ClueProbe-v0'); print(type(e.unwrapped).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "ClueProbeEnv"


@pytest.mark.parametrize("env_id", sorted(forkyard_specs()))
def test_check_env_passes_without_warnings(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gym.make(env_id).unwrapped
        try:
            check_env(env)
        finally:
            env.close()


@pytest.mark.parametrize("turns, optimum", [(2, 0.25), (3, 0.5), (4, 1.0), (5, 1.0)])
def test_oracle_reaches_optimum_and_random_sits_near_chance(turns, optimum):
    env = make(max_turns=turns)
    n = 4000
    oracle = sum(play(env, lambda e, i: e.oracle_action(), s)[0] for s in range(n)) / n
    rng = random.Random(0)
    rand = sum(play(env, lambda e, i: rng.choice(i["legal_actions"]), s)[0] for s in range(n)) / n
    # 4000 episodes: binomial sd <= 0.008, so 0.03 is > 3.5 sd.
    assert abs(oracle - optimum) < 0.03
    assert turns == 2 or oracle > rand + 0.1
    # Random play: the answer is uniform over 8 candidates unless probes narrow it (they do not, it is random).
    assert abs(rand - 0.125) < 0.03


def test_targets_cover_candidates_and_follow_seed():
    env = make()
    targets = []
    for s in range(400):
        env.reset(seed=s)
        targets.append(env.snapshot().state["task"]["target"])
    assert set(targets) == set(range(8))
    env.reset(seed=7)
    a = env.snapshot().state["task"]["target"]
    env.reset(seed=7)
    assert env.snapshot().state["task"]["target"] == a


def test_info_contract():
    env = make(max_turns=3)
    obs, info = env.reset(seed=1)
    assert info["turn"] == 0 and info["legal_actions"] == ["probe(0)", "probe(1)", "probe(2)"]
    assert len(info["anchor_key"]) == 32
    obs, r, te, tr, info = env.step("probe(0)")
    assert info["turn"] == 1 and "bit 0 of the target is" in obs and "termination_reason" not in info
    obs, r, te, tr, info = env.step("probe(1)")
    assert info["legal_actions"] == [f"answer({c})" for c in range(8)]
    obs, r, te, tr, info = env.step("answer(3)")
    assert te and not tr and info["termination_reason"] == "answered" and info["legal_actions"] == []
    assert info["turn"] == 3


@pytest.mark.parametrize(
    "action, says",
    [
        ("probe(", "could not parse"),
        ("answer(1)", "last turn"),
        ("probe(7)", "k in 0..2"),
        ("rm('-rf')", "two tools"),
        ("probe('1')", "two tools"),
        ("", "empty"),
    ],
)
def test_invalid_action_explains_consumes_turn_and_scores_zero(action, says):
    env = make(max_turns=3)
    env.reset(seed=0)
    obs, r, te, tr, info = env.step(action)
    assert says in obs and "Turn 2 of 3" in obs
    assert r == 0.0 and not te and not tr and info["invalid_action"] and info["turn"] == 1


def test_invalid_last_action_truncates_with_reason_invalid():
    env = make(max_turns=2)
    env.reset(seed=0)
    env.step("probe(0)")
    obs, r, te, tr, info = env.step("probe(1)")
    assert (te, tr, r, info["termination_reason"]) == (False, True, 0.0, "invalid")
    with pytest.raises(EpisodeFinishedError):
        env.step("answer(0)")


def test_step_before_reset_raises_reset_needed():
    with pytest.raises(gym.error.ResetNeeded):
        make().step("probe(0)")


def test_anchor_key_is_visible_history_only():
    """Two episodes with different hidden targets that saw the same things share an anchor key."""
    env = make(max_turns=3)
    first_keys, keys_by_obs, targets_by_key = set(), {}, {}
    for seed in range(200):
        _, info = env.reset(seed=seed)
        first_keys.add(info["anchor_key"])
        obs, _, _, _, info = env.step("probe(2)")
        keys_by_obs.setdefault(obs, set()).add(info["anchor_key"])
        targets_by_key.setdefault(info["anchor_key"], set()).add(env.snapshot().state["task"]["target"])
    assert len(first_keys) == 1  # every episode starts at the same anchor
    assert len(keys_by_obs) == 2 and all(len(v) == 1 for v in keys_by_obs.values())
    assert all(len(t) == 4 for t in targets_by_key.values())  # 4 hidden targets behind each visible state


def test_fork_independence_s11():
    env = make(max_turns=5)
    env.reset(seed=0)
    env.step("probe(0)")
    child = env.fork(1)[0]
    child.step("probe(1)")
    env.step("probe(2)")
    assert env.turn == child.turn == 2
    assert env.history[-1][0] == "probe(2)" and child.history[-1][0] == "probe(1)"
    assert env.current_info()["anchor_key"] != child.current_info()["anchor_key"]
    # Editing the child's history or info changes nothing in the parent.
    child.history.append(("x", "y"))
    child.current_info()["legal_actions"].append("x")
    assert len(env.history) == 2 and "x" not in env.current_info()["legal_actions"]
    child.close()
    env.step("probe(1)")
    # 8 children start from identical observations and hidden state.
    kids = env.fork(8)
    finals = [k.step("probe(0)")[0] for k in kids]
    assert len(set(finals)) == 1
    assert {k.snapshot().state["task"]["target"] for k in kids} == {env.snapshot().state["task"]["target"]}
    with pytest.raises(TypeError, match="fork"):
        copy.copy(env)
    with pytest.raises(ValueError):
        env.fork(0)
    check_fork_contract(make(max_turns=5), seed=0)  # the whole contract, by envs.checks


def test_fork_copies_rng_within_the_episode_not_after():
    env = make(bits=8)
    env.reset(seed=11)
    a, b = env.fork(2)
    assert a._rng_state() == b._rng_state() == env._rng_state()  # the forked episode draws alike
    a.reset()
    b.reset()
    env.reset()
    targets = {e.snapshot().state["task"]["target"] for e in (a, b, env)}
    assert len(targets) == 3  # later episodes are independent (field case S40)


def test_snapshot_is_plain_data_and_restores():
    env = make(max_turns=4)
    env.reset(seed=5)
    env.step("probe(1)")
    snap = env.snapshot()
    data = json.loads(snap.to_bytes())
    assert data["state"]["turn"] == 1 and data["kwargs"] == {"max_turns": 4, "bits": 3}
    other = make(max_turns=4)
    other.restore(snap.to_bytes())
    rest = [env.step(a) for a in ("probe(0)", "probe(2)", "answer(5)")]
    rest2 = [other.step(a) for a in ("probe(0)", "probe(2)", "answer(5)")]
    assert rest == rest2
    with pytest.raises(ValueError, match="cannot restore"):
        make(max_turns=5).restore(Snapshot.from_bytes(snap.to_bytes()))


def test_constructor_validation():
    for kwargs in ({"max_turns": 0}, {"bits": 0}, {"bits": 17}, {"max_turns": "5"}):
        with pytest.raises(ValueError):
            make(**kwargs)


def test_render_ansi_transcript():
    env = make(max_turns=2, render_mode="ansi")
    env.reset(seed=0)
    env.step("probe(0)")
    text = env.render()
    assert "[action] probe(0)" in text and text.count("[observation]") == 2


def test_demo_runs_and_explains():
    out = subprocess.run([sys.executable, "-m", "trainer.cli", "demo"], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "fork(4)" in out.stdout and "oracle policy: success rate 1.000" in out.stdout


@pytest.mark.parametrize("skill", [0.0, 0.25, 0.5, 1.0])
def test_weak_demonstrator_success_rate_follows_its_skill(skill):
    """demo_action(rng, skill): random probes always, the fitting answer with probability skill.
    At bits=3, T=4 its success rate is 0.583 * skill + (1 - skill) / 8 (random probes leave 1, 2 or 3
    distinct bits known with probability 1/9, 6/9, 2/9)."""
    env = make(max_turns=4)
    rng = random.Random(1)
    n = 4000
    rate = sum(play(env, lambda e, i: e.demo_action(rng, skill=skill), s)[0] for s in range(n)) / n
    expected = (1 / 9 * 0.25 + 6 / 9 * 0.5 + 2 / 9 * 1.0) * skill + (1 - skill) / 8
    assert abs(rate - expected) < 0.03  # binomial sd <= 0.008
    env.reset(seed=0)
    assert all(env.demo_action(rng, skill=skill) in env._legal_actions() for _ in range(50))
    with pytest.raises(ValueError, match="skill"):
        env.demo_action(rng, skill=1.5)


@pytest.mark.parametrize("actions, distinct", [
    (["probe(0)", "probe(0)", "probe(2)", "answer(1)"], 2),  # a repeated probe counts once
    # refused and unparseable probe texts count: the last one ends it
    (["probe(1)", "probe(9)", "probe(1", "probe(0)"], 4),
    (["answer(0)", "answer(0)", "answer(0)", "answer(0)"], 0),
])
def test_episode_metrics_at_the_end_only(actions, distinct):
    """ClueProbe reports ``info["episode_metrics"]["distinct_probes"]`` on the step that ends the episode
    (answered or truncated), and on no other step; forks and restored envs report the same."""
    env = make(max_turns=4)
    env.reset(seed=3)
    infos = [env.step(a)[4] for a in actions[:2]]
    twin = env.fork(1)[0]
    restored = make(max_turns=4)
    restored.restore(env.snapshot().to_bytes())
    for e in (env, twin, restored):
        more = [e.step(a)[4] for a in actions[2:]]
        assert e.done and all("episode_metrics" not in i for i in infos + more[:-1])
        assert more[-1]["episode_metrics"] == {"distinct_probes": distinct}
        json.dumps(more[-1])  # plain JSON: it crosses the HTTP API as is


def test_reset_options_are_checked_not_ignored():
    import pytest as _pytest

    from envs.clueprobe import ClueProbeEnv

    env = ClueProbeEnv(max_turns=3, bits=3)
    with _pytest.raises(ValueError, match="unknown reset options"):
        env.reset(seed=0, options={"targte": 3})
    with _pytest.raises(ValueError, match="must be an int"):
        env.reset(seed=0, options={"target": True})
    env.reset(seed=0, options={"target": 5})
    assert env._target == 5


@pytest.mark.parametrize("bad", [{"target": 99}, {"target": None}, {"target": True}, {"colour": 1}])
def test_a_refused_reset_leaves_the_episode_as_it_was(bad):
    env = gym.make("forkyard/ClueProbe-v0", max_turns=4).unwrapped
    env.reset(seed=3)
    env.step("probe(0)")
    before = (env._turn, list(env._history), env._target, env.np_random.bit_generator.state, env.done)
    with pytest.raises(ValueError):
        env.reset(seed=9, options=bad)
    assert (env._turn, list(env._history), env._target, env.np_random.bit_generator.state, env.done) == before
    obs, *_ = env.step("probe(1)")  # the episode goes on from where it was
    assert obs.startswith("probe(1) -> bit 1")


def test_the_former_turns_keyword_still_works_and_says_to_rename_it():
    """``max_turns`` is the turn budget's one name; ClueProbe's former ``turns`` wins when given (a client's
    ``{"turns": 4}`` over the registered default) and warns."""
    from envs.clueprobe import ClueProbeEnv

    with pytest.warns(DeprecationWarning, match="max_turns"):
        env = ClueProbeEnv(max_turns=5, turns=3)
    assert env.max_turns == 3 and env.snapshot().kwargs == {"max_turns": 3, "bits": 3}
    with pytest.warns(DeprecationWarning):
        made = gym.make("forkyard/ClueProbe-v0", turns=2).unwrapped
    obs, info = made.reset(seed=0)
    assert "You have 2 turn(s)" in obs
