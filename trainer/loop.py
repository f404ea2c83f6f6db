"""The training loop, one for every policy: sample, score, update, log (read it top to bottom).

One iteration of :func:`train_loop`:

1. **Rollout** (:func:`collect`): on the iteration's training seeds, a tree-fork rollout (``n_base``
   bases x ``branches``) or a group of ``group_size`` independent episodes
   (:func:`trainer.rollout.tree_rollout` / :func:`trainer.rollout.group_rollout`), shape per
   :func:`trainer.estimators.rollout_kind`. Optional reward shaping (the text policy's invalid-action
   penalty) changes the returns the advantages see.
2. **Advantages**: the registered estimator ``cfg.estimator`` and the group filters
   (:func:`trainer.estimators.step_advantages`).
3. **Update**: ``policy.update(rollout, assigned)``, the policy's own learning step (tabular:
   REINFORCE on its logit table; text: PPO epochs with Adam); it returns its metrics.
4. **Metrics** to ``RUN_DIR/metrics.jsonl``: the loop's own (reward mean/std, env calls, forks, lost
   episodes, anchor statistics), the policy's (``policy.rollout_metrics``), the env's (means of
   ``info["episode_metrics"]``, :class:`trainer.rollout.EpisodeMetrics`), the update's, monitor flags
   and, every ``eval_every`` iterations, ``eval_*`` from the evaluation hook.

The loop stops early once ``max_env_calls`` env calls were spent (no iteration starts after that). It
knows no env (it gets one) and no policy internals (:class:`Policy`): the tabular policy
(:class:`trainer.tabular.TabularPolicy`) and the text policy (:class:`trainer.text_train.PPOTextPolicy`)
both plug in here, and so will a Hugging Face policy.

Env-specific figures come from the env: at the step that ends an episode an env may report
``info["episode_metrics"] = {name: number}`` (ClueProbe: ``distinct_probes``); the loop and the
evaluations average each name over the episodes that reported it and log it under that name.
"""

from __future__ import annotations

import inspect
import json
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

import envs  # registers the forkyard ids
from envs.features import EvaluationResets
from trainer import advantages as adv
from trainer.config import setting
from trainer.estimators import Assigned, estimator_names, rollout_kind, step_advantages
from trainer.rollout import FORK_SELECTIONS, Actor, EpisodeMetrics, Rollout, group_rollout, tree_rollout

log = logging.getLogger(__name__)

#: Warn when more than this fraction of anchors hold a single sample (seed article, section 6).
DEGENERATION_WARN = 0.30


def env_id_arg(text: str) -> str:
    """``--env`` value: an id without a namespace is a forkyard one (``ClueProbe-v0`` -> ``forkyard/ClueProbe-v0``)."""
    return text if "/" in text else f"forkyard/{text}"


