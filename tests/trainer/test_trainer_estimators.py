"""The estimator registry (trainer/estimators.py): standard names and aliases, one registration adds an
estimator that trains, and the registry is the only place estimator names are resolved."""

import random

import pytest

from envs.clueprobe import ClueProbeEnv
from trainer import advantages as adv
from trainer.estimators import (
    Scores,
    episode_scores,
    estimator_names,
    get_estimator,
    register_estimator,
    rollout_kind,
    step_advantages,
    unregister_estimator,
)
from trainer.waves import group_rollout, tree_rollout
from trainer.tabular import TabularPolicy
from trainer.tabular_config import TrainConfig
from trainer.train import train


def test_standard_names_and_aliases():
    names = estimator_names()
    for name in ("grpo", "rloo", "gigpo", "tree", "anchor", "traj", "anchor_fallback"):
        assert name in names
    assert get_estimator("traj") is get_estimator("grpo")
    assert get_estimator("anchor_fallback") is get_estimator("gigpo")
    assert get_estimator("tree").needs_tree and not get_estimator("grpo").needs_tree
    with pytest.raises(ValueError, match="estimator must be one of"):
        get_estimator("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("traj", lambda ro, cfg: None)


@pytest.mark.parametrize("alias, name", [("traj", "grpo"), ("anchor_fallback", "gigpo")])
def test_an_alias_gives_the_same_advantages_as_its_name(alias, name):
    env = ClueProbeEnv(max_turns=3)
    ro = tree_rollout(env, TabularPolicy(device="cpu"), 3, 3, [0, 1, 2], random.Random(1))
    a = step_advantages(ro, TrainConfig(estimator=alias, rollout="tree", omega=0.5))
    b = step_advantages(ro, TrainConfig(estimator=name, rollout="tree", omega=0.5))
    assert a.advantages == b.advantages and a.stats == b.stats


def test_one_registration_adds_an_estimator_that_trains(tmp_path):
    """A trivial estimator (every step's advantage: its episode's return minus 0.5) in one registration:
    the config validates, the loop trains one iteration with it, and the CLI offers it."""
    calls = []

    def centred(rollout, cfg):
        calls.append(len(rollout.steps))
        return episode_scores(rollout, [r - 0.5 for r in rollout.rewards])

    register_estimator("centred", centred)
    try:
        assert rollout_kind("centred", None) == "group"
        result = train(TrainConfig(estimator="centred", env_kwargs={"max_turns": 3}, group_size=8, iterations=1,
                                   eval_episodes=4, device="cpu", run_dir=str(tmp_path)))
        (m,) = result.metrics
        assert calls == [24] and m["trained_steps"] == 24 and m["grad_norm"] > 0
        from trainer.cli import build_parser

        parser = build_parser("train")
        assert parser.parse_args(["train", "--estimator", "centred"]).estimator == "centred"
    finally:
        unregister_estimator("centred")
    assert "centred" not in estimator_names()


def test_a_tree_only_estimator_is_refused_on_groups_and_filters_apply_to_declared_groups():
    def by_base(rollout, cfg):  # one filter group per fork: the branch returns
        groups = {}
        for e in rollout.episodes:
            groups.setdefault(e.base, []).append(e.reward)
        order = list(groups)
        step_group = [order.index(e.base) for e in rollout.episodes for _ in e.steps]
        return Scores([1.0] * len(step_group), [groups[b] for b in order], step_group)

    register_estimator("by_base", by_base, needs_tree=True)
    try:
        with pytest.raises(ValueError, match="needs a tree rollout"):
            TrainConfig(estimator="by_base", rollout="group").validate()
        env = ClueProbeEnv(max_turns=3)
        ro = tree_rollout(env, TabularPolicy(device="cpu"), 4, 3, [0, 1, 2, 3], random.Random(2))
        kept = step_advantages(ro, TrainConfig(estimator="by_base", drop_zero_variance=True))
        spread = {e.base: [x.reward for x in ro.episodes if x.base == e.base] for e in ro.episodes}
        expected = sum(len(e.steps) for e in ro.episodes if max(spread[e.base]) - min(spread[e.base]) > adv.EQUAL_TOL)
        assert len(kept.steps) == expected
        group = group_rollout(env, TabularPolicy(device="cpu"), 4, [0, 1, 2, 3], random.Random(0))
        with pytest.raises(ValueError, match="needs a tree rollout"):
            step_advantages(group, TrainConfig(estimator="by_base"))
    finally:
        unregister_estimator("by_base")


def test_an_estimator_of_the_wrong_length_is_refused():
    register_estimator("short", lambda ro, cfg: Scores([0.0], [], [None]))
    try:
        env = ClueProbeEnv(max_turns=3)
        ro = group_rollout(env, TabularPolicy(device="cpu"), 2, [0, 1], random.Random(0))
        with pytest.raises(ValueError, match="gave 1 values"):
            step_advantages(ro, TrainConfig(estimator="short"))
    finally:
        unregister_estimator("short")
