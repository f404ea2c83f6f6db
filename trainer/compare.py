"""The granularity experiment: advantage estimators against episode length, on ClueProbe or any registered env
with a finite action menu (``info["legal_actions"]``: the tabular policy's rows).

``forkyard compare`` sweeps T (turns) x variant x seed, one process per run on every core, and writes
to ``OUT`` (default ``runs/compare-<time>``): ``results.csv`` (one row per run), ``table.md`` (the
markdown table it prints), ``accuracy_vs_T.png`` (drawn by :func:`trainer.plot.plot_sweep`) and one
``metrics/<run>.jsonl`` per run. A sweep resumes: each finished run also leaves ``rows/<run>.json`` (written
whole or not at all), and a sweep given an ``OUT`` that holds them runs only the others, provided the
settings every run shares (``sweep.json``) are the same. The statistics come from :mod:`trainer.stats`. The
granularity study's own runs, its comparison with the reference study's published numbers and the commands
that regenerate its tables and figures are in ``experiments/granularity/``.

Variants: ``traj``, ``anchor``, ``tree`` (uniform fork turns) as in the reference granularity study
(docs/results/granularity.md), plus ``anchor_fallback`` (GiGPO's combined advantage) and ``tree_entropy`` (fork
at the highest-entropy turn); on request ``rloo``, ``anchor_state`` and ``gigpo_state`` (``anchor`` and
``anchor_fallback`` with steps grouped by the current state, ``info["state_key"]``, as GiGPO groups them, instead
of the visible history), ``tree_branchmean`` (prefix valued by its branches' mean) and ``tree_anchor``
(``anchor_fallback`` on a tree rollout).
On ClueProbe greedy accuracy is exact: the greedy policy plays every one of the ``2**bits`` targets once. On
another env the outcome is the greedy policy's success (``info["episode_metrics"]["success"]``, else the mean
reward) over ``eval_episodes`` held-out seeds.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import setting
from trainer.loop import env_id_arg
from trainer.plot import plot_sweep
from trainer.runlog import write_atomic
from trainer.stats import mean_ci
from trainer.tabular_config import POLICY_KEYS, TrainConfig

VARIANTS: dict[str, dict] = {
    "traj": {"estimator": "traj"},
    "anchor": {"estimator": "anchor"},
    "tree": {"estimator": "tree", "fork_selection": "uniform"},
    "anchor_fallback": {"estimator": "anchor_fallback"},
    "tree_entropy": {"estimator": "tree", "fork_selection": "entropy"},
    "rloo": {"estimator": "rloo"},
    # GiGPO's key: steps grouped by the current state alone (info["state_key"]), not the visible history
    "anchor_state": {"estimator": "anchor", "anchor_by": "state"},
    "gigpo_state": {"estimator": "anchor_fallback", "anchor_by": "state"},
    "tree_branchmean": {"estimator": "tree", "fork_selection": "uniform", "tree_prefix": "branch_mean"},
    # GiGPO's episode + anchor advantage on a tree rollout: the forks make the anchor groups non-degenerate
    "tree_anchor": {"estimator": "anchor_fallback", "rollout": "tree", "fork_selection": "uniform"},
}
#: what a sweep runs unless told (the reference study's three plus two; the others on request)
DEFAULT_VARIANTS = ("traj", "anchor", "tree", "anchor_fallback", "tree_entropy")
#: the env of the reference granularity study, whose greedy accuracy is exact and whose optimum is known
CLUEPROBE = "forkyard/ClueProbe-v0"
#: the turn budgets swept on ClueProbe unless told (the reference study's); other envs: their own budget
CLUEPROBE_TURNS = (2, 3, 4, 5)


@dataclass
class SweepConfig:
    """A sweep of ``forkyard compare`` (the command line is generated from these fields). The per-run
    settings default to :class:`trainer.tabular_config.TrainConfig`'s."""

    env: str = setting(CLUEPROBE, parse=env_id_arg,
                       help="a registered env id with a finite action menu (info['legal_actions'])")
    env_kwargs: dict[str, Any] = setting(default_factory=dict, flag="--env-kwarg",
                                         help="an env constructor argument, KEY=VALUE (repeatable; values parsed as "
                                              "JSON), the same for every run")
    turns: tuple[int, ...] | None = setting(None, flag="--max-turns", aliases=("--turns",),
                                            help="turn budgets (the env's max_turns: episode lengths T) to sweep "
                                                 "(default: 2 3 4 5 on ClueProbe, else the env's own)")
    variants: tuple[str, ...] = setting(DEFAULT_VARIANTS, choices=tuple(VARIANTS), help="estimator variants")
    seeds: int = setting(5, help="training seeds per (T, variant): 0..N-1")
    iterations: int = setting(TrainConfig.iterations, help="iterations per run")
    lr: float = setting(TrainConfig.lr, help="SGD step size on the logit table")
    group_size: int = setting(TrainConfig.group_size, help="G: episodes per group rollout")
    n_base: int = setting(TrainConfig.n_base, help="tree rollouts: base episodes per iteration")
    branches: int = setting(TrainConfig.branches, help="tree rollouts: branches per fork")
    budget_iterations: int | None = setting(
        None, metavar="N",
        help="equal env-call budget: each run at T may spend N*G*T env calls (traj's cost of N iterations) "
             "and trains until it is spent; --iterations is then ignored")
    bits: int = setting(3, help="ClueProbe target bits (ClueProbe only)")
    eval_episodes: int = setting(TrainConfig.eval_episodes,
                                 help="greedy evaluation episodes on held-out seeds (not ClueProbe: every target)")
    policy_key: str = setting("history", choices=POLICY_KEYS,
                              help="the tabular policy's rows keyed by the visible history or the current state")
    eval_every: int = setting(0, help="also evaluate every N iterations (the metrics files' eval_* figures: curves "
                                      "against env calls); 0: only at the end")
    workers: int | None = setting(None, help="processes (default: every core)")
    out: str | None = setting(None, help="output folder (default runs/compare-<time>)")
    progress: bool = setting(True, cli=False, help="a progress bar on stderr")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Checks the settings every run shares (ValueError): ``--bits`` other than 3 is ClueProbe's only."""
        if self.env != CLUEPROBE and self.bits != 3:
            raise ValueError(f"--bits is a ClueProbe setting; give {self.env}'s own with --env-kwarg")

    def turn_budgets(self) -> tuple[int | None, ...]:
        """The T values swept: ``turns``, else ClueProbe's 2-5, else ``(None,)`` (the env's own budget)."""
        if self.turns:
            return tuple(self.turns)
        return CLUEPROBE_TURNS if self.env == CLUEPROBE else (None,)

    def env_kwargs_for(self, turns: int | None) -> dict[str, Any]:
        """The env kwargs of a run at ``turns`` (``None``: the env's default budget)."""
        kwargs = dict(self.env_kwargs)
        if self.env == CLUEPROBE:
            kwargs["bits"] = self.bits
        if turns is not None:
            kwargs["max_turns"] = turns
        return kwargs

    def shared(self) -> dict[str, Any]:
        """The settings every run of the sweep shares (``sweep.json``; a resumed sweep must give the same)."""
        return {"env": self.env, "env_kwargs": self.env_kwargs, "bits": self.bits, "iterations": self.iterations,
                "lr": self.lr, "group_size": self.group_size, "n_base": self.n_base, "branches": self.branches,
                "budget_iterations": self.budget_iterations, "eval_episodes": self.eval_episodes,
                "eval_every": self.eval_every, "policy_key": self.policy_key}


