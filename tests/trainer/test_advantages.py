"""Advantage estimators on hand-computed cases, and field case S6 (degenerate groups)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer import advantages as adv

SQ7 = math.sqrt(7)


def approx(values, expected, tol=1e-9):
    assert len(values) == len(expected)
    for v, e in zip(values, expected, strict=True):
        assert v == pytest.approx(e, abs=tol)


# ---------------------------------------------------------------- S6
def test_s6_all_equal_rewards_give_exact_zeros():
    assert adv.traj_advantages([1, 1, 1, 1]) == [0.0, 0.0, 0.0, 0.0]
    f32 = [float(x) for x in np.full(8, 0.35, dtype=np.float32)]
    assert adv.traj_advantages(f32) == [0.0] * 8
    assert adv.rloo_advantages([1, 1, 1]) == [0.0, 0.0, 0.0]


def test_s6_odd_one_out_is_order_one_not_thousands():
    rewards = [float(x) for x in np.array([0.35] * 7 + [0.95], dtype=np.float32)]
    out = adv.traj_advantages(rewards)
    # population std: mean 0.425, std sqrt(0.039375); odd one = sqrt(7), others = -1/sqrt(7)
    approx(out, [-1 / SQ7] * 7 + [SQ7], tol=1e-6)


def test_s6_near_equal_float32_rewards_are_bounded_by_the_std_floor():
    rewards = [0.35, 0.35, 0.35, 0.35 + 1e-5]  # spread above the equality tolerance, std ~ 4e-6
    out = adv.traj_advantages(rewards)
    assert max(abs(a) for a in out) < 0.01  # (1e-5 * 0.75) / 1e-3, not ~1.7 and never thousands
    assert out[-1] == pytest.approx(0.75e-5 / 1e-3, rel=1e-3)


def test_s6_group_of_one_and_empty_group():
    assert adv.traj_advantages([0.7]) == [0.0]
    assert adv.rloo_advantages([0.7]) == [0.0]
    assert adv.traj_advantages([]) == []
    assert adv.anchor_advantages([], []) == []
    assert adv.tree_advantages([], []) == ([], [])


def test_s6_anchor_buckets():
    keys = ["h1", "h1", "h2"]
    out = adv.anchor_advantages(keys, [0.2, 0.8, 0.5])
    assert out[2] == 0.0  # bucket of one: no sibling, no signal
    approx(out[:2], [-1.0, 1.0])  # population std (0.3): a two-sample bucket is always +-1
    out = adv.anchor_advantages(keys, [0.2, 0.8, 0.5], ddof=1)
    approx(out[:2], [-1 / math.sqrt(2), 1 / math.sqrt(2)])  # sample std (0.4243)


# ---------------------------------------------------------------- hand-computed cases
def test_traj_and_rloo_by_hand():
    approx(adv.traj_advantages([1, 0, 0, 1]), [1, -1, -1, 1])
    approx(adv.traj_advantages([1, 0, 0, 0]),
           [3 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])
    approx(adv.rloo_advantages([1, 0, 0, 1]), [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    approx(adv.rloo_advantages([3, 1]), [2, -2])


def test_invalid_members_are_left_out_not_scored_zero():
    approx(adv.traj_advantages([1, 0, 0], valid=[True, True, False]), [1, -1, 0])
    approx(adv.rloo_advantages([1, 0, 0], valid=[True, True, False]), [1, -1, 0])
    # Scoring the lost episode 0 instead would have changed the others' advantages:
    assert adv.traj_advantages([1, 0, 0])[0] != pytest.approx(1.0)


def test_anchor_fallback_by_hand():
    # episode 0 (reward 1) visits k0, k1; episode 1 (reward 0) visits k0, k2
    keys, step_ep = ["k0", "k1", "k0", "k2"], [0, 0, 1, 1]
    rewards = [1.0, 0.0]
    step_ret = [rewards[e] for e in step_ep]
    approx(adv.anchor_advantages(keys, step_ret), [1, 0, -1, 0])
    approx(adv.anchor_fallback_advantages(keys, step_ret, step_ep, rewards), [2, 1, -2, -1])
    approx(adv.anchor_fallback_advantages(keys, step_ret, step_ep, rewards, omega=0.5), [1.5, 1, -1.5, -1])
    approx(adv.anchor_fallback_advantages(keys, step_ret, step_ep, rewards, valid_episodes=[True, False]), [0, 0, 0, 0])


def test_tree_by_hand():
    prefix, branches = adv.tree_advantages([1, 0], [[1, 0, 0, 0], [0, 0]])
    approx(prefix, [1, -1])
    approx(branches[0], [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])
    assert branches[1] == [0.0, 0.0]
    _, branches = adv.tree_advantages([1, 0], [[1, 0, 1], [0, 1]], branch_valid=[[True, True, False], [True, True]])
    approx(branches[0], [1, -1, 0])


def test_tree_prefix_from_branch_means_by_hand():
    # base 0 won its own episode but 1 of its 4 branches; base 1 lost its own but won 1 of 2
    prefix, branches = adv.tree_advantages([1, 0], [[1, 0, 0, 0], [0, 1]], prefix_value="branch_mean")
    approx(prefix, [-1, 1])  # values 0.25 and 0.5: the opposite order to the single base returns
    base_prefix, base_branches = adv.tree_advantages([1, 0], [[1, 0, 0, 0], [0, 1]])
    approx(base_prefix, [1, -1])
    assert branches == base_branches  # fork-turn credit is unchanged
    # invalid branches leave the mean; a base with no valid branch keeps its own return
    prefix, _ = adv.tree_advantages([1, 0], [[1, 0, 0, 0], [0, 1]], prefix_value="branch_mean",
                                    branch_valid=[[False] * 4, [True, True]])
    approx(prefix, [1, -1])  # values 1 (own return) and 0.5
    with pytest.raises(ValueError, match="prefix_value"):
        adv.tree_advantages([1, 0], [[1], [0]], prefix_value="mean")
    from trainer.tabular_config import TrainConfig

    with pytest.raises(ValueError, match="tree_prefix"):
        TrainConfig(estimator="tree", tree_prefix="mean").validate()


def test_keep_groups():
    groups = [[1, 1, 1], [0, 1, 0, 1], [0, 0, 1, 0], [0.5]]
    assert adv.keep_groups(groups) == [True] * 4
    assert adv.keep_groups(groups, drop_zero_variance=True) == [False, True, True, False]
    assert adv.keep_groups(groups, filter_top_p=0.25) == [False, True, False, False]
    assert adv.keep_groups(groups, filter_top_p=0.5) == [False, True, True, False]
    with pytest.raises(ValueError):
        adv.keep_groups(groups, filter_top_p=0)


def test_bad_input_is_rejected_clearly():
    with pytest.raises(ValueError, match="finite"):
        adv.traj_advantages([1.0, float("nan")])
    with pytest.raises(ValueError, match="valid"):
        adv.traj_advantages([1.0, 0.0], valid=[True])
    with pytest.raises(ValueError, match="std_floor"):
        adv.traj_advantages([1.0, 0.0], std_floor=0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32), max_size=40))
def test_never_nan_or_inf_and_centered(rewards):
    for out in (adv.traj_advantages(rewards), adv.rloo_advantages(rewards)):
        assert len(out) == len(rewards)
        assert all(math.isfinite(a) for a in out)
    out = adv.traj_advantages(rewards)
    assert abs(math.fsum(out)) < 1e-6 * max(1, len(out))
    keys = [int(abs(r)) % 3 for r in rewards]
    assert all(math.isfinite(a) for a in adv.anchor_advantages(keys, rewards))
