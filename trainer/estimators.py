"""Advantage estimators by name: a registry over the pure functions of :mod:`trainer.advantages`.

An estimator turns one iteration's :class:`~trainer.rollout.Rollout` into one advantage per step. It is
a function ``fn(rollout, cfg) -> Scores`` registered under a name (and aliases) with
:func:`register_estimator`; the training loop finds it with :func:`get_estimator` and never branches on
names. ``cfg`` is the run's :class:`trainer.loop.LoopConfig` (the estimator reads ``std_floor``,
``omega``, ``tree_prefix`` as it needs). Adding an estimator is one registration::

    @register_estimator("mine")
    def mine(rollout, cfg):
        return episode_scores(rollout, [r - 0.5 for r in rollout.rewards])

Built in (the field's names, with forkyard's earlier names as aliases):

========  ==================  ===========================================================================
name      aliases             advantage
========  ==================  ===========================================================================
grpo      traj                episode-level, group-normalised (Shao et al. 2024, arXiv:2402.03300, 4.1.2)
rloo                          episode-level leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740, eq. 5)
anchor                        step-level, normalised within anchor-state buckets (GiGPO's step term alone)
gigpo     anchor_fallback     episode + omega * anchor term (Feng et al. 2025, arXiv:2505.10978)
tree                          fork siblings share one anchor; prefixes valued over the bases (tree rollouts)
========  ==================  ===========================================================================

From an installed package, declare the function in the entry-point group ``forkyard.estimators`` under its
name (``mine = "my_pkg.estimators:mine"``; a ``needs_tree = True`` attribute of the function says it needs a
tree rollout): the registry loads the group on first lookup (:class:`envs.plugins.PluginRegistry`).

The group filters (``drop_zero_variance``, ``filter_top_p``: :func:`trainer.advantages.keep_groups`) and
the grouping statistics are applied by :func:`step_advantages` to the groups each estimator declares
(:class:`Scores`), the same way for every estimator.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from envs.plugins import PluginRegistry
from trainer import advantages as adv
from trainer.rollout import Rollout, Step

#: Rollout shapes (:func:`rollout_kind`).
ROLLOUTS = ("group", "tree")


@dataclass
class Scores:
    """What an estimator returns for a rollout with S steps (in :attr:`Rollout.steps` order).

    Attributes:
        values: [S] advantage of every step (floats; a step of an invalid episode may hold anything:
            it is never trained).
        groups: the reward groups the filters and the ``zero_variance_groups`` statistic see: one list
            of the valid members' returns per group.
        step_group: [S] index into ``groups`` of the group whose filter decides each step, or None for a
            step no filter drops (a tree's shared prefix).
    """

    values: list[float]
    groups: list[list[float]]
    step_group: list[int | None]


EstimatorFn = Callable[[Rollout, Any], Scores]


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: its name, function, aliases and whether it needs a tree rollout."""

    name: str
    fn: EstimatorFn
    aliases: tuple[str, ...] = ()
    needs_tree: bool = False


_REGISTRY: PluginRegistry = PluginRegistry()  # name or alias -> estimator; plugins join on first lookup


def register_estimator(name: str, fn: EstimatorFn | None = None, *, aliases: tuple[str, ...] = (),
                       needs_tree: bool = False):
    """Register ``fn`` as the estimator ``name`` (and ``aliases``); usable as a decorator.

    Args:
        name: the name ``--estimator`` and ``LoopConfig.estimator`` take.
        fn: ``fn(rollout, cfg) -> Scores`` (see the module docstring).
        aliases: other names for the same estimator.
        needs_tree: the estimator reads the fork structure of a tree rollout (``Episode.base``,
            ``branch``, ``fork_turn``); a group rollout is then refused and the default rollout is a tree.

    Returns:
        ``fn`` (or, without ``fn``, a decorator that registers and returns its function).

    Raises:
        ValueError: if ``name`` or an alias is already registered.
    """
    def add(f: EstimatorFn) -> EstimatorFn:
        est = Estimator(name, f, tuple(aliases), needs_tree)
        for key in (name, *aliases):
            if key in _REGISTRY:
                raise ValueError(f"estimator {key!r} is already registered")
        for key in (name, *aliases):
            _REGISTRY[key] = est
        return f

    return add if fn is None else add(fn)


def unregister_estimator(name: str) -> None:
    """Remove the estimator ``name`` with all its aliases (tests, experiments). Unknown names are ignored."""
    est = _REGISTRY.get(name)
    if est is not None:
        for key in (est.name, *est.aliases):
            _REGISTRY.pop(key, None)


def estimator_names() -> tuple[str, ...]:
    """Every name ``--estimator`` accepts: registered names and aliases, in registration order."""
    return tuple(_REGISTRY)


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name`` (a name or an alias).

    Raises:
        ValueError: on an unknown name (the message lists the known ones).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"estimator must be one of {estimator_names()}, got {name!r}"
                         f"{_REGISTRY.explain(name)}") from None


