"""S8: Gymnasium Text spaces that reject real output."""

import gymnasium as gym
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from envs.text_space import TextSpace, fit_text


def test_real_text_is_contained():
    space = TextSpace(32)
    assert space.contains("a.txt\nb.txt")
    assert space.contains("café 🚀")
    assert space.contains("")
    assert space.contains("x" * 32)
    assert not space.contains("x" * 33)
    assert not space.contains(b"bytes")
    assert not space.contains("lone \ud800 surrogate")
    # The stock Gymnasium space rejects the same text: the reason TextSpace exists.
    assert not gym.spaces.Text(32).contains("a.txt\nb.txt")


def test_fit_text_cuts_with_marker_to_exact_length():
    text = "y" * 1000
    cut = fit_text(text, 100)
    assert len(cut) == 100
    assert cut.startswith("y" * 50)
    assert cut.endswith("characters cut]")
    n = int(cut.rsplit("[... ", 1)[1].split(" ")[0])
    assert n == 1000 - cut.index("\n[...")  # the marker states how many characters were dropped
    assert fit_text("short", 100) == "short"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000), st.integers(min_value=40, max_value=2000))
def test_fit_text_always_lands_in_space(text, limit):
    assert TextSpace(limit).contains(fit_text(text, limit))


def test_every_clueprobe_observation_is_contained():
    env = gym.make("forkyard/ClueProbe-v0", max_turns=5).unwrapped
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    for action in ["probe(0)", "probe(99)", "café 🚀" * 40, "", "answer(1)", "answer(2)"]:
        obs, *_ = env.step(action)
        assert env.observation_space.contains(obs)
        if env.done:
            break
    assert env.done
    assert isinstance(env.observation_space, envs.TextSpace)
