"""Wordle-v0 (envs/suite/wordle.py): feedback rule, word lists, registration, fork contract, seeding, settings,
tool calls, illegal guesses, rewards, held-out evaluation and the demonstrator's success rates."""

import copy
import pickle
import random
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from envs import Snapshot, check_fork_contract
from envs.actions import is_legal_action
from envs.tool_calls import call_to_action
from envs.suite.wordle import WordleEnv, feedback, word_lists


def play(env, rng, skill, seed=None, options=None):
    env.reset(seed=seed, options=options)
    total = 0.0
    while not env.done:
        total += env.step(env.demo_action(rng, skill))[1]
    return total


@pytest.mark.parametrize("guess, answer, pattern", [
    ("crane", "crane", "GGGGG"),
    ("crane", "react", "YYG.Y"),
    ("speed", "abide", "..Y.Y"),   # one e in the answer: the first e yellow, the second gray
    ("geese", "theme", "..G.G"),   # both e's of the answer taken by greens: the middle e gray
    ("eerie", "theme", "Y...G"),   # two e's in the answer, one green: one e left for a yellow
    ("llama", "hello", "YY..."),
    ("tests", "sett", None),
])
def test_feedback_duplicate_letter_rule(guess, answer, pattern):
    if pattern is None:
        with pytest.raises(ValueError):
            feedback(guess, answer)
        return
    assert feedback(guess, answer) == pattern


def test_word_lists_are_lowercase_words_and_pool_within_dictionary():
    for n in (4, 5, 6):
        pool, dictionary = word_lists(n)
        assert len(pool) > 2000 and len(dictionary) > len(pool)
        assert set(pool) <= dictionary and len(set(pool)) == len(pool)
        assert all(len(w) == n and w.isascii() and w.isalpha() and w.islower() for w in dictionary)
    pool, dictionary = word_lists(5)
    assert {"about", "crane", "years", "asked"} <= dictionary and "years" not in pool
    assert pool.index("about") < pool.index("crane")  # frequency order


def test_registered_and_passes_gymnasium_checker():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gym.make("forkyard/Wordle-v0")
        assert env.unwrapped.max_turns == 6 and env.unwrapped.word_length == 5
        check_env(env.unwrapped)
    assert env.unwrapped.fork_method == "state_codec"


@pytest.mark.parametrize("kwargs", [{}, {"word_length": 4, "max_turns": 3}, {"word_length": 6, "shaping": 0.5},
                                    {"answers": 50, "eval_answers": 5, "max_turns": 10}])
def test_fork_contract(kwargs):
    check_fork_contract(WordleEnv(**kwargs), seed=11)


def test_fork_branches_are_independent_and_snapshot_is_json():
    env = WordleEnv()
    env.reset(seed=4)
    env.step("guess('crane')")
    a, b = env.fork(2)
    a.step("guess('slate')")
    assert b.turn == 1 and env.turn == 1 and a.turn == 2
    snap = Snapshot.from_bytes(a.snapshot().to_bytes())
    fresh = WordleEnv()
    fresh.restore(snap)
    assert fresh.history == a.history and fresh.step("guess('mouth')")[0] == a.step("guess('mouth')")[0]
    for clone in (pickle.loads(pickle.dumps(env)), copy.deepcopy(env)):
        assert clone.history == env.history and clone.current_info() == env.current_info()


def test_seeded_resets_are_deterministic_and_never_draw_held_out_words():
    env, other = WordleEnv(), WordleEnv()
    answers = []
    for s in range(300):
        obs, info = env.reset(seed=s)
        assert (obs, info) == other.reset(seed=s)
        answers.append(env._answer)
        assert env._answer == other._answer
    assert len(set(answers)) > 200 and not set(answers) & set(env.held_out)
    assert env.reset(seed=5)[1]["legal_actions"] == env.reset(seed=6)[1]["legal_actions"]  # menu: visible state only


@pytest.mark.parametrize("kwargs, says", [
    ({"word_length": 7}, "word_length"), ({"word_length": True}, "word_length"), ({"max_turns": 0}, "max_turns"),
    ({"max_turns": 21}, "max_turns"), ({"answers": 19}, "answers"), ({"answers": 10**6}, "answers"),
    ({"answers": 100, "eval_answers": 51}, "eval_answers"), ({"eval_answers": 0}, "eval_answers"),
    ({"shaping": 1.5}, "shaping"), ({"shaping": "0.1"}, "shaping"), ({"max_turns": 6.0}, "max_turns"),
])
def test_settings_are_validated(kwargs, says):
    with pytest.raises(ValueError, match=says):
        WordleEnv(**kwargs)


def test_reset_options_are_validated():
    env = WordleEnv()
    with pytest.raises(ValueError, match="answer pool"):
        env.reset(seed=0, options={"answer": "zzzzz"})
    with pytest.raises(ValueError, match="only 'answer'"):
        env.reset(seed=0, options={"target": "crane"})


