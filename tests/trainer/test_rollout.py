"""Group and tree-fork rollouts, step advantages, infrastructure failures, and the training loop."""

import random

import pytest

from envs.clueprobe import ClueProbeEnv
from envs.core import EnvInfraError
from trainer.waves import group_rollout, tree_rollout
from trainer.tabular import TabularPolicy
from trainer.estimators import anchor_stats, step_advantages
from trainer.tabular_config import TrainConfig
from trainer.train import train


class RecordingClueProbe(ClueProbeEnv):
    """ClueProbe that logs (reset seed, hidden target) at every step, shared by all its forks."""

    def __init__(self, log, **kwargs):
        super().__init__(**kwargs)
        self.log = log
        self.seed_used = None

    def reset(self, *, seed=None, options=None):
        self.seed_used = seed
        return super().reset(seed=seed, options=options)

    def _act(self, call):
        self.log.append((self.seed_used, self._target))
        return super()._act(call)


class FlakyClueProbe(ClueProbeEnv):
    """ClueProbe whose infrastructure fails on the second turn of episodes reset with a given seed."""

    def __init__(self, bad_seed, **kwargs):
        super().__init__(**kwargs)
        self.bad_seed, self.current = bad_seed, None

    def reset(self, *, seed=None, options=None):
        self.current = seed
        return super().reset(seed=seed, options=options)

    def _act(self, call):
        if self.current == self.bad_seed and self.turn == 1:
            raise EnvInfraError("sandbox lost")
        return super()._act(call)


@pytest.mark.parametrize("selection", ["uniform", "entropy"])
def test_tree_branches_share_their_base_target_and_count_env_calls(selection):
    log = []
    env = RecordingClueProbe(log, max_turns=5)
    ro = tree_rollout(env, TabularPolicy(device="cpu"), 5, 4, seeds=[10, 11, 12, 13, 14], rng=random.Random(0),
                      fork_selection=selection)
    targets = {}
    for seed, target in log:
        targets.setdefault(seed, set()).add(target)
    assert len(targets) == 5 and all(len(t) == 1 for t in targets.values())
    assert len({next(iter(t)) for t in targets.values()}) >= 2  # different bases, (usually) different targets
    assert len(ro.episodes) == 20
    assert ro.env_calls == len(log) == sum(len(e.steps) for e in ro.episodes)
    for e in ro.episodes:
        base = next(b for b in ro.episodes if b.base == e.base and b.branch == 0)
        assert e.fork_turn == base.fork_turn
        if e.branch:
            assert e.steps[0].turn == e.fork_turn and len(e.steps) == 5 - e.fork_turn
    if selection == "entropy":  # untrained policy: the answer turn (8 actions) has the highest entropy
        assert {e.fork_turn for e in ro.episodes} == {4}
        assert ro.env_calls == 5 * (5 + 3)


def test_uniform_fork_turns_cover_all_turns_and_cost_about_70_calls():
    env = ClueProbeEnv(max_turns=5)
    policy, rng = TabularPolicy(device="cpu"), random.Random(1)
    turns, calls = [], []
    for it in range(200):
        ro = tree_rollout(env, policy, 5, 4, [it * 5 + i for i in range(5)], rng)
        turns += [e.fork_turn for e in ro.episodes if e.branch == 0]
        calls.append(ro.env_calls)
    counts = [turns.count(t) for t in range(5)]
    assert all(abs(c / len(turns) - 0.2) < 0.04 for c in counts), counts
    assert abs(sum(calls) / len(calls) - 70) < 2  # 5 x (5 + 3 x 3) on average


def test_group_rollout_counts_and_degeneration_matches_article_at_t2():
    env = ClueProbeEnv(max_turns=2)
    policy, rng = TabularPolicy(device="cpu"), random.Random(0)
    degen = []
    for it in range(300):
        ro = group_rollout(env, policy, 16, [it * 16 + i for i in range(16)], rng)
        assert ro.env_calls == 32
        degen.append(anchor_stats([s for e in ro.episodes for s in e.steps])["degeneration"])
    # The reference granularity study (docs/results/granularity.md): 15.1% of anchors hold one sample at G=16,
    # T=2 (uniform policy; 16 into 6 buckets).
    assert abs(sum(degen) / len(degen) - 0.151) < 0.02


def test_infra_failures_are_left_out_of_group_statistics():
    env = FlakyClueProbe(bad_seed=3, max_turns=3)
    ro = group_rollout(env, TabularPolicy(device="cpu"), 6, list(range(6)), random.Random(0))
    lost = [e for e in ro.episodes if e.infra_failure]
    assert len(lost) == 1 and lost[0].seed == 3 and lost[0].reason == "infra_error"
    assigned = step_advantages(ro, TrainConfig(estimator="traj"))
    assert assigned.n_episodes == 5
    assert len(assigned.steps) == sum(len(e.steps) for e in ro.episodes if not e.infra_failure)
    lost_ids = {id(s) for s in lost[0].steps}
    assert not any(id(s) in lost_ids for s in assigned.steps)


