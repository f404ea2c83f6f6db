"""The one training loop (trainer/loop.py) over the Policy protocol: any object with ``session``,
``rollout_metrics`` and ``update`` trains in it; env-specific figures come from the env's
``info["episode_metrics"]``; the loop's hooks (shaping, monitors, evaluation, budget) do what they say."""

import json
import random

import pytest

from envs.clueprobe import ClueProbeEnv
from trainer.loop import LoopConfig, make_env, train_loop
from trainer.rollout import EPISODE_METRICS, EpisodeMetrics, Step
from trainer.waves import group_rollout
from trainer.tabular import TabularPolicy, greedy_eval
from trainer.tabular_config import TrainConfig


class _Session:
    def __init__(self, info):
        self.observe("", info)

    def observe(self, observation, info):
        self.turn, self.key, self.legal = info["turn"], info["anchor_key"], info["legal_actions"]

    def act(self, rng):
        i = int(rng.random() * len(self.legal))
        return Step(self.turn, self.key, self.legal[i], -1.0, 0.5, i)

    def entropy(self):
        return 0.5

    def fork(self):
        twin = object.__new__(_Session)
        twin.__dict__.update(self.__dict__)
        return twin


class UniformPolicy:
    """Neither tabular nor a language model: a uniform policy that records what the loop gives it."""

    def __init__(self):
        self.updates = []

    def session(self, observation, info):
        return _Session(info)

    def rollout_metrics(self, rollout):
        return {"steps_seen": len(rollout.steps)}

    def update(self, rollout, assigned):
        self.updates.append((len(rollout.episodes), len(assigned.steps), assigned.n_episodes))
        return {"grad_norm": 0.0, "mean_advantage": sum(assigned.advantages) / max(len(assigned.advantages), 1)}


class FireAt:
    key = "test_warning"

    def __init__(self, at):
        self.at = at

    def check(self, iteration, metrics):
        return f"fired at {iteration}" if iteration == self.at else None


def test_any_policy_of_the_protocol_trains_in_the_loop(tmp_path):
    cfg = LoopConfig(estimator="grpo", group_size=4, iterations=5, eval_every=2, run_dir=str(tmp_path))
    env = ClueProbeEnv(max_turns=3)
    policy = UniformPolicy()
    shaped, evals = [], []
    run = train_loop(cfg, env, policy, shaping=lambda ro: shaped.append(len(ro.episodes)), monitors=[FireAt(3)],
                     evaluate=lambda: evals.append(1) or {"score": 1.5})
    assert policy.updates == [(4, 12, 4)] * 5 and shaped == [4] * 5 and len(evals) == 3  # iterations 2, 4, 5
    assert run.warnings == ["fired at 3"]
    assert [m.get("test_warning") for m in run.metrics] == [None, None, None, 1, None]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("eval_score") for r in rows] == [None, 1.5, None, 1.5, 1.5]
    for m in rows:
        assert m["steps_seen"] == 12 and m["env_calls"] == 12 and "mean_advantage" in m
        assert 0 <= m["distinct_probes"] <= 2  # ClueProbe's own figure, averaged by the loop
    assert json.loads((tmp_path / "config.json").read_text())["estimator"] == "grpo"


def test_the_budget_stops_the_loop_and_env_calls_add_up():
    cfg = LoopConfig(estimator="rloo", group_size=4, iterations=50, max_env_calls=30)
    run = train_loop(cfg, ClueProbeEnv(max_turns=3), UniformPolicy())
    assert len(run.metrics) == 3  # 12 env calls per iteration: 0, 12, 24 < 30, then 36 >= 30
    assert [m["env_calls_total"] for m in run.metrics] == [12, 24, 36]


def test_episode_metrics_are_the_envs_and_match_the_old_trainer_definition():
    """ClueProbe reports distinct probe texts at each episode's end; the loop's mean equals counting the
    actions by hand (the figure the trainer used to compute itself)."""
    env = ClueProbeEnv(max_turns=4)
    ro = group_rollout(env, TabularPolicy(device="cpu"), 8, list(range(8)), random.Random(3))
    by_hand = [len({s.action for s in e.steps if s.action.startswith("probe")}) for e in ro.episodes]
    assert [e.env_metrics for e in ro.episodes] == [{"distinct_probes": n} for n in by_hand]
    agg = EpisodeMetrics()
    for e in ro.episodes:
        agg.add(e.env_metrics)
    assert agg.means() == {"distinct_probes": sum(by_hand) / 8}
    # the greedy evaluation reports it too (untrained table: always the first legal action, probe(0))
    out = greedy_eval(TabularPolicy(device="cpu"), env, [(0, {"target": c}) for c in range(8)])
    assert out == {"accuracy": 1 / 8, "distinct_probes": 1.0, "episodes": 8}


def test_an_env_metric_may_not_overwrite_a_loop_metric():
    class Clash(ClueProbeEnv):
        def step(self, action):
            out = super().step(action)
            if self.done:
                out[4][EPISODE_METRICS] = {"reward_mean": 1.0}
            return out

    with pytest.raises(ValueError, match="clashes"):
        train_loop(LoopConfig(estimator="grpo", group_size=2, iterations=1), Clash(max_turns=2), UniformPolicy())


def test_tabular_policy_sample_returns_what_it_says():
    policy = TabularPolicy(device="cpu")
    idx, logp, ent, row = policy.sample("k", ["a", "b", "c", "d"], random.Random(0))
    assert 0 <= idx < 4 and logp == pytest.approx(-1.3862943611198906) and ent == pytest.approx(1.3862943611198906)
    assert row == 0


def test_one_resolve_device():
    import trainer.text.lm
    import trainer.tabular
    import trainer.update

    assert trainer.text.lm.resolve_device is trainer.update.resolve_device is trainer.tabular.resolve_device
    assert str(trainer.update.resolve_device("cpu")) == "cpu"


def test_train_config_is_a_loop_config_with_the_tabular_fields():
    cfg = TrainConfig(max_turns=3, env_kwargs={"bits": 2})
    assert isinstance(cfg, LoopConfig) and cfg.env_options() == {"bits": 2, "max_turns": 3}
    env = make_env(cfg.env_id, cfg.env_options())
    assert env.max_turns == 3 and env.bits == 2
    with pytest.raises(ValueError, match="filter_top_p"):
        TrainConfig(filter_top_p=1.5).validate()
