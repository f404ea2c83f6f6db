"""Advantage estimators for multi-turn agent RL: pure functions over plain lists of floats.

Every estimator returns plain Python floats, never NaN or inf, whatever the rewards: an empty group
gives ``[]``, a group of one gives ``[0.0]``, a group whose rewards are all equal gives exact zeros.
The rollout code builds the groups; these functions only do arithmetic. :mod:`trainer.estimators`
registers them by name (``grpo``, ``rloo``, ``anchor``, ``gigpo``, ``tree``) for the training loop.

Normalisation (shared by ``traj``, ``anchor`` and ``tree``)::

    A_i = (R_i - mean(R)) / max(std(R), std_floor)        if the group has >= 2 valid members
                                                           and max(R) - min(R) > equal_tol
    A_i = 0                                                otherwise

``std`` is the population standard deviation (ddof=0, as the reference study's anchor code
(docs/results/granularity.md) and RAGEN use; pass ``ddof=1`` for the unbiased std of verl's GRPO). Rewards are
summed in float64, so float32 inputs
that are equal up to rounding (``[0.35] * 8`` as float32) count as equal; ``std_floor`` (default 1e-3,
as one public project floors it) bounds the advantage of near-equal rewards. With the population std a
two-member group ``[a, b]`` (a != b) always normalises to ``[-1, +1]`` (ordered as the rewards);
with ddof=1 to ``[-1/sqrt(2), +1/sqrt(2)]``.

Members marked invalid (``valid[i] is False``: episodes lost to an infrastructure failure) are left out
of the statistics and get advantage 0.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

#: Rewards whose spread (max - min) is at most this are treated as equal (advantage exactly 0).
EQUAL_TOL = 1e-6
#: Default floor on the group standard deviation.
STD_FLOOR = 1e-3
#: how :func:`tree_advantages` values a base's prefix: its own return, or the mean of its branches
TREE_PREFIXES = ("base", "branch_mean")


def _check_valid(n: int, valid: Sequence[bool] | None) -> Sequence[bool]:
    if valid is None:
        return [True] * n
    if len(valid) != n:
        raise ValueError(f"valid has {len(valid)} entries for {n} rewards")
    return valid


def group_std(rewards: Sequence[float], *, ddof: int = 0) -> float:
    """Standard deviation of ``rewards`` in float64 (0.0 for fewer than ``ddof + 1`` values)."""
    n = len(rewards)
    if n <= ddof:
        return 0.0
    mean = math.fsum(rewards) / n
    return math.sqrt(math.fsum((float(r) - mean) ** 2 for r in rewards) / (n - ddof))


def normalize(
    rewards: Sequence[float],
    *,
    valid: Sequence[bool] | None = None,
    std_floor: float = STD_FLOOR,
    ddof: int = 0,
    equal_tol: float = EQUAL_TOL,
) -> list[float]:
    """Group-normalised advantages (see the module docstring for the exact rule).

    Args:
        rewards: the group's returns, shape [K], any real numbers (floats or float32 values).
        valid: optional [K] mask; invalid members are excluded from mean/std and get 0.
        std_floor: lower bound on the std in the denominator, > 0.
        ddof: 0 for the population std, 1 for the sample std.
        equal_tol: spread at or below which the group counts as having zero variance.

    Returns:
        [K] list of floats.

    Raises:
        ValueError: if ``valid`` has the wrong length, ``std_floor <= 0``, or a reward is NaN or inf.
    """
    if std_floor <= 0:
        raise ValueError(f"std_floor must be > 0, got {std_floor}")
    valid = _check_valid(len(rewards), valid)
    vals = [float(r) for r, ok in zip(rewards, valid, strict=True) if ok]
    if any(not math.isfinite(v) for v in vals):
        raise ValueError(f"rewards must be finite, got {vals}")
    if len(vals) < 2 or max(vals) - min(vals) <= equal_tol:
        return [0.0] * len(rewards)
    mean = math.fsum(vals) / len(vals)
    denom = max(group_std(vals, ddof=ddof), std_floor)
    return [(float(r) - mean) / denom if ok else 0.0 for r, ok in zip(rewards, valid, strict=True)]


def traj_advantages(rewards: Sequence[float], **kwargs) -> list[float]:
    """GRPO trajectory-level advantage: one value per episode, broadcast by the caller to all its actions.

    ``A_i = (R_i - mean R) / max(std R, std_floor)`` over the group (Shao et al. 2024, DeepSeekMath,
    arXiv:2402.03300, section 4.1.2 outcome supervision). Keyword arguments as :func:`normalize`.
    Returns a [K] list.
    """
    return normalize(rewards, **kwargs)


def rloo_advantages(rewards: Sequence[float], *, valid: Sequence[bool] | None = None) -> list[float]:
    """REINFORCE leave-one-out: ``A_i = R_i - mean_{j != i} R_j`` over the valid members
    (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740, eq. 5). A group with fewer than two
    valid members gives zeros. Returns a [K] list.
    """
    valid = _check_valid(len(rewards), valid)
    vals = [float(r) for r, ok in zip(rewards, valid, strict=True) if ok]
    k = len(vals)
    if k < 2:
        return [0.0] * len(rewards)
    total = math.fsum(vals)
    out = []
    for r, ok in zip(rewards, valid, strict=True):
        out.append(float(r) - (total - float(r)) / (k - 1) if ok else 0.0)
    return out


def bucket_by_anchor(anchor_keys: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    """Indices of the steps that share each anchor key: ``{key: [step indices]}`` in first-seen order."""
    buckets: dict[Hashable, list[int]] = {}
    for i, key in enumerate(anchor_keys):
        buckets.setdefault(key, []).append(i)
    return buckets


def anchor_advantages(
    anchor_keys: Sequence[Hashable],
    step_returns: Sequence[float],
    *,
    valid: Sequence[bool] | None = None,
    **kwargs,
) -> list[float]:
    """GiGPO-style step-level advantage (Feng et al. 2025, arXiv:2505.10978, anchor state grouping).

    Steps are bucketed by their anchor key (the visible history before the action); within a bucket
    the steps' returns are normalised with :func:`normalize`. A bucket of size 1, or whose returns are
    all equal, gives 0: exactly the first version in the reference granularity study
    (docs/results/granularity.md), whose late-turn buckets mostly hold one sample. ``step_returns[j]`` is the
    return from step j on (the episode's reward here, as
    rewards come only at the end; GiGPO uses the discounted return-to-go).

    Args:
        anchor_keys: [S] anchor key of every step.
        step_returns: [S] return of every step.
        valid: optional [S] mask; steps of episodes lost to infrastructure are excluded and get 0.

    Returns:
        [S] list of floats.
    """
    if len(anchor_keys) != len(step_returns):
        raise ValueError(f"{len(anchor_keys)} anchor keys for {len(step_returns)} returns")
    valid = _check_valid(len(step_returns), valid)
    out = [0.0] * len(step_returns)
    for idxs in bucket_by_anchor(anchor_keys).values():
        adv = normalize([step_returns[i] for i in idxs], valid=[valid[i] for i in idxs], **kwargs)
        for i, a in zip(idxs, adv, strict=True):
            out[i] = a
    return out


def anchor_fallback_advantages(
    anchor_keys: Sequence[Hashable],
    step_returns: Sequence[float],
    step_episode: Sequence[int],
    episode_rewards: Sequence[float],
    *,
    omega: float = 1.0,
    valid_episodes: Sequence[bool] | None = None,
    **kwargs,
) -> list[float]:
    """GiGPO's combined advantage: ``A_{i,t} = A^E_i + omega * A^S_{i,t}`` (Feng et al. 2025, arXiv:2505.10978,
    combined advantage).

    ``A^E`` is :func:`traj_advantages` over the episodes, ``A^S`` is :func:`anchor_advantages` over the
    steps. A degenerate bucket (size 1 or equal returns) has ``A^S = 0``, so its steps fall back to
    the trajectory-level advantage instead of losing their gradient.

    Args:
        anchor_keys, step_returns: [S] as in :func:`anchor_advantages`.
        step_episode: [S] index of the episode each step belongs to (into ``episode_rewards``).
        episode_rewards: [K] episode returns.
        omega: weight of the step-level term, >= 0 (GiGPO uses 1).
        valid_episodes: optional [K] mask of episodes to keep in the statistics.

    Returns:
        [S] list of floats.
    """
    if omega < 0:
        raise ValueError(f"omega must be >= 0, got {omega}")
    valid_episodes = _check_valid(len(episode_rewards), valid_episodes)
    ep_adv = normalize(episode_rewards, valid=valid_episodes, **kwargs)
    step_valid = [valid_episodes[e] for e in step_episode]
    step_adv = anchor_advantages(anchor_keys, step_returns, valid=step_valid, **kwargs)
    return [ep_adv[e] + omega * a if ok else 0.0 for e, a, ok in zip(step_episode, step_adv, step_valid, strict=True)]


def tree_advantages(
    base_rewards: Sequence[float],
    branch_rewards: Sequence[Sequence[float]],
    *,
    base_valid: Sequence[bool] | None = None,
    branch_valid: Sequence[Sequence[bool]] | None = None,
    prefix_value: str = "base",
    **kwargs,
) -> tuple[list[float], list[list[float]]]:
    """Tree-fork advantages (the "prefix fork" of the reference granularity study, docs/results/granularity.md;
    Tree-GRPO, arXiv:2509.21240, and ARPO, arXiv:2507.19849, share the idea).

    A tree rollout has ``n_base`` base episodes; base b is forked at turn ``t_b`` into ``m`` branches
    (branch 0 is the base's own continuation, branches 1..m-1 are new). The exact rule:

    * actions at turns ``>= t_b`` of branch j of base b get
      ``normalize(branch_rewards[b])[j]``: the m branches share one anchor (the fork state), so this
      is the step-level advantage with m siblings made on purpose;
    * actions at turns ``< t_b`` of base b (the prefix, taken once, shared by its branches) get the
      trajectory-level advantage over the bases, ``normalize(v)[b]``. With ``prefix_value="base"``
      (default, the reference study's rule) ``v[b] = base_rewards[b]``, the return of the base's own
      episode (branch 0). With ``prefix_value="branch_mean"``, ``v[b]`` is the mean return of base b's
      valid branches: m samples of the same prefix's value instead of one (the node value of
      tree-search RL, e.g. TreeRL, Hou et al. 2025: a node is worth the mean reward of the leaves under
      it). A base with no valid branch keeps ``base_rewards[b]``.

    Args:
        base_rewards: [n_base] return of each base episode.
        branch_rewards: [n_base][m] returns of the branches of each base (m may differ per base).
        base_valid, branch_valid: optional masks of the same shapes (False: lost to infrastructure).
        prefix_value: ``"base"`` or ``"branch_mean"`` (above).

    Returns:
        ``(prefix_adv [n_base], branch_adv [n_base][m])``.
    """
    if len(branch_rewards) != len(base_rewards):
        raise ValueError(f"{len(branch_rewards)} branch groups for {len(base_rewards)} bases")
    if prefix_value not in TREE_PREFIXES:
        raise ValueError(f"prefix_value must be one of {TREE_PREFIXES}, got {prefix_value!r}")
    values = list(base_rewards)
    if prefix_value == "branch_mean":
        for b, rewards in enumerate(branch_rewards):
            ok = [r for k, r in enumerate(rewards) if branch_valid is None or branch_valid[b][k]]
            if ok:
                values[b] = math.fsum(ok) / len(ok)
    prefix = normalize(values, valid=base_valid, **kwargs)
    branches = []
    for b, rewards in enumerate(branch_rewards):
        valid = None if branch_valid is None else branch_valid[b]
        branches.append(normalize(rewards, valid=valid, **kwargs))
    return prefix, branches


def keep_groups(
    group_rewards: Sequence[Sequence[float]],
    *,
    drop_zero_variance: bool = False,
    filter_top_p: float | None = None,
    equal_tol: float = EQUAL_TOL,
) -> list[bool]:
    """Which groups to train on: DAPO dynamic sampling and StarPO-S uncertainty filtering.

    * ``drop_zero_variance``: drop groups whose rewards are all equal (DAPO, Yu et al. 2025,
      arXiv:2503.14476, section 3.2); their advantages are 0 anyway but they dilute the loss mean.
    * ``filter_top_p`` in (0, 1]: keep the ``ceil(filter_top_p * G)`` groups with the highest reward std
      (StarPO-S, Wang et al. 2025, arXiv:2504.20073, section 4; they use p = 0.25..0.5). Ties keep the
      earlier group. (Named ``filter_`` so that ``top_p`` keeps one meaning in forkyard: nucleus
      sampling of the text policy.)

    Args:
        group_rewards: [G][K_g] rewards of each group.

    Returns:
        [G] list of bools (True: keep).

    Raises:
        ValueError: if ``filter_top_p`` is outside (0, 1].
    """
    n = len(group_rewards)
    keep = [True] * n
    spreads = [(max(g) - min(g)) if len(g) else 0.0 for g in group_rewards]
    if drop_zero_variance:
        keep = [k and s > equal_tol for k, s in zip(keep, spreads, strict=True)]
    if filter_top_p is not None:
        if not 0 < filter_top_p <= 1:
            raise ValueError(f"filter_top_p must be in (0, 1], got {filter_top_p}")
        stds = [group_std(g) for g in group_rewards]
        order = sorted(range(n), key=lambda i: (-stds[i], i))
        chosen = set(order[: math.ceil(filter_top_p * n)])
        keep = [k and i in chosen for i, k in enumerate(keep)]
    return keep