def test_tree_step_advantages_follow_the_documented_rule():
    env = ClueProbeEnv(max_turns=3)
    ro = tree_rollout(env, TabularPolicy(device="cpu"), 4, 4, [0, 1, 2, 3], random.Random(5))
    assigned = step_advantages(ro, TrainConfig(estimator="tree"))
    by_id = {id(s): a for s, a in zip(assigned.steps, assigned.advantages, strict=True)}
    from trainer.advantages import normalize

    bases = [e for e in ro.episodes if e.branch == 0]
    prefix = normalize([b.reward for b in bases])
    for bi, b in enumerate(bases):
        group = [e for e in ro.episodes if e.base == b.base]
        branch = normalize([e.reward for e in group])
        for k, e in enumerate(group):
            for s in e.steps:
                expected = prefix[bi] if s.turn < b.fork_turn else branch[k]
                assert by_id[id(s)] == pytest.approx(expected)


def test_anchor_fallback_on_a_tree_rollout_groups_each_forks_siblings():
    """GiGPO on forced siblings: the group is every base and branch; a fork's m siblings share an anchor."""
    from trainer.advantages import normalize

    env = ClueProbeEnv(max_turns=3)
    ro = tree_rollout(env, TabularPolicy(device="cpu"), 4, 4, [0, 1, 2, 3], random.Random(5))
    assigned = step_advantages(ro, TrainConfig(estimator="anchor_fallback", rollout="tree", omega=0.5))
    assert assigned.n_episodes == 16 and len(assigned.steps) == sum(len(e.steps) for e in ro.episodes)
    episode_adv = normalize([e.reward for e in ro.episodes])
    steps = [(s, i) for i, e in enumerate(ro.episodes) for s in e.steps]
    by_id = {id(s): a for s, a in zip(assigned.steps, assigned.advantages, strict=True)}
    for b in (e for e in ro.episodes if e.branch == 0):
        fork_keys = {s.anchor_key for e in ro.episodes if e.base == b.base for s in e.steps if s.turn == b.fork_turn}
        assert len(fork_keys) == 1  # the 4 siblings act in one visible state
    for s, i in steps:  # hand rule: episode term + omega * normalised return within the step's anchor bucket
        bucket = [(t, j) for t, j in steps if t.anchor_key == s.anchor_key]
        step_adv = normalize([ro.episodes[j].reward for _, j in bucket])[[id(t) for t, _ in bucket].index(id(s))]
        assert by_id[id(s)] == pytest.approx(episode_adv[i] + 0.5 * step_adv)


def test_rollout_shape_defaults_to_the_estimator_and_rejects_a_tree_estimator_on_groups():
    from trainer.estimators import rollout_kind

    assert rollout_kind("tree", None) == "tree" and rollout_kind("traj", None) == "group"
    assert rollout_kind("traj", "tree") == "tree"
    with pytest.raises(ValueError, match="needs a tree rollout"):
        TrainConfig(estimator="tree", rollout="group").validate()
    with pytest.raises(ValueError, match="rollout must be"):
        TrainConfig(estimator="traj", rollout="forest").validate()
    result = train(TrainConfig(estimator="traj", rollout="tree", env_kwargs={"max_turns": 3}, n_base=3, branches=3,
                               iterations=2, device="cpu"))
    assert [m["episodes"] for m in result.metrics] == [9, 9]  # 3 bases x 3 branches, not a group of 16


def test_training_learns_with_tree_forks_at_t4():
    cfg = TrainConfig(estimator="tree", env_kwargs={"max_turns": 4}, iterations=400, lr=1.0, seed=0, device="cpu")
    result = train(cfg)
    assert result.evaluation["episodes"] == 8
    # optimum 1.0; the untrained greedy policy scores 0.125 (it always answers 0)
    assert result.evaluation["accuracy"] >= 0.5
    first = sum(m["reward_mean"] for m in result.metrics[:50]) / 50
    last = sum(m["reward_mean"] for m in result.metrics[-50:]) / 50
    assert last > first + 0.03  # 50 iterations x 20 episodes per window: sd of a window mean ~0.01
    assert all(m["env_calls"] > 0 for m in result.metrics)


def test_train_writes_jsonl_metrics(tmp_path):
    cfg = TrainConfig(estimator="anchor", env_kwargs={"max_turns": 3}, iterations=5, run_dir=str(tmp_path),
                      device="cpu")
    train(cfg)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 5
    import json

    m = json.loads(lines[0])
    for key in ("reward_mean", "reward_std", "entropy", "grad_norm", "env_calls", "anchors", "mean_anchor_size",
                "degeneration", "zero_variance_groups"):
        assert key in m
    assert (tmp_path / "summary.json").exists()


def test_config_validation():
    with pytest.raises(ValueError, match="estimator"):
        TrainConfig(estimator="nope").validate()