def rollout_kind(estimator: str, rollout: str | None) -> str:
    """The rollout shape a run samples: ``rollout`` when given, else ``"tree"`` for an estimator that needs
    one (``tree``) and ``"group"`` for the others. Every other estimator also runs on a tree rollout: its
    episodes (bases and branches, each a full episode with the prefix it shares) form the group, and the
    siblings of a fork share an anchor, so ``anchor``/``gigpo`` get the non-degenerate step groups the
    fork was made for (GiGPO, Feng et al. 2025, arXiv:2505.10978, combined advantage, on forced siblings).

    Raises:
        ValueError: on an unknown estimator or ``rollout``, or a tree-only estimator on a group rollout.
    """
    needs_tree = get_estimator(estimator).needs_tree
    kind = rollout or ("tree" if needs_tree else "group")
    if kind not in ROLLOUTS:
        raise ValueError(f"rollout must be one of {ROLLOUTS}, got {rollout!r}")
    if needs_tree and kind != "tree":
        raise ValueError(f"the {estimator} estimator needs a tree rollout")
    return kind


# ---------------------------------------------------------------------------------------------- built-ins
def episode_scores(rollout: Rollout, episode_adv: list[float]) -> Scores:
    """:class:`Scores` of an episode-level estimator: each step gets its episode's value ``episode_adv``
    ([K], one per episode); one filter group of all valid episodes' returns."""
    rewards, valid = rollout.rewards, rollout.valid
    step_ep = rollout.step_episode
    return Scores([episode_adv[i] for i in step_ep], [[r for r, ok in zip(rewards, valid, strict=True) if ok]],
                  [0] * len(step_ep))


@register_estimator("grpo", aliases=("traj",))
def grpo(rollout: Rollout, cfg: Any) -> Scores:
    """GRPO's trajectory-level advantage over the rollout's episodes, broadcast to every step
    (:func:`trainer.advantages.traj_advantages`; Shao et al. 2024, arXiv:2402.03300, section 4.1.2)."""
    return episode_scores(rollout, adv.traj_advantages(rollout.rewards, valid=rollout.valid, std_floor=cfg.std_floor))


@register_estimator("rloo")
def rloo(rollout: Rollout, cfg: Any) -> Scores:
    """REINFORCE leave-one-out over the episodes, broadcast to every step
    (:func:`trainer.advantages.rloo_advantages`; Ahmadian et al. 2024, arXiv:2402.14740, eq. 5)."""
    return episode_scores(rollout, adv.rloo_advantages(rollout.rewards, valid=rollout.valid))


#: What ``cfg.anchor_by`` may name: the key anchor-grouping estimators bucket steps by (:func:`anchor_keys`).
ANCHOR_BY = ("history", "state")


def anchor_keys(steps: list[Step], anchor_by: str = "history") -> list[str]:
    """The key of each step's anchor bucket: ``"history"``, the visible history (``Step.anchor_key``, the env's
    ``info["anchor_key"]``); ``"state"``, the current state alone (``Step.state_key``, ``info["state_key"]``: GiGPO's
    anchor states, Feng et al. 2025, arXiv:2505.10978).

    Raises:
        ValueError: an unknown ``anchor_by``, or ``"state"`` when a step has no state key (its policy's sessions
            did not record ``info["state_key"]``, or its env does not report one).
    """
    if anchor_by == "history":
        return [s.anchor_key for s in steps]
    if anchor_by != "state":
        raise ValueError(f"anchor_by must be one of {ANCHOR_BY}, got {anchor_by!r}")
    if any(not s.state_key for s in steps):
        raise ValueError("anchor_by='state' needs every step's state key (info['state_key']); this policy's "
                         "sessions or this env did not record one")
    return [s.state_key for s in steps]


