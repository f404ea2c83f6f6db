"""The tabular policy's settings (:class:`TrainConfig`): ``forkyard train`` (``--policy tabular``, the default) is
generated from these fields (:mod:`trainer.config`). No torch import here, so building the command line stays
cheap; the policy is :class:`trainer.tabular.TabularPolicy`, its run set up by :func:`trainer.tabular.setup`.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import setting
from trainer.loop import LoopConfig

#: What a tabular policy's rows may be keyed by (:class:`trainer.tabular.TabularPolicy`'s ``key_by``).
POLICY_KEYS = ("history", "state")


@dataclass
class TrainConfig(LoopConfig):
    """Hyperparameters of a tabular run (defaults: the protocol of the reference granularity study,
    docs/results/granularity.md); the loop's settings, env and turn budget included, are those of
    :class:`trainer.loop.LoopConfig`."""

    lr: float = setting(0.1, group="loop", help="SGD step size on the logit table")
    eval_episodes: int = setting(64, group="loop",
                                 help="greedy evaluation episodes on held-out seeds (ClueProbe: every target instead)")
    policy_key: str = setting("history", choices=POLICY_KEYS, group="loop",
                              help="the table's rows keyed by the visible history (info's anchor_key) or by the "
                                   "current state alone (info's state_key: a Markov policy)")

    def validate(self) -> None:
        """:meth:`LoopConfig.validate`, ``lr > 0``, a known ``policy_key``, and ``max_staleness == 0`` (REINFORCE on
        the table has no off-policy correction). Raises ValueError."""
        super().validate()
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.policy_key not in POLICY_KEYS:
            raise ValueError(f"policy_key must be one of {POLICY_KEYS}, got {self.policy_key!r}")
        if self.max_staleness:
            raise ValueError("the tabular policy's REINFORCE update has no off-policy correction: "
                             "max_staleness must be 0 (the text policy's PPO takes stale rollouts)")
