"""The tabular trainer: a :class:`~trainer.tabular.TabularPolicy` trained by :func:`trainer.loop.train_loop`.

One iteration (the shared loop, :mod:`trainer.loop`): a group rollout (G independent episodes) or a
tree-fork rollout (``n_base`` bases x ``branches``), the chosen estimator's advantages per step
(:mod:`trainer.estimators`), and one REINFORCE step with learning rate ``lr``
(:meth:`TabularPolicy.update`). Metrics of every iteration go to ``RUN_DIR/metrics.jsonl``; among them
the infrastructure losses: ``infra_failures`` (episodes lost, branches of failed forks included),
``forks_failed`` (``env.fork`` calls that raised ``EnvInfraError``) and ``branches_lost`` (branches
never run because their fork failed). The run ends with a greedy evaluation (:func:`greedy_eval`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from trainer.config import setting
from trainer.loop import (
    LoopConfig,
    TrainResult,
    evaluation_resets,
    make_env,
    run_config,
    train_loop,
    write_summary,
)
from trainer.rollout import EpisodeMetrics


@dataclass
class TrainConfig(LoopConfig):
    """Hyperparameters of a tabular run (defaults: the protocol of the reference granularity study,
    docs/results/granularity.md); the loop's settings are those of :class:`trainer.loop.LoopConfig`.
    ``forkyard train`` is generated from these fields."""

    turns: int | None = setting(None, group="common",
                                help="shortcut for --env-kwarg turns=N (None: the env's default)")
    env_kwargs: dict[str, Any] = setting(default_factory=dict, flag="--env-kwarg", group="common",
                                         help="an env constructor argument, KEY=VALUE (repeatable; values parsed "
                                              "as JSON)")
    lr: float = setting(0.1, group="loop", help="SGD step size on the logit table")
    eval_episodes: int = setting(64, group="loop",
                                 help="greedy evaluation episodes on held-out seeds (ClueProbe: every target instead)")
    server_url: str | None = setting(None, flag="--server", aliases=("--server-url",), group="common",
                                     help="URL of a forkyard server; envs run there")

    def env_options(self) -> dict[str, Any]:
        """The env's constructor kwargs: ``env_kwargs`` with ``turns`` added when it is set."""
        return self.env_kwargs if self.turns is None else {**self.env_kwargs, "turns": self.turns}

    def validate(self) -> None:
        """:meth:`LoopConfig.validate`, ``lr > 0``, and ``max_staleness == 0`` (REINFORCE on the table has no
        off-policy correction). Raises ValueError."""
        super().validate()
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_staleness:
            raise ValueError("the tabular policy's REINFORCE update has no off-policy correction: "
                             "max_staleness must be 0 (the text policy's PPO takes stale rollouts)")


def greedy_eval(policy, env, resets: list[tuple[int | None, dict | None]]) -> dict[str, float]:
    """Run the greedy (argmax) tabular policy once per reset.

    Returns ``{"accuracy": mean reward, <env episode metrics>: their means, "episodes": n}``; the env's
    metrics are what it reports in ``info["episode_metrics"]`` at each episode's end (ClueProbe:
    ``distinct_probes``, the mean number of distinct probes per episode).
    """
    total = 0.0
    env_metrics = EpisodeMetrics()
    for seed, options in resets:
        obs, info = env.reset(seed=seed, options=options)
        while True:
            obs, r, te, tr, info = env.step(policy.greedy(info["anchor_key"], info["legal_actions"]))
            total += r
            if te or tr:
                env_metrics.add_info(info)
                break
    return {"accuracy": total / max(len(resets), 1), **env_metrics.means(), "episodes": len(resets)}


def train(cfg: TrainConfig) -> TrainResult:
    """Run ``cfg.iterations`` iterations of tabular-policy REINFORCE; return metrics and greedy evaluation.

    Writes ``config.json``, ``metrics.jsonl``, ``resume.pt`` (every ``cfg.save_every`` iterations, at the
    last and on SIGTERM) and ``summary.json`` to ``cfg.run_dir`` when set; ``cfg.resume`` continues the run
    in that folder (:func:`trainer.loop.run_config`, :func:`trainer.loop.train_loop`).

    Raises:
        ValueError: on an invalid config; :class:`trainer.loop.RunDirError` (a ValueError) when the run folder
            holds another run's records, or has no run to resume.
        trainer.loop.TrainingInterrupted: SIGTERM / SIGINT stopped the run (its state is saved).
    """
    from trainer.tabular import TabularPolicy

    cfg = run_config(cfg)
    cfg.validate()
    t0 = time.perf_counter()
    env = make_env(cfg.env_id, cfg.env_options(), cfg.server_url)
    policy = TabularPolicy(device=cfg.device, lr=cfg.lr)
    resets = evaluation_resets(cfg.env_id, cfg.env_options(), cfg.eval_episodes)
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.iterations, desc=f"{cfg.estimator}", unit="it")

    def show(m: dict[str, Any]) -> None:
        bar.update(1)
        bar.set_postfix(reward=f"{m['reward_mean']:.2f}", degen=f"{m['degeneration']:.2f}")

    try:
        run = train_loop(cfg, env, policy, evaluate=lambda: greedy_eval(policy, env, resets),
                         on_iteration=show if bar else None, env_kwargs=cfg.env_options())
        evaluation = greedy_eval(policy, env, resets)
    finally:
        if bar:
            bar.close()
        env.close()
    wall = time.perf_counter() - t0
    write_summary(run.run_dir, evaluation, wall, run.warnings)
    return TrainResult(cfg, run.metrics, evaluation, policy, wall, run.warnings)