def test_tool_schema_calls_keyword_positional_and_json_alike():
    env = WordleEnv()
    tools = env.tool_schemas()
    assert [t["function"]["name"] for t in tools] == ["guess"]
    assert tools[0]["function"]["parameters"]["properties"]["word"]["pattern"] == "^[a-z]{5}$"
    action = call_to_action({"name": "guess", "arguments": {"word": "crane"}}, tools)
    outs = []
    for text in (action, "guess(word='crane')", "guess('CRANE')"):
        env.reset(seed=3)
        obs, r, te, tr, info = env.step(text)
        assert not info["invalid_action"]
        outs.append(obs)
    assert outs[0] == outs[1] == outs[2] and "c " in outs[0] and "pattern" in outs[0]


@pytest.mark.parametrize("action, says", [
    ("guess('zzzzz')", "not in the dictionary"),
    ("guess('cranes')", "not a 5-letter word"),
    ("guess('cr4ne')", "not a 5-letter word"),
    ("guess(12345)", "quoted string"),
    ("guess()", "quoted string"),
    ("answer('crane')", "one tool"),
    ("guess(word='crane', extra=1)", "no argument 'extra'"),
    ("guess(", "could not parse"),
])
def test_illegal_guesses_are_explained_and_use_a_turn(action, says):
    env = WordleEnv(max_turns=3)
    env.reset(seed=0)
    obs, r, te, tr, info = env.step(action)
    assert says in obs and "Guess 2 of 3" in obs
    assert (r, te, tr, info["invalid_action"], info["turn"]) == (0.0, False, False, True, 1)


def test_solve_terminates_and_running_out_truncates_naming_the_word():
    env = WordleEnv(max_turns=2)
    env.reset(seed=0, options={"answer": "crane"})
    obs, r, te, tr, info = env.step("guess('crane')")
    assert (r, te, tr, info["termination_reason"]) == (1.0, True, False, "answered") and "Solved" in obs
    assert info["episode_metrics"] == {"success": 1.0, "accepted_guesses": 1}
    env.reset(seed=0, options={"answer": "crane"})
    env.step("guess('slate')")
    obs, r, te, tr, info = env.step("guess('mouth')")
    assert (r, te, tr, info["termination_reason"]) == (0.0, False, True, "max_turns") and "'crane'" in obs


def test_shaping_pays_new_greens_once():
    env = WordleEnv(shaping=0.5)
    env.reset(seed=0, options={"answer": "crane"})
    assert env.step("guess('crate')")[1] == pytest.approx(0.5 * 4 / 5)  # c r a _ e green
    assert env.step("guess('crave')")[1] == pytest.approx(0.0)  # no new green
    assert env.step("guess('crane')")[1] == pytest.approx(1.0 + 0.5 * 1 / 5)


def test_menu_is_small_legal_and_mixes_consistent_and_ruled_out_words():
    env = WordleEnv()
    obs, info = env.reset(seed=2, options={"answer": "crane"})
    assert len(info["legal_actions"]) == 10
    obs, r, te, tr, info = env.step("guess('slate')")
    menu = info["legal_actions"]
    assert 2 <= len(menu) <= 10 and menu == sorted(menu)
    words = [a.split("'")[1] for a in menu]
    consistent = [w for w in words if feedback("slate", w) == feedback("slate", "crane")]
    assert consistent and len(consistent) < len(words)
    branches = env.fork(len(menu))
    for branch, action in zip(branches, menu, strict=True):
        assert is_legal_action(action, menu)
        assert not branch.step(action)[4]["invalid_action"]


def test_evaluation_resets_play_every_held_out_word_once():
    resets = WordleEnv.evaluation_resets({"answers": 200, "eval_answers": 20}, n_seeds=3)
    env = WordleEnv(answers=200, eval_answers=20)
    assert [o["answer"] for _, o in resets] == list(env.held_out) and len(set(env.held_out)) == 20
    env.reset(seed=resets[0][0], options=resets[0][1])
    assert env._answer == resets[0][1]["answer"]


def test_demonstrator_success_rates():
    """Measured (2026-05): 5 letters, 6 guesses, pool 1500: skill 1 solves 200/200 seeded episodes (3.5 guesses on
    average) and every held-out word; 4 letters 0.94; skill 0 (uniform over the menu) about 0.39."""
    env = WordleEnv()
    rng = random.Random(0)
    seeds = range(30)
    skilled = sum(play(env, rng, 1.0, seed=s) for s in seeds) / len(seeds)
    random_play = sum(play(env, rng, 0.0, seed=s) for s in seeds) / len(seeds)
    assert skilled >= 0.95
    assert 0.1 <= random_play <= 0.75
    with pytest.raises(ValueError):
        env.demo_action(rng, 1.5)
