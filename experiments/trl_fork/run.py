"""Does the fork pay inside TRL? The runs of the pre-registered comparison in ``experiments/trl_fork/plan.md``.

Subcommands (each prints what it wrote; every number of the results page comes from their files)::

    python experiments/trl_fork/run.py train --arm factory|tree|control --seed S [--budget 6000] [--out DIR]
    python experiments/trl_fork/run.py report [--out DIR]

``train`` runs one GRPO run of TRL's ``GRPOTrainer`` on ClueProbe (T=4, JSON tools) from the shared warm start
(``--model``, written by the ``forkyard sft`` command of the plan), with the arm's rollouts:

* ``factory``: TRL's own tool loop over ``envs.trl.environment_factory`` (independent episodes);
* ``tree``: ``trainer.trl_rollout.TreeForkRollout(fork_turn="entropy")`` (each group one tree-fork rollout);
* ``control``: ``TreeForkRollout(fork_turn="none")`` (the same loop, G independent episodes, no fork).

It stops at the end of the first step at which the run's env calls (tool calls that reached the env) reach
``--budget``, evaluating the policy every ``--eval-every`` env calls and at the end: the exact greedy success
over ClueProbe's task distribution (every target once, ``envs.features.EvaluationResets``; a greedy policy
is deterministic, so the mean over the 8 targets is its expected success). It writes
``DIR/ARM-seedS.jsonl`` (one line per evaluation: env calls, sampled tokens, steps, success, wall seconds).
``report`` reads every run file and prints the pre-registered tests (``trainer.stats.paired_comparison``)
and writes the curves' plot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ENV_ID = "forkyard/ClueProbe-v0"
ENV_KWARGS = {"max_turns": 4}
ARMS = ("factory", "tree", "control")
#: Per-turn token limit of the rollout_func arms and of the evaluation; the factory arm's whole completion
#: gets TURNS times it (TRL counts the completion across turns).
MAX_NEW_TOKENS = 48


def greedy_success(model: Any, tok: Any) -> float:
    """The exact expected success of greedy decoding: the mean reward over every target of ClueProbe."""
    import gymnasium as gym
    import torch

    import envs  # noqa: F401 - registers the ids
    from envs.actions import ActionParseError
    from envs.tool_calls import parse_model_output
    from envs.trl import env_tools

    env = gym.make(ENV_ID, **ENV_KWARGS).unwrapped
    resets = type(env).evaluation_resets(dict(ENV_KWARGS), 0)
    tools, total = env_tools(env, ENV_ID), 0.0
    model.eval()
    for seed, options in resets:
        obs, _ = env.reset(seed=seed, options=options)
        messages, done, reward = [{"role": "user", "content": obs}], False, 0.0
        while not done:
            ids = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_tensors="pt",
                                          return_dict=True)
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                     pad_token_id=tok.pad_token_id)
            text = tok.decode(out[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)
            try:
                action = parse_model_output(text, tools)
            except ActionParseError:
                action = text.strip()
            obs, r, term, trunc, _ = env.step(action)
            reward += r
            done = term or trunc
            messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": obs}]
        total += reward
    env.close()
    return total / len(resets)


def train(args: argparse.Namespace) -> Path:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envs.trl import environment_factory
    from trainer.trl_rollout import TreeForkRollout

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.arm}-seed{args.seed}.jsonl"
    if path.exists():
        raise SystemExit(f"{path} exists: a run's records are never replaced (delete it to rerun)")
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tok = AutoTokenizer.from_pretrained(args.model)
    calls = {"n": 0}
    kwargs: dict[str, Any] = {}
    if args.arm == "factory":
        base = environment_factory(ENV_ID, **ENV_KWARGS)

        class Counted(base):  # type: ignore[misc, valid-type]
            def reset(self, **row: Any) -> str:
                calls["n"] += self.env.turn if getattr(self, "_started", False) else 0
                self._started = True
                return super().reset(**row)

        kwargs["environment_factory"] = Counted
        counter = lambda trainer: calls["n"] + sum(e.env.turn for e in trainer._environment_pool[None])  # noqa: E731
    else:
        rollout = TreeForkRollout(ENV_ID, fork_turn="entropy" if args.arm == "tree" else "none", seed=args.seed,
                                  max_new_tokens=MAX_NEW_TOKENS, **ENV_KWARGS)
        kwargs.update(reward_funcs=[rollout.reward], rollout_func=rollout)
        counter = lambda trainer: rollout.env_calls  # noqa: E731
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "seed": 100_000 * args.seed + i}
                              for i in range(args.budget)])  # more rows than any run takes
    config = GRPOConfig(output_dir=str(out / f"{args.arm}-seed{args.seed}-trl"), max_steps=10 ** 6,
                        per_device_train_batch_size=8, num_generations=4, learning_rate=args.lr,
                        max_completion_length=MAX_NEW_TOKENS * ENV_KWARGS["max_turns"] * 2, temperature=1.0, beta=0.0,
                        max_tool_calling_iterations=ENV_KWARGS["max_turns"], logging_steps=10, report_to=[],
                        save_strategy="no", use_cpu=True, seed=args.seed, dataloader_num_workers=0, disable_tqdm=True)
    t0, next_eval, last, log = time.monotonic(), 0, [-1], path.open("a")

    def record(trainer: Any) -> None:
        n = last[0] = counter(trainer)
        line = {"arm": args.arm, "seed": args.seed, "env_calls": n, "step": trainer.state.global_step,
                "sampled_tokens": int(trainer.state.num_input_tokens_seen or 0),
                "success": greedy_success(trainer.model, tok), "wall_s": round(time.monotonic() - t0, 1)}
        log.write(json.dumps(line) + "\n")
        log.flush()
        print(line, flush=True)

    class Budget(TrainerCallback):
        def on_step_end(self, _args, state, control, **kw):
            nonlocal next_eval
            n = counter(trainer)
            if n >= next_eval:
                record(trainer)
                next_eval = n + args.eval_every
            if n >= args.budget:
                control.should_training_stop = True
            return control

    trainer = GRPOTrainer(model=model, processing_class=tok, args=config, train_dataset=rows,
                          callbacks=[Budget()], **kwargs)
    record(trainer)  # the warm start, at 0 env calls
    next_eval = args.eval_every
    trainer.train()
    if counter(trainer) != last[0]:
        record(trainer)  # the final policy: the outcome
    log.close()
    return path


def report(args: argparse.Namespace) -> None:
    from trainer.stats import mean_ci, paired_comparison

    runs: dict[str, dict[int, list[dict]]] = {arm: {} for arm in ARMS}
    for f in sorted(Path(args.out).glob("*-seed*.jsonl")):
        lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        if lines:
            runs[lines[0]["arm"]][lines[0]["seed"]] = lines
    final = {arm: {s: lines[-1]["success"] for s, lines in by_seed.items()} for arm, by_seed in runs.items()}
    for arm in ARMS:
        if final[arm]:
            m, h = mean_ci(list(final[arm].values())) if len(final[arm]) > 1 else (next(iter(final[arm].values())), 0)
            print(f"{arm}: {len(final[arm])} runs, final greedy success {m:.3f} +- {h:.3f} (95%)")
    for a, b, role in (("tree", "factory", "primary"), ("tree", "control", "secondary"),
                       ("control", "factory", "secondary")):
        seeds = sorted(set(final[a]) & set(final[b]))
        if len(seeds) >= 2:
            p = paired_comparison([final[a][s] for s in seeds], [final[b][s] for s in seeds])
            print(f"{role}: {a} - {b} over {len(seeds)} paired seeds: {p}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="one run of one arm")
    t.add_argument("--arm", choices=ARMS, required=True)
    t.add_argument("--seed", type=int, required=True)
    t.add_argument("--model", default="runs/trl-fork/sft/sft")
    t.add_argument("--budget", type=int, default=6000, help="env calls per run")
    t.add_argument("--eval-every", type=int, default=1000, help="env calls between evaluations")
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--out", default="runs/trl-fork")
    r = sub.add_parser("report", help="the pre-registered tests over every run file")
    r.add_argument("--out", default="runs/trl-fork")
    args = ap.parse_args(argv)
    if args.command == "train":
        print(train(args))
    else:
        report(args)


if __name__ == "__main__":
    main()
