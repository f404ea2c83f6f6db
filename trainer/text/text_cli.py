"""``forkyard sft``, ``forkyard train-lm``, ``forkyard eval-lm`` and ``forkyard plot``: the text-policy subcommands.

:func:`register` adds them to the ``forkyard`` parser; each sets ``handler`` (called with the parsed
Namespace). Their options are generated from :class:`trainer.text.text_config.TextTrainConfig` /
:class:`trainer.text.text_config.EvalConfig` (:mod:`trainer.config`): ``sft`` takes the ``common`` and
``sft`` fields, ``train-lm`` (and ``forkyard train --policy lm``) the ``common`` and ``loop`` fields.
"""

from __future__ import annotations

import argparse
import json

#: The TextTrainConfig field groups of ``train-lm`` / ``train --policy lm`` and of ``sft``.
RL_GROUPS = ("common", "loop")
SFT_GROUPS = ("common", "sft")


def _config(cls, args, command: str, **overrides):
    """The validated config of ``command``; an invalid one exits with a line on stderr and status 2 (a usage
    error, not a traceback)."""
    import sys

    from envs.core import EnvInfraError
    from trainer.config import from_args

    try:
        return from_args(cls, args, **overrides)  # validated as it is made (LoopConfig.__post_init__)
    except (ValueError, EnvInfraError) as exc:  # EnvInfraError: the env (its tools) could not be built
        print(f"forkyard {command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def guarded(command: str, run, *args, **kwargs):
    """``run(*args, **kwargs)`` for ``forkyard command``: a :class:`trainer.loop.RunDirError` (a folder holding
    another run's records, no run to resume) is a usage error, a line on stderr and status 2; a
    :class:`trainer.loop.TrainingInterrupted` (SIGTERM / SIGINT, state saved) a line naming ``--resume`` and
    status 128 + the signal number (143 for SIGTERM), as a process ended by it. Raises SystemExit for both."""
    import sys

    from trainer.loop import RunDirError, TrainingInterrupted

    try:
        return run(*args, **kwargs)
    except RunDirError as exc:
        print(f"forkyard {command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except TrainingInterrupted as exc:
        print(f"forkyard {command}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(128 + exc.signal) from None


def _sft(args) -> int:
    from trainer.text.text_config import TextTrainConfig
    from trainer.text.text_eval import evaluate
    from trainer.text.text_sft import sft

    cfg = _config(TextTrainConfig, args, "sft", progress=True)
    if cfg.resume:
        from trainer.loop import resume_config

        cfg = guarded("sft", resume_config, cfg, "sft_config.json")
    model, metrics = guarded("sft", sft, cfg)
    ev = evaluate(model, cfg, samples=128)
    summary = {"final_loss": metrics[-1]["loss"], "wall_s": round(metrics[-1]["wall_s"], 1), "evaluation": ev}
    print(json.dumps(summary, indent=2))
    run_dir = cfg.resume or cfg.run_dir
    if run_dir:
        from pathlib import Path

        (Path(run_dir) / "sft_summary.json").write_text(
            json.dumps({"evaluation": ev, "wall_s": metrics[-1]["wall_s"]}, indent=2))
    return 0


def _eval_lm(args) -> int:
    import torch

    from trainer.text.checkpoints import load_checkpoint
    from trainer.text.text_config import EvalConfig
    from trainer.text.text_eval import evaluate, exact_success

    cfg = _config(EvalConfig, args, "eval-lm")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    for path in cfg.checkpoints:
        model = load_checkpoint(path, device=cfg.device)
        row = {"checkpoint": path}
        if cfg.samples:
            row.update(evaluate(model, cfg, samples=cfg.samples))
        if cfg.exact:
            row.update({f"exact_{k}": v for k, v in exact_success(model, cfg).items()})
        print(json.dumps(row), flush=True)
    return 0


def _plot(args) -> int:
    from trainer.plot import plot_run

    print(plot_run(args.run_dir, args.out, compare=args.compare))
    return 0


def register(subparsers, command: str | None = None) -> None:
    """Add ``sft``, ``train-lm``, ``eval-lm`` and ``plot`` to the ``forkyard`` subparsers; their options
    only when ``command`` is theirs (None: all)."""

    def add(name: str, **kw) -> tuple[argparse.ArgumentParser, bool]:
        return subparsers.add_parser(name, **kw), command is None or command == name

    p, build = add("sft", help="text policy: supervised warm start on format-only demonstrations")
    if build:
        from trainer.config import add_arguments
        from trainer.text.text_config import TextTrainConfig

        add_arguments(p, TextTrainConfig, groups=SFT_GROUPS)
    p.set_defaults(handler=_sft)

    p, build = add("eval-lm", help="text policy: evaluate checkpoints (sampled, greedy, exact)")
    if build:
        from trainer.config import add_arguments
        from trainer.text.text_config import EVAL_FIELDS, EvalConfig

        add_arguments(p, EvalConfig, names=EVAL_FIELDS)
    p.set_defaults(handler=_eval_lm)

    p, _ = add("plot", help="draw a run's stability curves (metrics.jsonl) to a PNG")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/curves.png)")
    p.add_argument("--compare", nargs="*", default=(), help="more run dirs drawn on the same axes")
    p.set_defaults(handler=_plot)
