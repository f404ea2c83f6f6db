"""The one wave driver (trainer/waves.py) over the serial sampler: any policy (here the tabular one, whose sessions
act one at a time) gives, batched into waves of any size, under any caps, with env copies or without (the serial
driver every unbatched entry point runs), the episodes of the serial loops forkyard had before the driver
(tests/trainer/serial_oracle.py): same seeds, streams, actions, rewards, fork turns and env-call and fork counts,
infrastructure failures included. Several trees and groups played in one call each equal its own serial rollout."""

import random

import pytest

from envs.clueprobe import ClueProbeEnv
from envs.core import EnvInfraError
from tests.trainer.serial_oracle import serial_group_rollout, serial_tree_rollout
from trainer.tabular import TabularPolicy
from trainer.waves import Group, SerialSampler, Tree, WaveDriver, group_rollout, tree_rollout


def same(a, b) -> None:
    assert (a.kind, a.env_calls, a.forks, a.forks_failed, a.branches_lost) == (
        b.kind, b.env_calls, b.forks, b.forks_failed, b.branches_lost)
    assert [(e.seed, e.base, e.branch, e.fork_turn, e.reward, e.reason, e.infra_failure, e.invalid_actions,
             [(s.turn, s.anchor_key, s.action, s.logp) for s in e.steps]) for e in a.episodes] == [
        (e.seed, e.base, e.branch, e.fork_turn, e.reward, e.reason, e.infra_failure, e.invalid_actions,
         [(s.turn, s.anchor_key, s.action, s.logp) for s in e.steps]) for e in b.episodes]


class Faulty(ClueProbeEnv):
    """ClueProbe whose infrastructure fails: the step at turn 1 of episodes reset with ``bad_step``, the reset with
    ``bad_reset``, and every ``fork_every``-th fork call (counted across the env and its copies)."""

    def __init__(self, bad_step=None, bad_reset=None, fork_every=0, calls=None, **kwargs):
        super().__init__(**kwargs)
        self.bad_step, self.bad_reset, self.fork_every = bad_step, bad_reset, fork_every
        self.calls = calls if calls is not None else [0]
        self.current = None

    def reset(self, *, seed=None, options=None):
        if seed is not None and seed == self.bad_reset:
            raise EnvInfraError("reset lost")
        self.current = seed
        return super().reset(seed=seed, options=options)

    def _act(self, call):
        if self.current is not None and self.current == self.bad_step and self.turn == 1:
            raise EnvInfraError("sandbox lost")
        return super()._act(call)

    def fork(self, n):
        self.calls[0] += 1
        if self.fork_every and self.calls[0] % self.fork_every == 0:
            raise EnvInfraError("fork lost")
        copies = super().fork(n)
        for c in copies:
            c.bad_step, c.bad_reset, c.fork_every, c.calls = self.bad_step, self.bad_reset, self.fork_every, self.calls
        return copies


@pytest.fixture
def policy():
    return TabularPolicy(device="cpu")


DRIVERS = [{}, {"max_batch": 1}, {"max_batch": 3, "max_live": 4}, {"max_live": 1}, {"copies": False},
           {"copies": False, "max_batch": 1}]


@pytest.mark.parametrize("selection", ["uniform", "entropy"])
@pytest.mark.parametrize("caps", DRIVERS)
def test_trees_over_the_serial_sampler_are_the_serial_loops(policy, selection, caps):
    envs_ = [ClueProbeEnv(max_turns=5), ClueProbeEnv(max_turns=4)]
    serial = [serial_tree_rollout(envs_[0], policy, 3, 4, [1, 2, 3], random.Random(7), selection),
              serial_tree_rollout(envs_[1], policy, 1, 3, [9], random.Random(8), selection)]
    driver = WaveDriver(SerialSampler(), **caps)
    played = driver.trees([Tree(envs_[0], policy, 4, [1, 2, 3], random.Random(7)),
                           Tree(envs_[1], policy, 3, [9], random.Random(8))], selection)
    for a, b in zip(serial, played, strict=True):
        same(a, b)
    assert sum(e.fork_turn is not None for r in played for e in r.episodes if e.branch == 0) == 4  # every base forked
    assert driver.seconds["env"] > 0 and driver.seconds["decode"] > 0


@pytest.mark.parametrize("caps", DRIVERS)
def test_groups_over_the_serial_sampler_are_the_serial_loops(policy, caps):
    env = ClueProbeEnv(max_turns=5)
    serial = [serial_group_rollout(env, policy, 4, [0, 1, 2, 3], random.Random(1)),
              serial_group_rollout(env, policy, 2, [5, 5], random.Random(2))]
    played = WaveDriver(SerialSampler(), **caps).groups([Group(env, policy, [0, 1, 2, 3], random.Random(1)),
                                                         Group(env, policy, [5, 5], random.Random(2))])
    for a, b in zip(serial, played, strict=True):
        same(a, b)


@pytest.mark.parametrize("selection", ["uniform", "entropy"])
@pytest.mark.parametrize("fault", [{"bad_step": 2}, {"bad_reset": 3}, {"fork_every": 2}, {"fork_every": 3},
                                   {"fork_every": 1}, {"bad_step": 1, "fork_every": 4}])
def test_the_serial_rollouts_lose_what_the_serial_loops_lost(policy, selection, fault):
    """The module functions every unbatched entry point calls (no env copies: the env itself reused, one episode
    at a time) under lost steps, resets and forks: the oracle's episodes and counts, and no fork for a group."""
    oracle_env, env = Faulty(**fault, max_turns=4), Faulty(**fault, max_turns=4)
    a = serial_tree_rollout(oracle_env, policy, 4, 3, [1, 2, 3, 4], random.Random(5), selection)
    b = tree_rollout(env, policy, 4, 3, [1, 2, 3, 4], random.Random(5), selection)
    same(a, b)
    assert oracle_env.calls == env.calls
    if fault.get("fork_every") == 1:
        assert b.forks_failed == b.forks >= 4 and all(e.fork_turn is None for e in b.episodes if e.branch == 0)
    oracle_env, env = Faulty(**fault, max_turns=4), Faulty(**fault, max_turns=4)
    a = serial_group_rollout(oracle_env, policy, 5, [0, 1, 2, 3, 4], random.Random(6))
    b = group_rollout(env, policy, 5, [0, 1, 2, 3, 4], random.Random(6))
    same(a, b)
    assert env.calls == [0] and b.forks == 0
    if "bad_step" in fault or "bad_reset" in fault:
        assert sum(e.infra_failure for e in b.episodes) == 1


def test_bad_arguments_are_value_errors(policy):
    env = ClueProbeEnv()
    driver = WaveDriver(SerialSampler())
    with pytest.raises(ValueError, match="fork_selection"):
        driver.trees([Tree(env, policy, 2, [0], random.Random(0))], "random")
    with pytest.raises(ValueError, match="branches >= 1"):
        driver.trees([Tree(env, policy, 0, [0], random.Random(0))])
    with pytest.raises(ValueError, match="stream seeds"):
        driver.groups([Group(env, policy, [0, 1], stream_seeds=[1])])
    with pytest.raises(ValueError, match="need rng"):
        driver.groups([Group(env, policy, [0])])
    for bad in ({"max_batch": 0}, {"max_kv_tokens": 0}, {"env_threads": 0}, {"max_live": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            WaveDriver(SerialSampler(), **bad)
