"""Does the fork pay inside TRL? The runs of the pre-registered comparison in ``experiments/trl_fork/plan.md``.

Subcommands (each prints what it wrote; every number of the results page comes from their files)::

    python experiments/trl_fork/run.py train --arm factory|tree|control --seed S [--budget 6000] [--out DIR]
    python experiments/trl_fork/run.py all [--budget 2000] [--eval-every 500] [--out DIR]
    python experiments/trl_fork/run.py report [--out DIR] [--md PATH] [--png PATH]
    python experiments/trl_fork/run.py export [--out DIR] [--budget N] [--to DIR]

``train`` runs one GRPO run of TRL's ``GRPOTrainer`` on ClueProbe (T=4, JSON tools) from the shared warm start
(``--model``, written by the ``forkyard sft`` command of the plan), with the arm's rollouts:

* ``factory``: TRL's own tool loop over ``envs.trl.environment_factory`` (independent episodes);
* ``tree``: ``trainer.trl_rollout.TreeForkRollout(fork_turn="entropy")`` (each group one tree-fork rollout);
* ``control``: ``TreeForkRollout(fork_turn="none")`` (the same loop, G independent episodes, no fork).

It stops at the end of the first step at which the run's env calls (tool calls that reached the env) reach
``--budget``, evaluating the policy every ``--eval-every`` env calls and at the end: the exact greedy success
over ClueProbe's task distribution (every target once, ``envs.features.EvaluationResets``; a greedy policy
is deterministic, so the mean over the 8 targets is its expected success). It writes
``DIR/ARM-seedS.jsonl`` (one line per evaluation: env calls, sampled tokens, steps, success, wall seconds). The
lines go to ``DIR/ARM-seedS.jsonl.partial`` while the run lasts, renamed to the ``.jsonl`` once the final policy's
line is written: a run that was stopped leaves only a ``.partial`` (started afresh next time), never a run file.
Torch runs on ``--threads`` CPU threads (default 1: one run per core; the runs of the plan all on the same count).

``all`` runs every (arm, seed) of the plan in the plan's order (seed 0..11, for each factory, tree, control), each
``train`` in its own process, skipping a run whose ``.jsonl`` exists and reached the budget; it can be stopped at
any time (Ctrl-C, or ``kill`` of the driver's pid, which takes its running child down with it) and started again
with the same command: the interrupted run starts afresh.
``report`` reads every run file and prints the pre-registered tests (``trainer.stats.paired_comparison``)
and writes the curves' plot.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
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


def run_path(out: str | Path, arm: str, seed: int) -> Path:
    """The run file of one (arm, seed): present only once the run has ended (see :class:`RunLog`)."""
    return Path(out) / f"{arm}-seed{seed}.jsonl"


class RunLog:
    """A run's lines, written to ``PATH.partial`` as they come and renamed to ``PATH`` by :meth:`commit`: a killed
    run leaves a ``.partial`` (replaced by the next start), never a run file that reads as complete."""

    def __init__(self, path: Path):
        self.path, self.partial = path, path.with_name(path.name + ".partial")
        self.file = self.partial.open("w")

    def write(self, line: dict) -> None:
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()

    def commit(self) -> Path:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.partial, self.path)
        return self.path


def complete(path: Path, budget: int) -> bool:
    """Whether ``path`` is a finished run of at least ``budget`` env calls.

    Raises:
        SystemExit: a finished run of a smaller budget (another study's file in this folder).
    """
    if not path.exists():
        return False
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    if not lines or lines[-1]["env_calls"] < budget:
        raise SystemExit(f"{path} is a run of {lines[-1]['env_calls'] if lines else 0} env calls, under the budget "
                         f"{budget}: move it away (runs are never replaced)")
    return True


def train(args: argparse.Namespace) -> Path:
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from envs.trl import environment_factory
    from trainer.trl_rollout import TreeForkRollout

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = run_path(out, args.arm, args.seed)
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
    t0, next_eval, last, log = time.monotonic(), 0, [-1], RunLog(path)

    def record(trainer: Any) -> None:
        n = last[0] = counter(trainer)
        line = {"arm": args.arm, "seed": args.seed, "env_calls": n, "step": trainer.state.global_step,
                "sampled_tokens": int(trainer.state.num_input_tokens_seen or 0),
                "success": greedy_success(trainer.model, tok), "wall_s": round(time.monotonic() - t0, 1)}
        log.write(line)
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
    return log.commit()


def plan_runs(seeds: list[int], arms: list[str]) -> list[tuple[str, int]]:
    """The (arm, seed) runs in the plan's order: seed by seed, each seed's arms in turn."""
    return [(arm, s) for s in seeds for arm in arms]


def run_all(args: argparse.Namespace, launch: Any = None) -> list[Path]:
    """Every run of the plan not yet complete, one ``train`` process after another (``launch(argv)`` runs one;
    default: a child process of this script, whose failure stops the driver). Returns the run files."""
    def child(argv: list[str]) -> None:
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv])
        if done.returncode:
            raise SystemExit(f"run {argv} failed (exit {done.returncode}); fix it and start again")

    if launch is None:
        launch = child

        def stop(signum: int, _frame: Any) -> None:  # kill DRIVER: subprocess.run kills the child on the way out
            raise SystemExit(f"stopped by signal {signum}; start again with the same command")

        signal.signal(signal.SIGTERM, stop)
    runs = plan_runs(args.seeds, args.arms)
    paths = []
    for i, (arm, seed) in enumerate(runs, 1):
        path = run_path(args.out, arm, seed)
        if complete(path, args.budget):
            print(f"[{i}/{len(runs)}] {path} complete, skipped", flush=True)
        else:
            print(f"[{i}/{len(runs)}] {arm} seed {seed} ...", flush=True)
            t0 = time.monotonic()
            launch(["train", "--arm", arm, "--seed", str(seed), "--budget", str(args.budget), "--eval-every",
                    str(args.eval_every), "--model", args.model, "--lr", str(args.lr), "--out", str(args.out),
                    "--threads", str(args.threads)])
            if not complete(path, args.budget):
                raise SystemExit(f"run {arm} seed {seed} ended without its file {path}")
            print(f"[{i}/{len(runs)}] {path} written in {time.monotonic() - t0:.0f} s", flush=True)
        paths.append(path)
    return paths


def load_runs(folder: str | Path) -> dict[str, dict[int, list[dict]]]:
    """Every finished run file (``ARM-seedS.jsonl``) of ``folder``: ``{arm: {seed: [evaluation lines]}}``."""
    runs: dict[str, dict[int, list[dict]]] = {arm: {} for arm in ARMS}
    for f in sorted(Path(folder).glob("*-seed*.jsonl")):
        lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        if lines:
            runs[lines[0]["arm"]][lines[0]["seed"]] = lines
    return runs


def report(args: argparse.Namespace) -> str:
    """The plan's tables over the run files of ``args.out`` (markdown; also written to ``args.md``): per arm the
    final greedy success (mean ± 95% t-interval), then the primary and secondary paired comparisons
    (:func:`trainer.stats.paired_comparison`: mean difference, interval, one-sided paired t-test, sign test);
    ``args.png`` gets the curves, success against env calls and against sampled tokens, every run drawn."""
    from trainer.stats import mean_ci, paired_comparison

    runs = load_runs(args.out)
    final = {arm: {s: lines[-1]["success"] for s, lines in by_seed.items()} for arm, by_seed in runs.items()}
    out = ["| arm | runs | final greedy success, mean ± 95% CI | env calls per run (mean) |", "|---|---|---|---|"]
    for arm in ARMS:
        if final[arm]:
            vals = list(final[arm].values())
            m, h = mean_ci(vals) if len(vals) > 1 else (vals[0], float("nan"))
            calls = sum(lines[-1]["env_calls"] for lines in runs[arm].values()) / len(runs[arm])
            out.append(f"| {arm} | {len(vals)} | {m:.3f} ± {h:.3f} | {calls:.0f} |")
    out += ["", "| comparison | role | paired seeds | mean difference | 95% interval | one-sided t-test p | "
            "sign test p (wins / ties) |", "|---|---|---|---|---|---|---|"]
    for a, b, role in (("tree", "factory", "primary"), ("tree", "control", "secondary"),
                       ("control", "factory", "secondary")):
        seeds = sorted(set(final[a]) & set(final[b]))
        if len(seeds) >= 2:
            p = paired_comparison([final[a][s] for s in seeds], [final[b][s] for s in seeds])
            out.append(f"| {a} − {b} | {role} | {len(seeds)} | {p.mean:+.3f} | ({p.lo:+.3f}, {p.hi:+.3f}) | "
                       f"{p.p_t:.3g} | {p.p_sign:.3g} ({p.wins} / {p.ties}) |")
    text = "\n".join(out)
    if getattr(args, "md", None):
        Path(args.md).write_text(text + "\n")
    if getattr(args, "png", None):
        curves(runs, args.png)
    return text


def curves(runs: dict[str, dict[int, list[dict]]], png: str | Path) -> None:
    """Greedy success against env calls (left) and against sampled tokens (right), every run one thin line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for k, arm in enumerate(ARMS):
        for i, lines in enumerate(runs[arm].values()):
            for ax, x in zip(axes, ("env_calls", "sampled_tokens"), strict=True):
                ax.plot([ln[x] for ln in lines], [ln["success"] for ln in lines], color=f"C{k}", lw=0.8 + 0.8 * k,
                        ls=("-", "--", ":")[k], alpha=0.6, label=arm if i == 0 else None)
    for ax, x in zip(axes, ("env calls", "sampled tokens (TRL's count of tokens seen)"), strict=True):
        ax.set_xlabel(x)
        ax.set_ylabel("greedy success (exact over the 8 targets)")
        ax.set_ylim(-0.02, 1.02)
        ax.axhline(0.125, color="grey", lw=0.6, ls=":")  # chance: one target of eight
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def export(args: argparse.Namespace) -> list[Path]:
    """Copy every run of ``args.out`` complete at ``args.budget`` into ``args.to`` (the committed data)."""
    dest = Path(args.to)
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for arm, seed in plan_runs(list(range(12)), list(ARMS)):
        path = run_path(args.out, arm, seed)
        if complete(path, args.budget):
            (dest / path.name).write_bytes(path.read_bytes())
            copied.append(dest / path.name)
    return copied


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="one run of one arm")
    t.add_argument("--arm", choices=ARMS, required=True)
    t.add_argument("--seed", type=int, required=True)
    a = sub.add_parser("all", help="every run of the plan not yet complete, in the plan's order (resumable)")
    a.add_argument("--seeds", type=int, nargs="+", default=list(range(12)))
    a.add_argument("--arms", choices=ARMS, nargs="+", default=list(ARMS))
    for p, budget, every in ((t, 6000, 1000), (a, 2000, 500)):
        p.add_argument("--model", default="runs/trl-fork/sft/sft")
        p.add_argument("--budget", type=int, default=budget, help="env calls per run")
        p.add_argument("--eval-every", type=int, default=every, help="env calls between evaluations")
        p.add_argument("--lr", type=float, default=1e-4)
        p.add_argument("--out", default="runs/trl-fork")
        p.add_argument("--threads", type=int, default=1, help="torch CPU threads of a run")
    r = sub.add_parser("report", help="the pre-registered tests over every run file")
    r.add_argument("--out", default="runs/trl-fork", help="the folder of the run files")
    r.add_argument("--md", default=None, help="also write the tables here")
    r.add_argument("--png", default=None, help="draw the curves here")
    e = sub.add_parser("export", help="copy the complete runs into the committed data folder")
    e.add_argument("--out", default="runs/trl-fork")
    e.add_argument("--budget", type=int, default=2000)
    e.add_argument("--to", default="experiments/trl_fork/data/budget2000")
    args = ap.parse_args(argv)
    if args.command == "train":
        print(train(args))
    elif args.command == "all":
        run_all(args)
    elif args.command == "export":
        for path in export(args):
            print(path)
    else:
        print(report(args))


if __name__ == "__main__":
    main()