def default_turns(env_id: str, env_kwargs: dict[str, Any]) -> int:
    """The turn budget of ``env_id`` made with ``env_kwargs`` (its ``max_turns``), after checking that the env has
    the finite action menu the tabular policy needs.

    Raises:
        ValueError: the env's first ``info`` has no ``legal_actions`` (an open action set), or bad ``env_kwargs``.
    """
    from trainer.loop import make_env

    env = make_env(env_id, env_kwargs)
    try:
        _, info = env.reset(seed=0)
        if not info.get("legal_actions"):
            raise ValueError(f"{env_id} has no finite action menu (info['legal_actions']): the tabular policy of "
                             "forkyard compare needs one")
        return int(env.max_turns)
    finally:
        env.close()


def optimum(turns: int, bits: int = 3) -> float:
    """Best achievable ClueProbe accuracy: ``min(1, 2**(T-1) / 2**bits)``."""
    return min(1.0, 2 ** (turns - 1) / 2**bits)


def _run_one(job: tuple[int, str, int, SweepConfig, str | None]) -> dict:
    import logging

    import torch

    from trainer.train import train

    torch.set_num_threads(1)
    logging.getLogger("trainer.loop").setLevel(logging.ERROR)  # degeneration is a column of the table
    turns, variant, seed, sweep, metrics_dir = job
    budget = None
    if sweep.budget_iterations is not None:
        budget = sweep.budget_iterations * sweep.group_size * turns
    cfg = TrainConfig(
        env_id=sweep.env,
        env_kwargs=sweep.env_kwargs_for(turns),
        eval_episodes=sweep.eval_episodes,
        eval_every=sweep.eval_every,
        policy_key=sweep.policy_key,
        iterations=sweep.iterations if budget is None else 100 * sweep.budget_iterations,
        lr=sweep.lr,
        seed=seed,
        group_size=sweep.group_size,
        n_base=sweep.n_base,
        branches=sweep.branches,
        max_env_calls=budget,
        device="cpu",
        **VARIANTS[variant],
    )
    result = train(cfg)
    ms = result.metrics
    if metrics_dir:
        with open(Path(metrics_dir) / f"{run_name(turns, variant, seed)}.jsonl", "w") as f:
            for m in ms:
                f.write(json.dumps(m) + "\n")
    n = len(ms)
    ev = result.evaluation
    row = {
        "turns": turns,
        "variant": variant,
        "seed": seed,
        # the greedy policy's success: ClueProbe's exact accuracy; another env's success rate (else mean reward)
        "accuracy": ev["accuracy"] if sweep.env == CLUEPROBE else ev.get("success", ev["accuracy"]),
        "distinct_probes": ev.get("distinct_probes", math.nan),  # reported by ClueProbe (info["episode_metrics"])
        "iterations": n,
        "env_calls_per_iter": sum(m["env_calls"] for m in ms) / n,
        "env_calls_total": sum(m["env_calls"] for m in ms),
        "degeneration": sum(m["degeneration"] for m in ms) / n,
        "final_reward_mean": sum(m["reward_mean"] for m in ms[-20:]) / min(20, n),
        "wall_s": result.wall_s,
    }
    row["degeneration_state"] = sum(m.get("degeneration_state", math.nan) for m in ms) / n
    if sweep.env != CLUEPROBE:  # ClueProbe's accuracy is its mean return
        row["mean_return"] = ev["accuracy"]
    return row


