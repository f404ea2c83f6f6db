"""``forkyard sft``, ``forkyard train-lm``, ``forkyard eval-lm`` and ``forkyard plot``: the text-policy subcommands.

:func:`register` adds them to the ``forkyard`` parser; each sets ``handler`` (called with the parsed
Namespace). ``forkyard train --policy lm`` (the main ``train`` subcommand) calls
:func:`trainer.text_train.train_lm_from_args` with the same Namespace fields as ``train-lm``.
"""

from __future__ import annotations

import argparse
import json

from trainer.advantages import TREE_PREFIXES
from trainer.train import ESTIMATORS, ROLLOUTS


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", default="ClueProbe-v0", help="env id (forkyard/ prefix optional)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--d-model", dest="d_model", type=int, default=96)
    p.add_argument("--n-layers", dest="n_layers", type=int, default=2)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--tokenizer", default="bpe", choices=["bpe", "byte"],
                   help="bpe: trained on the env's demo texts, digits kept single (default); byte: UTF-8 bytes")
    p.add_argument("--vocab", type=int, default=512, help="BPE vocabulary size (bytes + merges)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--run-dir", dest="run_dir", default=None)


def add_rl_args(p: argparse.ArgumentParser) -> None:
    """The RL options of ``train-lm`` (also usable by ``train --policy lm``)."""
    p.add_argument("--estimator", default="tree", choices=ESTIMATORS)
    p.add_argument("--rollout", default=None, choices=ROLLOUTS,
                   help="rollout shape (default: tree for the tree estimator, else group); any estimator "
                        "but tree also runs on a tree rollout")
    p.add_argument("--omega", type=float, default=None, help="anchor_fallback: weight of the anchor term (default 1)")
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--max-env-calls", dest="max_env_calls", type=int, default=None,
                   help="stop once this many env calls were spent (equal-budget comparisons)")
    p.add_argument("--checkpoint", default=None, help="SFT weights (RUN_DIR/sft.pt of `forkyard sft`)")
    p.add_argument("--n-base", dest="n_base", type=int, default=6)
    p.add_argument("--branches", type=int, default=4)
    p.add_argument("--group-size", dest="group_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--ppo-epochs", dest="ppo_epochs", type=int, default=None)
    p.add_argument("--entropy-coef", dest="entropy_coef", type=float, default=None)
    p.add_argument("--kl-coef", dest="kl_coef", type=float, default=None)
    p.add_argument("--reduction", default=None,
                   choices=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "group-mean"])
    p.add_argument("--filter-top-p", dest="filter_top_p", type=float, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", dest="top_p", type=float, default=None)
    p.add_argument("--eval-every", dest="eval_every", type=int, default=None)
    p.add_argument("--fork-selection", dest="fork_selection", default=None, choices=["uniform", "entropy"])
    p.add_argument("--fork-entropy", dest="fork_entropy", default=None, choices=["first", "greedy_max"],
                   help="entropy fork selection: first token of the action, or max along its greedy continuation")
    p.add_argument("--tree-prefix", dest="tree_prefix", default=None, choices=TREE_PREFIXES,
                   help="tree estimator: prefix turns valued by the base episode's return or its branches' mean")
    p.add_argument("--drop-zero-variance", dest="drop_zero_variance", action="store_true", default=None)
    p.add_argument("--invalid-penalty", dest="invalid_penalty", type=float, default=None,
                   help="shaping: subtract this from an episode's return per illegal action (default 0)")
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=None)
    p.add_argument("--eval-samples", dest="eval_samples", type=int, default=None)


def _sft(args) -> int:
    from trainer.text_eval import evaluate
    from trainer.text_train import config_from_args, sft

    cfg = config_from_args(args)
    model, metrics = sft(cfg, progress=True)
    ev = evaluate(model, cfg, samples=128)
    print(json.dumps({"final_loss": metrics[-1]["loss"], "wall_s": round(metrics[-1]["wall_s"], 1), "evaluation": ev}, indent=2))
    if cfg.run_dir:
        from pathlib import Path

        (Path(cfg.run_dir) / "sft_summary.json").write_text(json.dumps({"evaluation": ev, "wall_s": metrics[-1]["wall_s"]}, indent=2))
    return 0


def _train_lm(args) -> int:
    from trainer.text_train import train_lm_from_args

    train_lm_from_args(args)
    return 0


def _eval_lm(args) -> int:
    import torch

    from trainer.lm import load_checkpoint
    from trainer.text_eval import evaluate, exact_success
    from trainer.text_train import config_from_args

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = config_from_args(args)  # env, turns, max_new_tokens, temperature
    for path in args.checkpoints:
        model = load_checkpoint(path, device=args.device)
        row = {"checkpoint": path}
        if args.samples:
            row.update(evaluate(model, cfg, samples=args.samples))
        if args.exact:
            row.update({f"exact_{k}": v for k, v in exact_success(model, cfg).items()})
        print(json.dumps(row), flush=True)
    return 0


def _plot(args) -> int:
    from trainer.plot import plot_run

    print(plot_run(args.run_dir, args.out, compare=args.compare))
    return 0


def register(subparsers) -> None:
    """Add ``sft``, ``train-lm``, ``eval-lm`` and ``plot`` to the ``forkyard`` subparsers."""
    p = subparsers.add_parser("sft", help="text policy: supervised warm start on format-only demonstrations")
    _model_args(p)
    p.add_argument("--sft-steps", dest="sft_steps", type=int, default=None)
    p.add_argument("--sft-batch", dest="sft_batch", type=int, default=None)
    p.add_argument("--sft-lr", dest="sft_lr", type=float, default=None)
    p.add_argument("--demo-skill", dest="demo_skill", type=float, default=None,
                   help="ClueProbe demonstrations: chance the demo answers from the probed bits (default 0: random)")
    p.set_defaults(handler=_sft)

    p = subparsers.add_parser("train-lm", help="text policy: PPO-style RL with tree forks (same as train --policy lm)")
    _model_args(p)
    add_rl_args(p)
    p.set_defaults(handler=_train_lm)

    p = subparsers.add_parser("eval-lm", help="text policy: evaluate checkpoints (sampled, greedy, exact)")
    p.add_argument("checkpoints", nargs="+", help="model.pt / sft.pt files")
    p.add_argument("--env", default="ClueProbe-v0", help="env id (forkyard/ prefix optional)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--samples", type=int, default=1000,
                   help="held-out seeds (10**9 + i) for sampled accuracy; 0 skips sampling")
    p.add_argument("--exact", action="store_true",
                   help="also the exact expected success over every accepted action path (trainer/text_eval.py)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.set_defaults(handler=_eval_lm)

    p = subparsers.add_parser("plot", help="draw a run's stability curves (metrics.jsonl) to a PNG")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="PNG path (default RUN_DIR/curves.png)")
    p.add_argument("--compare", nargs="*", default=(), help="more run dirs drawn on the same axes")
    p.set_defaults(handler=_plot)