@dataclass
class LoopConfig:
    """The settings of :func:`train_loop`, shared by every policy's config (each field declared here once;
    a policy's config may give a field another default, e.g. ``n_base``).

    Groups (which commands show a field): ``common`` for every training command, ``loop`` for the RL
    commands (``train``, ``train-lm``).
    """

    env_id: str = setting("forkyard/ClueProbe-v0", flag="--env", aliases=("--env-id",), parse=env_id_arg,
                          group="common", help="a registered env id (the forkyard/ prefix is optional)")
    estimator: str = setting("tree", choices=estimator_names, group="loop",
                             help="advantage estimator (trainer/estimators.py; traj = grpo, anchor_fallback = gigpo)")
    rollout: str | None = setting(None, choices=("group", "tree"), group="loop",
                                  help="rollout shape (default: tree for the tree estimator, else group); any "
                                       "estimator but tree also runs on a tree rollout")
    fork_selection: str = setting("uniform", choices=FORK_SELECTIONS, group="loop",
                                  help="tree rollouts: fork turn uniform over the base's turns, or at its highest-entropy turn")
    tree_prefix: str = setting("base", choices=adv.TREE_PREFIXES, group="loop",
                               help="tree estimator: prefix turns valued by the base episode's return or its branches' mean")
    omega: float = setting(1.0, group="loop", help="gigpo / anchor_fallback: weight of the step-level (anchor) term")
    std_floor: float = setting(adv.STD_FLOOR, group="loop", help="lower bound on a group's reward std in the advantage")
    drop_zero_variance: bool = setting(False, group="loop",
                                       help="DAPO dynamic sampling: drop groups whose rewards are all equal")
    filter_top_p: float | None = setting(None, group="loop",
                                         help="StarPO-S: keep the top fraction of groups by reward std, in (0, 1]")
    group_size: int = setting(16, group="loop", help="G: independent episodes per group rollout")
    n_base: int = setting(5, group="loop", help="tree rollouts: base episodes per iteration")
    branches: int = setting(4, group="loop", help="tree rollouts: m, branches per fork (the base's own continuation included)")
    iterations: int = setting(250, group="loop", help="training iterations")
    max_env_calls: int | None = setting(None, group="loop",
                                        help="stop once this many env calls were spent (equal-budget comparisons)")
    eval_every: int = setting(0, group="loop", help="evaluate every N iterations and at the last (0: only at the end)")
    ray: str | None = setting(None, group="loop",
                              help="run the rollouts on a Ray cluster (trainer/cluster.py): auto (RAY_ADDRESS or "
                                   "the local cluster), a cluster address, or local (start one here); default: no Ray")
    node_capacity: int = setting(64, group="loop",
                                 help="with --ray: envs a node holds before its forks travel to another node")
    max_staleness: int = setting(0, group="loop",
                                 help="with --ray: rollouts may be sampled with weights up to N updates old (0: on-policy)")
    seed: int = setting(0, group="common", help="seed of the training seeds, the sampling RNG and torch")
    device: str = setting("auto", group="common", help="auto (CUDA when present), cpu or cuda")
    run_dir: str | None = setting(None, group="common", help="folder for config.json, metrics.jsonl, summary.json")
    progress: bool = setting(False, cli=False, help="show progress (the command line turns it on)")

    def validate(self) -> None:
        """Raises ValueError on an unknown estimator, rollout or tree prefix, a tree-only estimator on a
        group rollout, or out-of-range sizes."""
        if self.tree_prefix not in adv.TREE_PREFIXES:
            raise ValueError(f"tree_prefix must be one of {adv.TREE_PREFIXES}, got {self.tree_prefix!r}")
        rollout_kind(self.estimator, self.rollout)
        if min(self.group_size, self.n_base, self.branches, self.iterations) < 1:
            raise ValueError("group_size, n_base, branches and iterations must be >= 1")
        if self.filter_top_p is not None and not 0 < self.filter_top_p <= 1:
            raise ValueError(f"filter_top_p must be in (0, 1], got {self.filter_top_p}")
        if self.node_capacity < 1 or self.max_staleness < 0:
            raise ValueError(f"node_capacity must be >= 1 and max_staleness >= 0, got {self.node_capacity}, "
                             f"{self.max_staleness}")
        if self.ray is None and self.max_staleness:
            raise ValueError("--max-staleness pipelines rollouts on a Ray cluster: it needs --ray")
        if self.ray is not None and getattr(self, "server_url", None):
            raise ValueError("--ray runs the envs on the cluster's nodes; it cannot be combined with --server")


class Policy(Actor, Protocol):
    """What the training loop needs of a policy (tabular, text LM, or any other).

    ``session`` (from :class:`trainer.rollout.Actor`) acts: one :class:`trainer.rollout.PolicySession`
    per episode, forked with the env. The other two learn and report.
    """

    def rollout_metrics(self, rollout: Rollout) -> dict[str, float]:
        """The policy's figures about a rollout before the update (e.g. ``entropy``; text: also
        ``response_length``, ``invalid_share``)."""
        ...

    def update(self, rollout: Rollout, assigned: Assigned) -> dict[str, float]:
        """One learning step on the trained steps ``assigned`` (their advantages; ``assigned.n_episodes``
        valid episodes). Returns its metrics (at least ``grad_norm``; 0.0 when nothing was trained)."""
        ...


class Monitor(Protocol):
    """A stability check over the iteration metrics (:mod:`trainer.monitors`): ``check`` returns a warning
    text once it fires; the loop then records ``metrics[key] = 1`` and keeps the warning."""

    key: str

    def check(self, iteration: int, metrics: dict[str, Any]) -> str | None: ...


@dataclass
class LoopResult:
    """What :func:`train_loop` returns: every iteration's metrics, the monitors' warnings, the run folder
    (None when not saved) and the loop's wall time in seconds."""

    metrics: list[dict[str, Any]]
    warnings: list[str]
    run_dir: Path | None
    wall_s: float


@dataclass
class TrainResult:
    """A finished run: its config, metrics, final evaluation, the trained policy, wall seconds, warnings."""

    config: Any
    metrics: list[dict[str, Any]]
    evaluation: dict[str, float]
    policy: Any
    wall_s: float
    warnings: list[str] = field(default_factory=list)


def make_env(env_id: str, env_kwargs: dict[str, Any], server_url: str | None = None):
    """A bare env (no Gymnasium checker wrappers: the hot loop pays for none of them).

    ``server_url`` makes a remote env that proxies to a forkyard server."""
    kwargs = dict(env_kwargs)
    if server_url:
        kwargs["server_url"] = server_url
    return gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped


