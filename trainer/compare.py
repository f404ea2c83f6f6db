"""The granularity experiment: advantage estimators against episode length on ClueProbe.

``forkyard compare`` sweeps T (turns) x variant x seed, one process per run on every core, and writes
to ``OUT`` (default ``runs/compare-<time>``): ``results.csv`` (one row per run), ``table.md`` (the
markdown table it prints), ``accuracy_vs_T.png`` (drawn by :func:`trainer.plot.plot_sweep`) and one
``metrics/<run>.jsonl`` per run. The statistics come from :mod:`trainer.stats`. The granularity study's own
runs, its comparison with the reference study's published numbers and the commands that regenerate its tables
and figures are in ``experiments/granularity/``.

Variants: ``traj``, ``anchor``, ``tree`` (uniform fork turns) as in the reference granularity study
(docs/results/granularity.md), plus ``anchor_fallback`` (GiGPO's combined advantage) and ``tree_entropy`` (fork
at the highest-entropy turn); on request ``tree_branchmean`` (prefix valued by its branches' mean) and
``tree_anchor`` (``anchor_fallback`` on a tree rollout).
Greedy accuracy is exact: the greedy policy plays every one of the ``2**bits`` targets once.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from trainer.config import setting
from trainer.plot import plot_sweep
from trainer.stats import mean_ci
from trainer.tabular_config import TrainConfig

VARIANTS: dict[str, dict] = {
    "traj": {"estimator": "traj"},
    "anchor": {"estimator": "anchor"},
    "tree": {"estimator": "tree", "fork_selection": "uniform"},
    "anchor_fallback": {"estimator": "anchor_fallback"},
    "tree_entropy": {"estimator": "tree", "fork_selection": "entropy"},
    "tree_branchmean": {"estimator": "tree", "fork_selection": "uniform", "tree_prefix": "branch_mean"},
    # GiGPO's episode + anchor advantage on a tree rollout: the forks make the anchor groups non-degenerate
    "tree_anchor": {"estimator": "anchor_fallback", "rollout": "tree", "fork_selection": "uniform"},
}
#: what a sweep runs unless told (the reference study's three plus two; the others on request)
DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v not in ("tree_branchmean", "tree_anchor"))


@dataclass
class SweepConfig:
    """A sweep of ``forkyard compare`` (the command line is generated from these fields). The per-run
    settings default to :class:`trainer.tabular_config.TrainConfig`'s."""

    turns: tuple[int, ...] = setting((2, 3, 4, 5), flag="--max-turns", aliases=("--turns",),
                                     help="turn budgets (the env's max_turns: episode lengths T) to sweep")
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
    bits: int = setting(3, help="ClueProbe target bits")
    workers: int | None = setting(None, help="processes (default: every core)")
    out: str | None = setting(None, help="output folder (default runs/compare-<time>)")
    progress: bool = setting(True, cli=False, help="a progress bar on stderr")


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
        env_kwargs={"max_turns": turns, "bits": sweep.bits},
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
        with open(Path(metrics_dir) / f"T{turns}_{variant}_s{seed}.jsonl", "w") as f:
            for m in ms:
                f.write(json.dumps(m) + "\n")
    n = len(ms)
    return {
        "turns": turns,
        "variant": variant,
        "seed": seed,
        "accuracy": result.evaluation["accuracy"],
        "distinct_probes": result.evaluation["distinct_probes"],  # reported by ClueProbe (info["episode_metrics"])
        "iterations": n,
        "env_calls_per_iter": sum(m["env_calls"] for m in ms) / n,
        "env_calls_total": sum(m["env_calls"] for m in ms),
        "degeneration": sum(m["degeneration"] for m in ms) / n,
        "final_reward_mean": sum(m["reward_mean"] for m in ms[-20:]) / min(20, n),
        "wall_s": result.wall_s,
    }


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
    return out


def markdown_table(summary: list[dict], bits: int = 3) -> str:
    """The markdown table ``forkyard compare`` prints."""
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
    """Run the sweep on ``workers`` processes (default: every core). Returns (per-run rows, summary, out dir)."""
    from multiprocessing import get_context

    unknown = set(sweep.variants) - set(VARIANTS)
    if unknown:
        raise ValueError(f"unknown variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    out = Path(sweep.out or f"runs/compare-{time.strftime('%Y%m%d-%H%M%S')}")
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    jobs = [(t, v, s, sweep, str(out / "metrics"))
            for t in sweep.turns for v in sweep.variants for s in range(sweep.seeds)]
    # Longest runs first so the pool's tail is short.
    jobs.sort(key=lambda j: -j[0])
    workers = sweep.workers or os.cpu_count() or 1
    rows: list[dict] = []
    bar = None
    if sweep.progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc="runs", unit="run")
    with get_context("fork").Pool(workers) as pool:
        for row in pool.imap_unordered(_run_one, jobs):
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
    (out / "table.md").write_text(markdown_table(summary, sweep.bits) + "\n")
    plot_sweep(summary, out / "accuracy_vs_T.png", variants=tuple(VARIANTS),
               optimum=lambda t: optimum(t, sweep.bits), chance=1 / 2**sweep.bits)
    return rows, summary, out
