"""The training loop: rollouts, per-step advantages, a policy-gradient step, metrics, greedy evaluation.

One iteration: sample a group rollout (G independent episodes) or a tree-fork rollout (``n_base``
bases x ``branches``), turn the chosen estimator's advantages into one value per step
(:func:`step_advantages`), and take one REINFORCE step with learning rate ``lr``. Metrics of every
iteration go to ``RUN_DIR/metrics.jsonl``; among them the infrastructure losses: ``infra_failures``
(episodes lost, branches of failed forks included), ``forks_failed`` (``env.fork`` calls that raised
``EnvInfraError``) and ``branches_lost`` (branches never run because their fork failed).
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

import envs  # noqa: F401  (registers forkyard ids)
from envs.actions import ActionParseError, parse_action
from trainer import advantages as adv
from trainer.rollout import Rollout, Step, group_rollout, tree_rollout

log = logging.getLogger(__name__)

ESTIMATORS = ("traj", "rloo", "anchor", "anchor_fallback", "tree")
ROLLOUTS = ("group", "tree")


def rollout_kind(estimator: str, rollout: str | None) -> str:
    """The rollout shape a run samples: ``rollout`` when given, else ``"tree"`` for the tree estimator and
    ``"group"`` for the others. Every estimator but ``tree`` also runs on a tree rollout: its episodes
    (bases and branches, each a full episode with the prefix it shares) form the group, and the
    siblings of a fork share an anchor, so ``anchor``/``anchor_fallback`` get the non-degenerate
    step groups the fork was made for (GiGPO, Feng et al. 2025, arXiv:2505.10978, combined advantage, on forced
    siblings).

    Raises:
        ValueError: on an unknown ``rollout``, or the tree estimator on a group rollout.
    """
    kind = rollout or ("tree" if estimator == "tree" else "group")
    if kind not in ROLLOUTS:
        raise ValueError(f"rollout must be one of {ROLLOUTS}, got {rollout!r}")
    if estimator == "tree" and kind != "tree":
        raise ValueError("the tree estimator needs a tree rollout")
    return kind
#: Warn when more than this fraction of anchors hold a single sample (seed article, section 6).
DEGENERATION_WARN = 0.30


@dataclass
class TrainConfig:
    """Hyperparameters of one training run (defaults: the seed article's protocol)."""

    env_id: str = "forkyard/ClueProbe-v0"
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"turns": 5})
    estimator: str = "traj"  # one of ESTIMATORS
    fork_selection: str = "uniform"  # tree only: "uniform" or "entropy"
    tree_prefix: str = "base"  # tree only: prefix value "base" (branch 0's return) or "branch_mean"
    rollout: str | None = None  # "group" or "tree"; None: tree for the tree estimator, else group
    group_size: int = 16  # G, group rollouts
    n_base: int = 5  # tree rollouts
    branches: int = 4  # m, tree rollouts (the base's own continuation included)
    iterations: int = 250
    max_env_calls: int | None = None  # stop once this many env calls were spent (equal-budget comparisons)
    eval_episodes: int = 64  # greedy evaluation on held-out seeds (ClueProbe: every target instead)
    lr: float = 0.1
    seed: int = 0
    omega: float = 1.0  # anchor_fallback: weight of the step-level term
    std_floor: float = adv.STD_FLOOR
    drop_zero_variance: bool = False  # DAPO dynamic sampling
    top_p: float | None = None  # StarPO-S: keep the top-p groups by reward std
    device: str = "auto"
    server_url: str | None = None
    run_dir: str | None = None
    progress: bool = False

    def validate(self) -> None:
        """Raises ValueError on an unknown estimator or out-of-range sizes."""
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if self.tree_prefix not in adv.TREE_PREFIXES:
            raise ValueError(f"tree_prefix must be one of {adv.TREE_PREFIXES}, got {self.tree_prefix!r}")
        rollout_kind(self.estimator, self.rollout)
        if min(self.group_size, self.n_base, self.branches, self.iterations) < 1:
            raise ValueError("group_size, n_base, branches and iterations must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


@dataclass
class Assigned:
    """Steps to train on with their advantages, plus the grouping statistics of the iteration."""

    steps: list[Step]
    advantages: list[float]
    n_episodes: int
    stats: dict[str, float]


def anchor_stats(steps: list[Step]) -> dict[str, float]:
    """Anchor buckets over ``steps``: count, mean size, and the fraction of size-1 buckets (degeneration)."""
    sizes = [len(v) for v in adv.bucket_by_anchor([s.anchor_key for s in steps]).values()]
    if not sizes:
        return {"anchors": 0, "mean_anchor_size": 0.0, "degeneration": 0.0}
    return {
        "anchors": len(sizes),
        "mean_anchor_size": sum(sizes) / len(sizes),
        "degeneration": sum(1 for s in sizes if s == 1) / len(sizes),
    }


def step_advantages(rollout: Rollout, cfg: TrainConfig) -> Assigned:
    """One advantage per step of ``rollout`` under ``cfg.estimator`` (see :mod:`trainer.advantages`).

    Groups for the filters (``drop_zero_variance``, ``top_p``): the whole group of episodes for
    ``traj``, ``rloo`` and ``anchor_fallback``; each anchor bucket for ``anchor``; each fork's m
    branches for ``tree`` (the base prefixes are kept). Steps of dropped groups and of episodes lost
    to infrastructure are left out; ``n_episodes`` counts the valid episodes (tree: bases and branches).
    """
    eps = rollout.episodes
    valid = rollout.valid
    kw = {"std_floor": cfg.std_floor}
    steps = [s for e in eps for s in e.steps]
    step_ep = [i for i, e in enumerate(eps) for _ in e.steps]
    rewards = [e.reward for e in eps]
    stats = anchor_stats([s for e, ok in zip(eps, valid) if ok for s in e.steps])
    est = cfg.estimator

    if est in ("traj", "rloo", "anchor_fallback"):
        groups = [[r for r, ok in zip(rewards, valid) if ok]]
        keep = adv.keep_groups(groups, drop_zero_variance=cfg.drop_zero_variance, top_p=cfg.top_p)[0]
        if est == "traj":
            ep_adv = adv.traj_advantages(rewards, valid=valid, **kw)
            values = [ep_adv[i] for i in step_ep]
        elif est == "rloo":
            ep_adv = adv.rloo_advantages(rewards, valid=valid)
            values = [ep_adv[i] for i in step_ep]
        else:
            values = adv.anchor_fallback_advantages(
                [s.anchor_key for s in steps], [rewards[i] for i in step_ep], step_ep, rewards,
                omega=cfg.omega, valid_episodes=valid, **kw,
            )
        step_keep = [keep and valid[i] for i in step_ep]
    elif est == "anchor":
        step_valid = [valid[i] for i in step_ep]
        step_ret = [rewards[i] for i in step_ep]
        values = adv.anchor_advantages([s.anchor_key for s in steps], step_ret, valid=step_valid, **kw)
        buckets = list(adv.bucket_by_anchor([s.anchor_key for s in steps]).values())
        groups = [[step_ret[i] for i in idx if step_valid[i]] for idx in buckets]
        keep_b = adv.keep_groups(groups, drop_zero_variance=cfg.drop_zero_variance, top_p=cfg.top_p)
        step_keep = list(step_valid)
        for idx, k in zip(buckets, keep_b):
            if not k:
                for i in idx:
                    step_keep[i] = False
    else:  # tree
        if rollout.kind != "tree":
            raise ValueError("the tree estimator needs a tree rollout")
        bases = [i for i, e in enumerate(eps) if e.branch == 0]
        members: dict[int, list[int]] = {}  # base episode index -> episode indices of its branches
        for i, e in enumerate(eps):
            members.setdefault(e.base, []).append(i)
        base_of = {eps[i].base: i for i in bases}
        prefix, branch = adv.tree_advantages(
            [rewards[i] for i in bases],
            [[rewards[i] for i in members[eps[i].base]] for i in bases],
            base_valid=[valid[i] for i in bases],
            branch_valid=[[valid[j] for j in members[eps[i].base]] for i in bases],
            prefix_value=cfg.tree_prefix,
            **kw,
        )
        groups = [[rewards[j] for j in members[eps[i].base] if valid[j]] for i in bases]
        keep_b = adv.keep_groups(groups, drop_zero_variance=cfg.drop_zero_variance, top_p=cfg.top_p)
        pos = {j: (bi, k) for bi, i in enumerate(bases) for k, j in enumerate(members[eps[i].base])}
        values, step_keep = [], []
        for s, i in zip(steps, step_ep):
            bi, k = pos[i]
            fork_turn = eps[base_of[eps[i].base]].fork_turn
            if fork_turn is None or s.turn < fork_turn:
                values.append(prefix[bi])
                step_keep.append(valid[i])
            else:
                values.append(branch[bi][k])
                step_keep.append(valid[i] and keep_b[bi])

    zero_var = [len(g) < 2 or max(g) - min(g) <= adv.EQUAL_TOL for g in groups]
    stats["zero_variance_groups"] = sum(zero_var) / max(len(groups), 1)
    kept = [(s, a) for s, a, k in zip(steps, values, step_keep) if k]
    return Assigned([s for s, _ in kept], [a for _, a in kept], sum(valid), stats)


def open_run_dir(run_dir: str | None, config: Any) -> tuple[Path | None, Any]:
    """Create ``run_dir`` with ``config.json`` (the dataclass ``config``) and open ``metrics.jsonl`` for
    writing. Returns ``(path, file)``, or ``(None, None)`` when ``run_dir`` is None."""
    if not run_dir:
        return None, None
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(config), indent=2))
    return out, (out / "metrics.jsonl").open("w")


