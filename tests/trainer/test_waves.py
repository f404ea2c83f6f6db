"""The one wave driver (trainer/waves.py) over the serial sampler: any policy (here the tabular one, whose sessions
act one at a time) gives, batched into waves of any size and under any caps, the episodes of the serial loops of
trainer/rollout.py: same seeds, streams, actions, rewards, fork turns and env-call counts. Several trees and groups
played in one call each equal its own serial rollout."""

import random

import pytest

from envs.clueprobe import ClueProbeEnv
from trainer.rollout import group_rollout, tree_rollout
from trainer.tabular import TabularPolicy
from trainer.waves import Group, SerialSampler, Tree, WaveDriver


def same(a, b) -> None:
    assert (a.kind, a.env_calls, a.forks, a.forks_failed, a.branches_lost) == (
        b.kind, b.env_calls, b.forks, b.forks_failed, b.branches_lost)
    assert [(e.seed, e.base, e.branch, e.fork_turn, e.reward, e.reason, e.infra_failure, e.invalid_actions,
             [(s.turn, s.anchor_key, s.action, s.logp) for s in e.steps]) for e in a.episodes] == [
        (e.seed, e.base, e.branch, e.fork_turn, e.reward, e.reason, e.infra_failure, e.invalid_actions,
         [(s.turn, s.anchor_key, s.action, s.logp) for s in e.steps]) for e in b.episodes]


@pytest.fixture
def policy():
    return TabularPolicy(device="cpu")


@pytest.mark.parametrize("selection", ["uniform", "entropy"])
@pytest.mark.parametrize("caps", [{}, {"max_batch": 1}, {"max_batch": 3, "max_live": 4}, {"max_live": 1}])
def test_trees_over_the_serial_sampler_are_the_serial_loops(policy, selection, caps):
    envs_ = [ClueProbeEnv(max_turns=5), ClueProbeEnv(max_turns=4)]
    serial = [tree_rollout(envs_[0], policy, 3, 4, [1, 2, 3], random.Random(7), selection),
              tree_rollout(envs_[1], policy, 1, 3, [9], random.Random(8), selection)]
    driver = WaveDriver(SerialSampler(), **caps)
    played = driver.trees([Tree(envs_[0], policy, 4, [1, 2, 3], random.Random(7)),
                           Tree(envs_[1], policy, 3, [9], random.Random(8))], selection)
    for a, b in zip(serial, played, strict=True):
        same(a, b)
    assert sum(e.fork_turn is not None for r in played for e in r.episodes if e.branch == 0) == 4  # every base forked
    assert driver.seconds["env"] > 0 and driver.seconds["decode"] > 0


def test_groups_over_the_serial_sampler_are_the_serial_loops(policy):
    env = ClueProbeEnv(max_turns=5)
    serial = [group_rollout(env, policy, 4, [0, 1, 2, 3], random.Random(1)),
              group_rollout(env, policy, 2, [5, 5], random.Random(2))]
    played = WaveDriver(SerialSampler(), max_batch=3).groups([Group(env, policy, [0, 1, 2, 3], random.Random(1)),
                                                               Group(env, policy, [5, 5], random.Random(2))])
    for a, b in zip(serial, played, strict=True):
        same(a, b)


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
