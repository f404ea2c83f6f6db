"""The policy ``example-tabular``: forkyard's tabular policy with a config of its own (another step size, and
an option ``--note`` the report prints back) and a report of its own."""

from __future__ import annotations

import json
from dataclasses import dataclass

from trainer.config import setting
from trainer.policies import Policy
from trainer.tabular_config import TrainConfig


@dataclass
class ExampleConfig(TrainConfig):
    """:class:`trainer.tabular_config.TrainConfig` with a larger step size and a note."""

    lr: float = setting(0.5, group="loop", help="SGD step size on the logit table")
    note: str = setting("", group="common", help="a note the report prints back")


def report(result) -> None:
    """One JSON line: the policy, the note, the iterations and the evaluation."""
    print(json.dumps({"policy": "example-tabular", "note": result.config.note, "lr": result.config.lr,
                      "iterations": len(result.metrics), "evaluation": result.evaluation}))


POLICY = Policy(config=ExampleConfig, setup="trainer.tabular:setup", report=report,
                help="the tabular policy with a step size of 0.5 (an example plugin)")