def make_env(env_id: str, env_kwargs: dict[str, Any], server_url: str | None = None):
    """A bare env (no Gymnasium checker wrappers: the hot loop pays for none of them).

    ``server_url`` makes a remote env that proxies to a forkyard server."""
    kwargs = dict(env_kwargs)
    if server_url:
        kwargs["server_url"] = server_url
    return gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped


def evaluation_resets(env_id: str, env_kwargs: dict[str, Any], n_seeds: int = 256) -> list[tuple[int | None, dict | None]]:
    """Resets for greedy evaluation: every target of ClueProbe exactly (``options={"target": c}``),
    otherwise ``n_seeds`` held-out seeds (from 10**9 on, never used in training)."""
    if env_id.startswith("forkyard/ClueProbe"):
        bits = env_kwargs.get("bits", gym.spec(env_id).kwargs.get("bits", 3))
        return [(0, {"target": c}) for c in range(2**bits)]
    return [(10**9 + i, None) for i in range(n_seeds)]


def greedy_eval(policy, env, resets: list[tuple[int | None, dict | None]]) -> dict[str, float]:
    """Run the greedy (argmax) policy once per reset.

    Returns ``{"accuracy": mean reward, "distinct_tools": mean number of distinct non-answer actions
    per episode, "episodes": n}``.
    """
    total, distinct = 0.0, 0
    for seed, options in resets:
        obs, info = env.reset(seed=seed, options=options)
        used = set()
        while True:
            action = policy.greedy(info["anchor_key"], info["legal_actions"])
            try:
                if parse_action(action).name != "answer":
                    used.add(action)
            except ActionParseError:
                pass
            obs, r, te, tr, info = env.step(action)
            total += r
            if te or tr:
                break
        distinct += len(used)
    n = max(len(resets), 1)
    return {"accuracy": total / n, "distinct_tools": distinct / n, "episodes": len(resets)}


