"""The training driver, one for every policy: ``forkyard train --policy NAME`` (``train-lm`` is ``--policy lm``).

:func:`train` runs a policy's config top to bottom:

1. the run config (:func:`trainer.loop.run_config`: a resumed run's own settings, or a new run into a folder
   that holds no run), torch's CPU threads (``cfg.threads``);
2. the policy's **setup** builds a :class:`Trainee` from the config: the env, the learner (a
   :class:`trainer.loop.Policy`), its evaluations and its hooks (reward shaping, monitors, what the progress
   bar shows, what to save at the end). The tabular policy's is :func:`trainer.tabular.setup`, the text
   policy's :func:`trainer.text.text_train.setup`; a plugin's is named in its :class:`trainer.policies.Policy`;
3. the shared loop (:func:`trainer.loop.train_loop`): rollouts, advantages, updates, ``metrics.jsonl``,
   the resume state;
4. the final evaluation, the policy's ``finish`` (the text policy saves ``model.pt``), ``summary.json``.

Metrics of every iteration go to ``RUN_DIR/metrics.jsonl``; among them the infrastructure losses:
``infra_failures`` (episodes lost, branches of failed forks included), ``forks_failed`` (``env.fork`` calls
that raised ``EnvInfraError``) and ``branches_lost`` (branches never run because their fork failed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.loop import LoopConfig, Monitor, Policy, TrainResult, run_config, train_loop, write_summary
from trainer.rollout import Rollout


@dataclass
class Trainee:
    """What a policy's setup hands the driver (module docstring, item 2).

    Attributes:
        policy: the learner (:class:`trainer.loop.Policy`).
        env: the env the loop samples on; the driver closes it.
        evaluate: the final evaluation, ``() -> {name: value}`` (its figures go to ``summary.json``).
        periodic_evaluation: the evaluation every ``cfg.eval_every`` iterations (None: ``evaluate``).
        shaping: the loop's reward shaping hook, or None.
        monitors: stability checks run on every iteration's metrics.
        postfix: what the progress bar shows of an iteration's metrics (None: reward and anchor degeneration).
        finish: called with the run folder (None when not saved) after the final evaluation: the policy's
            artifacts (the text policy's ``model.pt``).
        model: the trained model, handed back in :attr:`trainer.loop.TrainResult.model` (None: none).
    """

    policy: Policy
    env: Any
    evaluate: Callable[[], dict[str, float]]
    periodic_evaluation: Callable[[], dict[str, float]] | None = None
    shaping: Callable[[Rollout], None] | None = None
    monitors: tuple[Monitor, ...] = ()
    postfix: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    finish: Callable[[Path | None], None] | None = None
    model: Any = None


def default_postfix(m: dict[str, Any]) -> dict[str, Any]:
    """The progress bar's figures of an iteration: mean reward and the share of single-sample anchors."""
    return {"reward": f"{m['reward_mean']:.2f}", "degen": f"{m['degeneration']:.2f}"}


def setup_for(cfg: LoopConfig) -> Callable[[Any], Trainee]:
    """The setup of the registered policy whose config class is ``type(cfg)`` (:mod:`trainer.policies`).

    Raises:
        ValueError: no registered policy has that config class.
    """
    from trainer.policies import get_policy, policy_names

    for name in policy_names():
        spec = get_policy(name)
        if spec.part("config") is type(cfg):
            return spec.part("setup")
    raise ValueError(f"no registered policy has the config {type(cfg).__name__}; pass its setup to train()")


def train(cfg: LoopConfig, setup: Callable[[Any], Trainee] | None = None, command: str = "train") -> TrainResult:
    """Train the policy ``cfg`` describes (module docstring); ``setup`` defaults to its registered policy's.

    Writes ``config.json``, ``metrics.jsonl``, ``resume.pt`` (every ``cfg.save_every`` iterations, at the last
    and on SIGTERM), ``summary.json`` and the policy's artifacts to ``cfg.run_dir`` when set; ``cfg.resume``
    continues the run in that folder (the policy built as the run built it, then given the saved state).

    Returns:
        A :class:`trainer.loop.TrainResult`: config, every iteration's metrics, the final evaluation, the
        policy, wall seconds, the monitors' warnings and the trained model (None for a policy without one).

    Raises:
        trainer.loop.RunDirError: (a ValueError) the run folder holds another run's records, or has no run to
            resume (``command`` names the command in the message).
        trainer.loop.TrainingInterrupted: SIGTERM / SIGINT stopped the run (its state is saved).
        ValueError: no registered policy for ``type(cfg)`` and no ``setup`` given.
    """
    cfg = run_config(cfg, command)
    setup = setup or setup_for(cfg)
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    trainee = setup(cfg)
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.iterations, desc=cfg.estimator, unit="it")

    def show(m: dict[str, Any]) -> None:
        bar.update(1)
        bar.set_postfix((trainee.postfix or default_postfix)(m))

    try:
        run = train_loop(cfg, trainee.env, trainee.policy, shaping=trainee.shaping, monitors=trainee.monitors,
                         evaluate=trainee.periodic_evaluation or trainee.evaluate,
                         on_iteration=show if bar else None, env_kwargs=cfg.env_options())
        evaluation = trainee.evaluate()
    finally:
        if bar:
            bar.close()
        trainee.env.close()
    if trainee.finish is not None:
        trainee.finish(run.run_dir)
    wall = time.perf_counter() - t0
    write_summary(run.run_dir, evaluation, wall, run.warnings)
    return TrainResult(cfg, run.metrics, evaluation, trainee.policy, wall, run.warnings, trainee.model)
