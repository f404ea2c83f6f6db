"""envs.checks: the fork/snapshot/seeding contract checker passes forkyard's envs and catches broken ones."""

import numpy as np
import pytest

from envs.checks import (
    check_anchor_keys,
    check_fork_contract,
    check_fork_independence,
    check_seeded_reset_determinism,
)
from envs.clueprobe import ClueProbeEnv
from envs.core import _digest
from envs.fileqa import FileQAEnv
from sandbox_server.embedded import shared_provider


@pytest.mark.parametrize("kwargs", [{}, {"max_turns": 2, "bits": 1}, {"max_turns": 4, "bits": 5},
                                    {"max_turns": 9, "bits": 16}])
def test_clueprobe_passes_the_contract(kwargs):
    env = ClueProbeEnv(**kwargs)
    check_fork_contract(env, seed=3)


def test_clueprobe_passes_with_given_actions():
    check_fork_contract(ClueProbeEnv(max_turns=3), seed=0, actions=["probe(1)", "probe(0)", "answer(2)", "bogus"])


def test_fileqa_local_passes_the_contract():
    env = FileQAEnv(backend="local", kinds=["log_errors"], max_turns=4)
    try:
        check_fork_contract(env, seed=1)
    finally:
        env.close()
    assert shared_provider("local").list() == []  # every fork and fresh env the checker made was closed


def test_an_env_without_legal_actions_needs_actions():
    class Open(ClueProbeEnv):
        def _info(self):
            info = super()._info()
            info.pop("legal_actions", None)
            return info

    with pytest.raises(AssertionError, match="pass actions="):
        check_fork_contract(Open(), seed=0)
    check_fork_contract(Open(), seed=0, actions=["probe(0)", "probe(2)", "answer(5)"])


# --------------------------------------------------------------------------- deliberately broken envs
class SharedHistoryFork(ClueProbeEnv):
    """Broken: a fork's child shares the parent's history list."""

    def _clone(self):
        child = super()._clone()
        child._history = self._history
        return child


class SeedIgnoringReset(ClueProbeEnv):
    """Broken: reset ignores its seed and draws from a stream seeded once at construction."""

    def __init__(self, max_turns: int = 5, bits: int = 3, render_mode=None):
        super().__init__(max_turns=max_turns, bits=bits, render_mode=render_mode)
        self.np_random = np.random.default_rng(12345)

    def reset(self, *, seed=None, options=None):
        return super().reset(seed=None, options=options)


class HiddenStateAnchor(ClueProbeEnv):
    """Broken: the anchor key mixes in the hidden target."""

    def _info(self):
        info = super()._info()
        info["anchor_key"] = _digest(f"{self._anchor}|{self._target}")
        return info


def test_catches_a_fork_that_shares_its_history():
    with pytest.raises(AssertionError, match="changed fork child 1|changed the parent"):
        check_fork_independence(SharedHistoryFork(), seed=0)
    with pytest.raises(AssertionError):
        check_fork_contract(SharedHistoryFork(), seed=0)


def test_catches_a_reset_that_ignores_the_seed():
    with pytest.raises(AssertionError, match="does not give a fresh env's episode"):
        check_seeded_reset_determinism(SeedIgnoringReset(max_turns=9, bits=8), seed=0)
    with pytest.raises(AssertionError):
        check_fork_contract(SeedIgnoringReset(max_turns=9, bits=8), seed=0)


def test_catches_an_anchor_that_includes_hidden_state():
    with pytest.raises(AssertionError, match="hidden state"):
        check_anchor_keys(HiddenStateAnchor(), seed=0)
    with pytest.raises(AssertionError):
        check_fork_contract(HiddenStateAnchor(), seed=0)


def test_catches_an_observation_outside_the_space():
    class TooLong(ClueProbeEnv):
        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed, options=options)
            return obs * 100, info

    with pytest.raises(AssertionError, match="not contained in the observation space"):
        check_fork_contract(TooLong(), seed=0)