def run_name(turns: int, variant: str, seed: int) -> str:
    """A run's file name stem in the sweep's folder: ``T<turns>_<variant>_s<seed>``."""
    return f"T{turns}_{variant}_s{seed}"


def _run_and_save(job: tuple[int, str, int, SweepConfig, str | None]) -> dict:
    """:func:`_run_one`, its row then saved as ``rows/<run>.json`` next to ``metrics/`` (temp file + rename)."""
    row = _run_one(job)
    turns, variant, seed, _, metrics_dir = job
    if metrics_dir:
        rows_dir = Path(metrics_dir).parent / "rows"
        tmp = rows_dir / f".{run_name(turns, variant, seed)}.tmp"
        tmp.write_text(json.dumps(row))
        os.replace(tmp, rows_dir / f"{run_name(turns, variant, seed)}.json")
    return row


def summarize(rows: list[dict]) -> list[dict]:
    """Aggregate per-run rows into one row per (T, variant) with mean, min, max and the half-width of the
    95% Student-t interval of the mean accuracy over seeds (:func:`trainer.stats.mean_ci`; NaN for one seed)."""
    out = []
    keys = sorted({(r["turns"], r["variant"]) for r in rows}, key=lambda k: (k[0], list(VARIANTS).index(k[1])))
    for turns, variant in keys:
        rs = [r for r in rows if r["turns"] == turns and r["variant"] == variant]
        accs = [r["accuracy"] for r in rs]
        mean, half = mean_ci(accs)
        out.append({
            "turns": turns,
            "variant": variant,
            "seeds": len(rs),
            "acc_mean": mean,
            "acc_ci95": half,
            "acc_min": min(accs),
            "acc_max": max(accs),
            "distinct_probes": sum(r["distinct_probes"] for r in rs) / len(rs),
            "env_calls_per_iter": sum(r["env_calls_per_iter"] for r in rs) / len(rs),
            "iterations": sum(r["iterations"] for r in rs) / len(rs),
            "degeneration": sum(r["degeneration"] for r in rs) / len(rs),
        })
        if "degeneration_state" in rs[0]:
            out[-1]["degeneration_state"] = sum(float(r["degeneration_state"]) for r in rs) / len(rs)
    return out