@dataclass
class TrainResult:
    config: TrainConfig
    metrics: list[dict[str, float]]
    evaluation: dict[str, float]
    policy: Any
    wall_s: float


def train(cfg: TrainConfig) -> TrainResult:
    """Run ``cfg.iterations`` iterations of tabular-policy REINFORCE; return metrics and greedy evaluation.

    Raises:
        ValueError: on an invalid config.
    """
    import torch

    from trainer.tabular import TabularPolicy
    from trainer.update import grad_norm, reinforce_loss

    cfg.validate()
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    env = make_env(cfg.env_id, cfg.env_kwargs, cfg.server_url)
    policy = TabularPolicy(device=cfg.device)
    out, sink = open_run_dir(cfg.run_dir, cfg)
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.iterations, desc=f"{cfg.estimator}", unit="it")
    metrics: list[dict[str, float]] = []
    warned = False
    tree = rollout_kind(cfg.estimator, cfg.rollout) == "tree"
    n_eps = cfg.n_base if tree else cfg.group_size
    spent = 0
    try:
        for it in range(cfg.iterations):
            if cfg.max_env_calls is not None and spent >= cfg.max_env_calls:
                break
            seeds = [(cfg.seed * 1_000_003 + it * n_eps + i) % 2**31 for i in range(n_eps)]
            if tree:
                ro = tree_rollout(env, policy, cfg.n_base, cfg.branches, seeds, rng, cfg.fork_selection)
            else:
                ro = group_rollout(env, policy, cfg.group_size, seeds, rng)
            spent += ro.env_calls
            assigned = step_advantages(ro, cfg)
            gnorm = 0.0
            if assigned.steps and any(a != 0.0 for a in assigned.advantages):
                logp = policy.log_probs(assigned.steps)
                a = torch.tensor(assigned.advantages, dtype=logp.dtype, device=logp.device)
                reinforce_loss(logp, a, assigned.n_episodes).backward()
                gnorm = grad_norm(policy.parameters())
                policy.sgd_step(cfg.lr)
            valid_rewards = [e.reward for e in ro.episodes if not e.infra_failure]
            all_steps = [s for e in ro.episodes for s in e.steps]
            m = {
                "iteration": it,
                "reward_mean": sum(valid_rewards) / max(len(valid_rewards), 1),
                "reward_std": adv.group_std(valid_rewards),
                "entropy": sum(s.entropy for s in all_steps) / max(len(all_steps), 1),
                "grad_norm": gnorm,
                "env_calls": ro.env_calls,
                "forks": ro.forks,
                "forks_failed": ro.forks_failed,
                "branches_lost": ro.branches_lost,
                "episodes": len(ro.episodes),
                "infra_failures": len(ro.episodes) - len(valid_rewards),
                "trained_steps": len(assigned.steps),
                **assigned.stats,
            }
            metrics.append(m)
            if sink:
                sink.write(json.dumps(m) + "\n")
            if m["degeneration"] > DEGENERATION_WARN and not warned:
                warned = True
                log.warning(
                    "iteration %d: %.0f%% of anchors hold a single sample (advantage 0 under anchor grouping); "
                    "above %.0f%%, consider tree forks", it, 100 * m["degeneration"], 100 * DEGENERATION_WARN,
                )
            if bar:
                bar.update(1)
                bar.set_postfix(reward=f"{m['reward_mean']:.2f}", degen=f"{m['degeneration']:.2f}")
    finally:
        if bar:
            bar.close()
        if sink:
            sink.close()
    evaluation = greedy_eval(policy, env, evaluation_resets(cfg.env_id, cfg.env_kwargs, cfg.eval_episodes))
    env.close()
    wall = time.perf_counter() - t0
    if out:
        (out / "summary.json").write_text(json.dumps({"evaluation": evaluation, "wall_s": wall}, indent=2))
    return TrainResult(cfg, metrics, evaluation, policy, wall)