#: The first held-out seed: evaluation seeds are ``HELD_OUT_SEED + i``, never used in training.
HELD_OUT_SEED = 10**9


def held_out_resets(n_seeds: int) -> list[tuple[int | None, dict | None]]:
    """``n_seeds`` held-out resets ``(10**9 + i, None)`` (seeds never used in training)."""
    return [(HELD_OUT_SEED + i, None) for i in range(n_seeds)]


def env_class(env_id: str) -> type | None:
    """The class a registered ``env_id`` builds locally (a forkyard id: its class in :data:`envs.ENV_SPECS`,
    whatever ``server_url`` would make of it), or None when the entry point is no class."""
    if env_id in envs.ENV_SPECS:
        entry: Any = envs.ENV_SPECS[env_id][0]
    else:
        entry = gym.spec(env_id).entry_point
    if isinstance(entry, str):
        entry = load_env_creator(entry)
    return entry if isinstance(entry, type) else None


def env_parameters(env_id: str) -> set[str]:
    """Names of the constructor parameters of ``env_id``'s class (:func:`env_class`; empty when unknown)."""
    cls = env_class(env_id)
    return set(inspect.signature(cls).parameters) if cls is not None else set()


def evaluation_resets(env_id: str, env_kwargs: dict[str, Any], n_seeds: int = 256) -> list[tuple[int | None, dict | None]]:
    """Resets for evaluation: the env's own when its class declares them
    (:class:`envs.features.EvaluationResets`, given the registered kwargs merged with ``env_kwargs``;
    ClueProbe: every target exactly once), otherwise ``n_seeds`` held-out seeds (:func:`held_out_resets`).
    Decided by the registered class, so a run against a server (:class:`envs.remote.RemoteEnv`) evaluates
    on the same resets as a local one."""
    cls = env_class(env_id)
    if cls is not None and issubclass(cls, EvaluationResets):
        return list(cls.evaluation_resets({**gym.spec(env_id).kwargs, **env_kwargs}, n_seeds))
    return held_out_resets(n_seeds)


def open_run_dir(run_dir: str | None, config: Any) -> tuple[Path | None, Any]:
    """Create ``run_dir`` with ``config.json`` (the dataclass ``config``) and open ``metrics.jsonl`` for
    writing. Returns ``(path, file)``, or ``(None, None)`` when ``run_dir`` is None."""
    if not run_dir:
        return None, None
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(config), indent=2))
    return out, (out / "metrics.jsonl").open("w")


def write_summary(out: Path | None, evaluation: dict[str, float], wall_s: float, warnings: list[str]) -> None:
    """``RUN_DIR/summary.json``: the final evaluation, wall seconds and warnings (nothing when ``out`` is None)."""
    if out:
        (out / "summary.json").write_text(json.dumps({"evaluation": evaluation, "wall_s": wall_s, "warnings": warnings}, indent=2))


def training_seeds(seed: int, iteration: int, n: int) -> list[int]:
    """The ``n`` env reset seeds of ``iteration`` (disjoint across iterations; evaluation uses others)."""
    return [(seed * 1_000_003 + iteration * n + i) % 2**31 for i in range(n)]


def collect(cfg: LoopConfig, env, policy: Actor, rng: random.Random, iteration: int,
            shaping: Callable[[Rollout], None] | None = None,
            rollouts: Callable[[int], Rollout] | None = None) -> tuple[Rollout, Assigned]:
    """Steps 1-2 of an iteration: the rollout on ``iteration``'s training seeds (made by ``rollouts``
    when given: a Ray run's :meth:`trainer.cluster.RayCollector.rollout`), the reward shaping if any, and
    the per-step advantages. Returns ``(rollout, assigned)``."""
    if rollouts is not None:
        ro = rollouts(iteration)
    elif rollout_kind(cfg.estimator, cfg.rollout) == "tree":
        seeds = training_seeds(cfg.seed, iteration, cfg.n_base)
        ro = tree_rollout(env, policy, cfg.n_base, cfg.branches, seeds, rng, cfg.fork_selection)
    else:
        seeds = training_seeds(cfg.seed, iteration, cfg.group_size)
        ro = group_rollout(env, policy, cfg.group_size, seeds, rng)
    if shaping is not None:
        shaping(ro)
    return ro, step_advantages(ro, cfg)