def markdown_table(summary: list[dict], bits: int = 3, env: str = CLUEPROBE) -> str:
    """The markdown table ``forkyard compare`` prints (ClueProbe's, with its optimum and distinct probes; another
    env's with the greedy success and the degeneration under both anchor keys)."""
    if env != CLUEPROBE:
        lines = ["| T | variant | greedy success mean ± 95% CI | min | max | env calls / iter | iterations "
                 "| degeneration, history key | degeneration, state key |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for s in summary:
            ci = "n/a" if math.isnan(s["acc_ci95"]) else f"{s['acc_ci95']:.3f}"
            lines.append(
                f"| {s['turns']} | {s['variant']} | {s['acc_mean']:.3f} ± {ci} | {s['acc_min']:.3f} | "
                f"{s['acc_max']:.3f} | {s['env_calls_per_iter']:.1f} | {s['iterations']:.0f} | "
                f"{100 * s['degeneration']:.1f}% | {100 * s.get('degeneration_state', math.nan):.1f}% |")
        return "\n".join(lines)
    lines = [
        "| T | optimum | variant | greedy accuracy mean ± 95% CI | min | max | distinct probes | env calls / iter "
        "| iterations | degeneration |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        ci = "n/a" if math.isnan(s["acc_ci95"]) else f"{s['acc_ci95']:.3f}"
        lines.append(
            f"| {s['turns']} | {optimum(s['turns'], bits):.2f} | {s['variant']} | {s['acc_mean']:.3f} ± {ci} | "
            f"{s['acc_min']:.3f} | {s['acc_max']:.3f} | {s['distinct_probes']:.2f} | {s['env_calls_per_iter']:.1f} | "
            f"{s['iterations']:.0f} | {100 * s['degeneration']:.1f}% |"
        )
    return "\n".join(lines)


def run_sweep(sweep: SweepConfig) -> tuple[list[dict], list[dict], Path]:
    """Run the sweep on ``workers`` processes (default: every core), skipping the runs ``out`` already holds
    (``rows/<run>.json``). Returns (per-run rows, summary, out dir).

    Raises:
        ValueError: unknown variants, or an ``out`` folder of a sweep with other shared settings (``sweep.json``).
    """
    from multiprocessing import get_context

    unknown = set(sweep.variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    out = Path(sweep.out or f"runs/compare-{time.strftime('%Y%m%d-%H%M%S')}")
    shared = json.loads(json.dumps(sweep.shared()))
    if (out / "sweep.json").exists() and json.loads((out / "sweep.json").read_text()) != shared:
        raise ValueError(f"{out} holds a sweep with other settings ({out / 'sweep.json'}): give another --out")
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    (out / "rows").mkdir(exist_ok=True)
    write_atomic(out / "sweep.json", json.dumps(shared, indent=1) + "\n")  # a kill never leaves it torn
    turns = [t if t is not None else default_turns(sweep.env, sweep.env_kwargs_for(None))
             for t in sweep.turn_budgets()]
    for t in turns:  # every budget checked here, not in a worker: a bad env or kwarg is one clear error
        default_turns(sweep.env, sweep.env_kwargs_for(t))
    wanted = [(t, v, s) for t in turns for v in sweep.variants for s in range(sweep.seeds)]
    rows: list[dict] = []
    for t, v, s in wanted:
        done = out / "rows" / f"{run_name(t, v, s)}.json"
        if done.exists():
            rows.append(json.loads(done.read_text()))
    have = {(r["turns"], r["variant"], r["seed"]) for r in rows}
    jobs = [(t, v, s, sweep, str(out / "metrics")) for t, v, s in wanted if (t, v, s) not in have]
    # Longest runs first so the pool's tail is short.
    jobs.sort(key=lambda j: -j[0])
    workers = sweep.workers or os.cpu_count() or 1
    bar = None
    if sweep.progress:
        from tqdm import tqdm

        bar = tqdm(total=len(wanted), initial=len(rows), desc="runs", unit="run")
    if jobs:
        with get_context("fork").Pool(workers) as pool:
            for row in pool.imap_unordered(_run_and_save, jobs):
                rows.append(row)
                if bar:
                    bar.update(1)
    if bar:
        bar.close()
    rows.sort(key=lambda r: (r["turns"], list(VARIANTS).index(r["variant"]), r["seed"]))
    summary = summarize(rows)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "table.md").write_text(markdown_table(summary, sweep.bits, sweep.env) + "\n")
    if sweep.env == CLUEPROBE:
        plot_sweep(summary, out / "accuracy_vs_T.png", variants=tuple(VARIANTS),
                   optimum=lambda t: optimum(t, sweep.bits), chance=1 / 2**sweep.bits)
    else:
        plot_sweep(summary, out / "accuracy_vs_T.png", variants=tuple(VARIANTS), optimum=None, chance=None,
                   title=f"{sweep.env} {json.dumps(sweep.env_kwargs)}: advantage granularity",
                   ylabel="greedy success (held-out seeds)")
    return rows, summary, out
