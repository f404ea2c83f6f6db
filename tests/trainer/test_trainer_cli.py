"""The training commands are generated from their config dataclasses (trainer/config.py): every option a
command accepts reaches the config of the run it starts (``forkyard train --policy lm`` included, whose
``--lr`` was once ignored), and the old spellings keep working."""

import argparse
import dataclasses

import pytest

from trainer import cli
from trainer.compare import SweepConfig
from trainer.config import from_args
from trainer.text.text_config import EvalConfig, TextTrainConfig
from trainer.tabular_config import TrainConfig


def _subparser(command: str, policy: str = "tabular") -> argparse.ArgumentParser:
    parser = cli.build_parser(command, policy)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _non_default_argv(parser: argparse.ArgumentParser, cls) -> tuple[list[str], dict]:
    """An argv giving every option of ``parser`` a value other than its field's default, and the field
    values the config must then hold."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    argv, expected = [], {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest == "policy":
            continue
        f = fields[action.dest]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        flag = action.option_strings[0] if action.option_strings else None
        if isinstance(action, argparse.BooleanOptionalAction):
            value = not default
            argv.append(flag if value else "--no-" + flag[2:])
        elif action.choices is not None:
            choices = list(action.choices)
            pick = [c for c in choices if c != default and not (isinstance(default, tuple) and c in default)]
            if action.nargs == "+":
                value = tuple(pick[:1])
                argv += [flag, *value]
            else:
                value = pick[0]
                argv += [flag, value]
        elif action.dest == "env_kwargs":
            argv += [flag, "bits=2", flag, 'name="x"']
            value = {"bits": 2, "name": "x"}
        elif action.nargs == "+":
            value = (7, 9) if action.type is int else ("a.pt", "b.pt")
            argv += ([flag] if flag else []) + [str(v) for v in value]
            if f.type in ("list[str]",) or isinstance(default, list):
                value = list(value)
        elif action.type is int:
            value = (default or 0) + 3
            argv += [flag, str(value)]
        elif action.type is float:
            value = 0.375 if default != 0.375 else 0.5
            argv += [flag, str(value)]
        else:  # text (the env id parser keeps a namespaced id as is)
            value = f"ns/{action.dest}"
            argv += [flag, value]
        expected[action.dest] = value
    return argv, expected


@pytest.mark.parametrize("policy", ["tabular", "lm"])
def test_every_train_option_reaches_the_run_config(policy, monkeypatch):
    cls = TextTrainConfig if policy == "lm" else TrainConfig
    argv, expected = _non_default_argv(_subparser("train", policy), cls)
    from trainer.config import cli_fields
    from trainer.text.text_cli import RL_GROUPS

    # nothing left out: every loop, env and policy field (the text policy's SFT fields belong to `sft`)
    assert set(expected) == {f.name for f in cli_fields(cls, RL_GROUPS if policy == "lm" else None)}
    assert {f.name for f in dataclasses.fields(cls)} - set(expected) == (
        {"progress", "sft_steps", "sft_batch", "sft_lr", "demo_skill"} if policy == "lm" else {"progress"})
    seen = []

    class Stop(Exception):
        pass

    def capture(cfg, *a, **k):
        seen.append(cfg)
        raise Stop

    import trainer.train

    monkeypatch.setattr(trainer.train, "train", capture)  # the one driver, for every policy
    # Every option at a non-default value at once is not a valid run (--ray with --server, say): this test
    # is about each flag reaching the config; validation has its own tests (test_ray, test_trainer_loop).
    monkeypatch.setattr(cls, "validate", lambda self: None)
    with pytest.raises(Stop):
        cli.main(["train", "--policy", policy, *argv])
    (cfg,) = seen
    assert type(cfg) is cls and cfg.progress
    for name, value in expected.items():
        assert getattr(cfg, name) == value, name


@pytest.mark.parametrize("command, cls, groups", [
    ("train-lm", TextTrainConfig, ("common", "loop")),
    ("sft", TextTrainConfig, ("common", "sft")),
    ("eval-lm", EvalConfig, None),
    ("compare", SweepConfig, None),
])
def test_every_option_of_the_other_commands_reaches_their_config(command, cls, groups, monkeypatch):
    monkeypatch.setattr(cls, "validate", lambda self: None, raising=False)  # all at once: no valid run
    parser = _subparser(command)
    argv, expected = _non_default_argv(parser, cls)
    cfg = from_args(cls, parser.parse_args(argv))
    for name, value in expected.items():
        assert getattr(cfg, name) == value, name
    if groups:  # the command shows exactly its groups' fields
        from trainer.config import cli_fields

        assert set(expected) == {f.name for f in cli_fields(cls, groups)}


def test_train_lm_and_train_policy_lm_take_the_same_options():
    def options(p):
        return sorted(s for a in p._actions for s in a.option_strings if s not in ("-h", "--help", "--policy"))

    assert options(_subparser("train-lm")) == options(_subparser("train", "lm"))


def test_old_spellings_and_defaults():
    args = cli.build_parser("train").parse_args(
        ["train", "--env", "ClueProbe-v0", "--server", "http://127.0.0.1:9", "--turns", "3",
         "--env-kwarg", "bits=2",
         "--env-kwarg", "max_turns=7", "--drop-zero-variance", "--estimator", "traj"])
    cfg = from_args(TrainConfig, args)
    assert cfg.env_id == "forkyard/ClueProbe-v0" and cfg.server_url == "http://127.0.0.1:9"
    assert cfg.env_options() == {"bits": 2, "max_turns": 3}  # --turns (old --max-turns) wins over --env-kwarg
    assert cfg.drop_zero_variance and cfg.estimator == "traj"
    # nothing given: the dataclass defaults, and only them
    assert from_args(TrainConfig, cli.build_parser("train").parse_args(["train"])) == TrainConfig()
    lm = cli.build_parser("train", "lm").parse_args(["train", "--policy", "lm"])
    assert from_args(TextTrainConfig, lm) == TextTrainConfig()
    ev = from_args(EvalConfig, _subparser("eval-lm").parse_args(["m.pt", "--exact"]))
    assert ev.checkpoints == ["m.pt"] and ev.exact and ev.device == "cpu" and ev.max_new_tokens == 8
    with pytest.raises(SystemExit):
        cli.build_parser("train").parse_args(["train", "--env-kwarg", "novalue"])
    with pytest.raises(SystemExit):  # a text-policy option is not a tabular one
        cli.build_parser("train").parse_args(["train", "--checkpoint", "x.pt"])


def test_forkyard_envs_prints_the_catalog(capsys):
    """``forkyard envs``: every registered id as a table (tools built from the defaults), ``--json`` the cards,
    ids (``forkyard/`` optional) add their settings' descriptions, an unknown id is a usage error."""
    import json

    import envs

    assert cli.main(["envs", "--json", "--no-tools"]) == 0
    cards = json.loads(capsys.readouterr().out)
    assert [c["env_id"] for c in cards] == list(envs.forkyard_specs())
    assert all(c["tools"] is None for c in cards)  # --no-tools: no env built
    assert cli.main(["envs", "ClueProbe-v0"]) == 0
    out = capsys.readouterr().out
    row = "| forkyard/ClueProbe-v0 | probe, answer | bits=3, turns=null | 5 | state_codec | no | yes | yes | yes |"
    assert row in out
    assert "  bits (default 3): number of target bits, 1..16" in out and "forkyard/FileQA-v0" not in out
    assert cli.main(["envs", "Nope-v0"]) == 2
    assert "unknown env id 'Nope-v0'" in capsys.readouterr().err