@register_estimator("anchor")
def anchor(rollout: Rollout, cfg: Any) -> Scores:
    """Step-level advantage within anchor-state buckets (:func:`trainer.advantages.anchor_advantages`;
    GiGPO's step term alone, Feng et al. 2025, arXiv:2505.10978), keyed per ``cfg.anchor_by``
    (:func:`anchor_keys`). Each bucket is a filter group."""
    rewards, valid, step_ep = rollout.rewards, rollout.valid, rollout.step_episode
    keys = anchor_keys(rollout.steps, getattr(cfg, "anchor_by", "history"))
    step_valid = [valid[i] for i in step_ep]
    step_ret = [rewards[i] for i in step_ep]
    values = adv.anchor_advantages(keys, step_ret, valid=step_valid, std_floor=cfg.std_floor)
    buckets = list(adv.bucket_by_anchor(keys).values())
    step_group: list[int | None] = [None] * len(keys)
    for g, idx in enumerate(buckets):
        for i in idx:
            step_group[i] = g
    return Scores(values, [[step_ret[i] for i in idx if step_valid[i]] for idx in buckets], step_group)


@register_estimator("gigpo", aliases=("anchor_fallback",))
def gigpo(rollout: Rollout, cfg: Any) -> Scores:
    """GiGPO's combined advantage ``A^E_i + omega * A^S_{i,t}`` (Feng et al. 2025, arXiv:2505.10978;
    :func:`trainer.advantages.anchor_fallback_advantages`), the step term keyed per ``cfg.anchor_by``
    (:func:`anchor_keys`). One filter group: all valid episodes."""
    rewards, valid, step_ep = rollout.rewards, rollout.valid, rollout.step_episode
    values = adv.anchor_fallback_advantages(
        anchor_keys(rollout.steps, getattr(cfg, "anchor_by", "history")), [rewards[i] for i in step_ep], step_ep,
        rewards, omega=cfg.omega, valid_episodes=valid, std_floor=cfg.std_floor,
    )
    return Scores(values, [[r for r, ok in zip(rewards, valid, strict=True) if ok]], [0] * len(step_ep))


@register_estimator("tree", needs_tree=True)
def tree(rollout: Rollout, cfg: Any) -> Scores:
    """Tree-fork advantages (:func:`trainer.advantages.tree_advantages`, prefix valued per
    ``cfg.tree_prefix``): a step before its base's fork turn gets the base's prefix advantage (never
    filtered), a later step its branch's advantage among the fork's siblings (one filter group per fork).

    Raises:
        ValueError: on a group rollout.
    """
    if rollout.kind != "tree":
        raise ValueError("the tree estimator needs a tree rollout")
    eps, rewards, valid = rollout.episodes, rollout.rewards, rollout.valid
    bases = [i for i, e in enumerate(eps) if e.branch == 0]
    members: dict[Hashable, list[int]] = {}  # base index -> episode indices of its branches
    for i, e in enumerate(eps):
        members.setdefault(e.base, []).append(i)
    base_of = {eps[i].base: i for i in bases}
    prefix, branch = adv.tree_advantages(
        [rewards[i] for i in bases],
        [[rewards[i] for i in members[eps[i].base]] for i in bases],
        base_valid=[valid[i] for i in bases],
        branch_valid=[[valid[j] for j in members[eps[i].base]] for i in bases],
        prefix_value=cfg.tree_prefix,
        std_floor=cfg.std_floor,
    )
    groups = [[rewards[j] for j in members[eps[i].base] if valid[j]] for i in bases]
    pos = {j: (bi, k) for bi, i in enumerate(bases) for k, j in enumerate(members[eps[i].base])}
    values: list[float] = []
    step_group: list[int | None] = []
    for s, i in zip(rollout.steps, rollout.step_episode, strict=True):
        bi, k = pos[i]
        fork_turn = eps[base_of[eps[i].base]].fork_turn
        if fork_turn is None or s.turn < fork_turn:
            values.append(prefix[bi])
            step_group.append(None)
        else:
            values.append(branch[bi][k])
            step_group.append(bi)
    return Scores(values, groups, step_group)