def train_loop(cfg: LoopConfig, env, policy: Policy, *, shaping: Callable[[Rollout], None] | None = None,
               monitors: Iterable[Monitor] = (), evaluate: Callable[[], dict[str, float]] | None = None,
               on_iteration: Callable[[dict[str, Any]], None] | None = None,
               env_kwargs: dict[str, Any] | None = None) -> LoopResult:
    """Train ``policy`` on ``env`` for ``cfg.iterations`` iterations (module docstring).

    Args:
        cfg: the loop's settings (a policy's config extends :class:`LoopConfig`).
        env: a forkyard env (reset per episode, forked by tree rollouts); the caller closes it.
        policy: a :class:`Policy`.
        shaping: called on each rollout before the advantages (may change ``Episode.reward``).
        monitors: checks run on every iteration's metrics (:class:`Monitor`).
        evaluate: called every ``cfg.eval_every`` iterations and at the last; its figures are logged as
            ``eval_<name>``.
        on_iteration: called with every iteration's metrics (progress display).
        env_kwargs: the env's constructor kwargs, for the nodes of a Ray run (``cfg.ray``): each node's
            rollout worker makes its own env with them (``env`` then serves the evaluation only).

    Returns:
        A :class:`LoopResult`. Writes ``config.json`` and ``metrics.jsonl`` to ``cfg.run_dir`` when set.

    Raises:
        ValueError: on an invalid config.
    """
    import torch

    cfg.validate()
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)  # the policy's sampling RNG (and uniform fork turns)
    out, sink = open_run_dir(cfg.run_dir, cfg)
    metrics: list[dict[str, Any]] = []
    warnings: list[str] = []
    monitors = list(monitors)
    warned = False
    spent = 0
    collector = None
    try:
        if cfg.ray is not None:
            from trainer.cluster import RayCollector

            collector = RayCollector(cfg, policy, env_kwargs or {}, rollout_kind(cfg.estimator, cfg.rollout))
        for it in range(cfg.iterations):
            if cfg.max_env_calls is not None and spent >= cfg.max_env_calls:
                break  # equal-budget comparisons: no iteration starts once the budget is spent
            # 1-2. rollout, shaping, advantages
            ro, assigned = collect(cfg, env, policy, rng, it, shaping, collector.rollout if collector else None)
            valid_rewards = [e.reward for e in ro.episodes if not e.infra_failure]
            env_metrics = EpisodeMetrics()
            for e in ro.episodes:
                if not e.infra_failure:
                    env_metrics.add(e.env_metrics)
            m: dict[str, Any] = {
                "iteration": it,
                "reward_mean": sum(valid_rewards) / max(len(valid_rewards), 1),
                "reward_std": adv.group_std(valid_rewards),
                **policy.rollout_metrics(ro),
                "env_calls": ro.env_calls,
                "env_calls_total": spent + ro.env_calls,
                "forks": ro.forks,
                "forks_failed": ro.forks_failed,
                "branches_lost": ro.branches_lost,
                "episodes": len(ro.episodes),
                "infra_failures": len(ro.episodes) - len(valid_rewards),
                "trained_steps": len(assigned.steps),
                **assigned.stats,
            }
            _merge(m, ro.cluster, "cluster figure")
            _merge(m, env_metrics.means(), "env episode metric")
            spent += ro.env_calls
            # 3. the policy's learning step
            m.update(policy.update(ro, assigned))
            # 4. monitors, evaluation, log
            for monitor in monitors:
                warning = monitor.check(it, m)
                if warning:
                    warnings.append(warning)
                    m[monitor.key] = 1
            if m["degeneration"] > DEGENERATION_WARN and not warned:
                warned = True
                log.warning(
                    "iteration %d: %.0f%% of anchors hold a single sample (advantage 0 under anchor grouping); "
                    "above %.0f%%, consider tree forks", it, 100 * m["degeneration"], 100 * DEGENERATION_WARN,
                )
            if evaluate is not None and cfg.eval_every and ((it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations):
                m.update({f"eval_{k}": v for k, v in evaluate().items()})
            m["wall_s"] = time.perf_counter() - t0
            metrics.append(m)
            if sink:
                sink.write(json.dumps(m) + "\n")
                sink.flush()
            if on_iteration is not None:
                on_iteration(m)
    finally:
        if collector is not None:
            collector.close()
        if sink:
            sink.close()
    return LoopResult(metrics, warnings, out, time.perf_counter() - t0)


def _merge(target: dict[str, Any], extra: dict[str, Any], what: str) -> None:
    """``target.update(extra)``, refusing a name ``target`` already holds (an env metric may not
    overwrite one of the loop's)."""
    clash = target.keys() & extra.keys()
    if clash:
        raise ValueError(f"{what} {sorted(clash)} clashes with a metric of the same name")
    target.update(extra)