def _add_plugin(name: str, fn: Any) -> None:
    """A ``forkyard.estimators`` entry point: an estimator function, registered as ``name``."""
    if not callable(fn):
        raise TypeError(f"names a {type(fn).__name__}, not an estimator function fn(rollout, cfg) -> Scores")
    register_estimator(name, fn, needs_tree=bool(getattr(fn, "needs_tree", False)))


_REGISTRY.load_from("forkyard.estimators", _add_plugin)


# ---------------------------------------------------------------------------------------------- per step
@dataclass
class Assigned:
    """Steps to train on with their advantages, plus the grouping statistics of the iteration.

    Attributes:
        steps: the trained steps (steps of dropped groups and of lost episodes left out).
        advantages: one float per trained step.
        n_episodes: valid episodes of the rollout (tree: bases and branches).
        stats: ``anchors``, ``mean_anchor_size``, ``degeneration`` (:func:`anchor_stats`) and
            ``zero_variance_groups`` (share of the estimator's groups whose rewards are all equal).
    """

    steps: list[Step]
    advantages: list[float]
    n_episodes: int
    stats: dict[str, float]


def anchor_stats(steps: list[Step]) -> dict[str, float]:
    """Anchor buckets over ``steps`` keyed by history: count, mean size, and the fraction of size-1 buckets
    (degeneration); when every step has a state key, ``degeneration_state``: the same fraction keyed by state
    (:func:`anchor_keys`)."""
    def sizes(anchor_by: str) -> list[int]:
        return [len(v) for v in adv.bucket_by_anchor(anchor_keys(steps, anchor_by)).values()]

    by_history = sizes("history")
    if not by_history:
        return {"anchors": 0, "mean_anchor_size": 0.0, "degeneration": 0.0}
    stats = {
        "anchors": len(by_history),
        "mean_anchor_size": sum(by_history) / len(by_history),
        "degeneration": sum(1 for n in by_history if n == 1) / len(by_history),
    }
    if all(s.state_key for s in steps):
        by_state = sizes("state")
        stats["degeneration_state"] = sum(1 for n in by_state if n == 1) / len(by_state)
    return stats


def step_advantages(rollout: Rollout, cfg: Any) -> Assigned:
    """One advantage per step of ``rollout`` under the estimator ``cfg.estimator``, filtered.

    The estimator (:func:`get_estimator`) scores every step and names its filter groups; the filters
    ``cfg.drop_zero_variance`` and ``cfg.filter_top_p`` (:func:`trainer.advantages.keep_groups`) then
    drop whole groups. Steps of dropped groups and of episodes lost to infrastructure are left out;
    ``n_episodes`` counts the valid episodes (tree: bases and branches).

    Args:
        rollout: one iteration's rollout.
        cfg: a :class:`trainer.loop.LoopConfig` (``estimator``, ``std_floor``, ``omega``,
            ``tree_prefix``, ``drop_zero_variance``, ``filter_top_p``).

    Raises:
        ValueError: on an unknown estimator, a tree-only estimator on a group rollout, or an estimator
            that returns the wrong number of values.
    """
    est = get_estimator(cfg.estimator)
    if est.needs_tree and rollout.kind != "tree":
        raise ValueError(f"the {cfg.estimator} estimator needs a tree rollout")
    steps = rollout.steps
    valid = rollout.valid
    step_ep = rollout.step_episode
    stats = anchor_stats([s for e, ok in zip(rollout.episodes, valid, strict=True) if ok for s in e.steps])
    scores = est.fn(rollout, cfg)
    if len(scores.values) != len(steps) or len(scores.step_group) != len(steps):
        raise ValueError(f"estimator {cfg.estimator!r} gave {len(scores.values)} values and "
                         f"{len(scores.step_group)} groups for {len(steps)} steps")
    keep = adv.keep_groups(scores.groups, drop_zero_variance=cfg.drop_zero_variance, filter_top_p=cfg.filter_top_p)
    step_keep = [valid[i] and (g is None or keep[g]) for i, g in zip(step_ep, scores.step_group, strict=True)]
    groups = scores.groups
    zero_var = [len(g) < 2 or max(g) - min(g) <= adv.EQUAL_TOL for g in groups]
    stats["zero_variance_groups"] = sum(zero_var) / max(len(groups), 1)
    kept = [(s, a) for s, a, k in zip(steps, scores.values, step_keep, strict=True) if k]
    return Assigned([s for s, _ in kept], [a for _, a in kept], sum(valid), stats)
