"""Every figure of forkyard, drawn with matplotlib (Agg backend) to a PNG; the statistics behind the error
bars and bands come from :mod:`trainer.stats`.

* :func:`plot_run` (``forkyard plot RUN_DIR``): the stability curves of a run (``RUN_DIR/metrics.jsonl``),
  one panel per monitored metric (:data:`trainer.monitors.MONITORED`, plus the periodic evaluation
  accuracies when present), x axis = iteration. ``compare`` draws more runs on the same axes (for
  example the tree-fork run and the trajectory-level run of the same budget). Iterations where the
  Echo-Trap detector fired are marked with a vertical red line.
* :func:`plot_sweep`: ``forkyard compare``'s ``accuracy_vs_T.png``, mean greedy accuracy against episode
  length per variant with 95% Student-t error bars (:func:`trainer.compare.summarize`).
* :func:`plot_per_seed`: one value per (arm, seed), one panel per metric
  (``scripts/text-policy-stats.py --png``).
* :func:`plot_budget_curves`: the mean over seeds of training curves against env calls spent, with a
  ±1 standard-error band (``scripts/text-policy-stats.py --curves``).

matplotlib (``train`` extra) is imported by the functions that draw, so importing this module is cheap.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from trainer.monitors import MONITORED

EVAL_KEYS = ("eval_greedy_accuracy", "eval_sampled_accuracy")


def _pyplot():
    """matplotlib.pyplot on the Agg (file-only) backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``RUN_DIR/metrics.jsonl``. Raises FileNotFoundError if it is missing."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_run(run_dir: str | Path, out: str | Path | None = None, compare: tuple | list = ()) -> str:
    """Draw the curves of ``run_dir`` (and of each run in ``compare``) to ``out`` (default
    ``RUN_DIR/curves.png``). Returns the PNG path. Raises FileNotFoundError / ValueError on a missing or
    empty metrics file."""
    plt = _pyplot()
    runs = [Path(run_dir), *map(Path, compare)]
    data = {r: read_metrics(r) for r in runs}
    for r, rows in data.items():
        if not rows:
            raise ValueError(f"{r}/metrics.jsonl has no rows")
    keys = [k for k in (*MONITORED, *EVAL_KEYS) if any(k in row for rows in data.values() for row in rows)]
    ncol = 3
    nrow = (len(keys) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 2.8 * nrow), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for r, rows in data.items():
            pts = [(row["iteration"], row[key]) for row in rows if key in row]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if key in EVAL_KEYS else None, ms=3, label=r.name)
            for row in rows:
                if row.get("echo_trap_warning"):
                    ax.axvline(row["iteration"], color="red", lw=0.8)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    path = Path(out) if out else runs[0] / "curves.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def plot_sweep(summary: list[dict], path: str | Path, *, variants: Sequence[str], optimum: Callable[[int], float],
               chance: float, title: str = "") -> None:
    """``forkyard compare``'s figure: greedy accuracy against T, one line per variant of ``summary`` (in the
    order of ``variants``, slightly offset in x) with error bars of the 95% interval half-width
    (``acc_ci95``, none where it is NaN), ``optimum(T)`` (dashed) and ``chance`` (dotted). ``summary`` is
    :func:`trainer.compare.summarize`'s output; saved as a PNG at ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    variants = [v for v in variants if any(s["variant"] == v for s in summary)]
    for k, v in enumerate(variants):
        ss = [s for s in summary if s["variant"] == v]
        xs = [s["turns"] + (k - len(variants) / 2) * 0.05 for s in ss]
        err = [0 if math.isnan(s["acc_ci95"]) else s["acc_ci95"] for s in ss]
        ax.errorbar(xs, [s["acc_mean"] for s in ss], yerr=err, marker="o", capsize=3, label=v)
    ts = sorted({s["turns"] for s in summary})
    ax.plot(ts, [optimum(t) for t in ts], "k--", label="optimum")
    ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance")
    ax.set_xlabel("turns T")
    ax.set_ylabel("greedy accuracy (exact over all targets)")
    ax.set_xticks(ts)
    ax.set_title(title or "ClueProbe: advantage granularity vs episode length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_per_seed(rows: Mapping[tuple[str, int], Mapping[str, float]], seeds: Sequence[int], path: str | Path, *,
                  panels: Sequence[tuple[str, str]], arms: Sequence[tuple[str, str]], xlabel: str, title: str,
                  split_at: float | None = None) -> None:
    """One panel per ``(metric, y label)`` of ``panels``; in each, one line per ``(arm, marker)`` of ``arms``
    through ``rows[(arm, seed)][metric]`` over ``seeds`` (a gap where a seed lacks it; an arm with no seed
    at all is left out). ``split_at``: x of a dotted vertical line (between two groups of seeds)."""
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for a, (metric, ylabel) in zip(ax[0], panels):
        for name, mk in arms:
            if any((name, s) in rows for s in seeds):
                a.plot(seeds, [rows.get((name, s), {}).get(metric, np.nan) for s in seeds], mk + "-",
                       label=name, alpha=0.8)
        if split_at is not None:
            a.axvline(split_at, color="grey", ls=":", lw=1)
        a.set_xlabel(xlabel)
        a.set_ylabel(ylabel)
        a.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_budget_curves(runs: Mapping[str, Sequence[Sequence[dict]]], path: str | Path, *, budget: int,
                       title: str, ylabels: tuple[str, str], grid_step: int = 240, trailing: int = 10,
                       eval_key: str = "eval_sampled_accuracy") -> None:
    """Training curves against env calls spent, averaged over seeds: ``runs`` maps an arm to its runs' metric
    rows (one list per seed, each row with ``env_calls_total``, ``reward_mean`` and now and then
    ``eval_key``). Left panel: the training reward (trailing mean over ``trailing`` iterations); right: the
    periodic evaluation ``eval_key``, drawn only from the budget where every run has been evaluated once.
    Each run is interpolated linearly on a grid of ``grid_step`` env calls up to ``budget``; a line is the
    mean over runs and its band ±1 standard error (:func:`trainer.stats.standard_error` across runs)."""
    import numpy as np

    from trainer.stats import standard_error

    plt = _pyplot()
    grid = np.arange(grid_step, budget + 1, grid_step)
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for name, metrics in runs.items():
        rew, acc, first_eval = [], [], 0.0
        for ms in metrics:
            x = np.array([m["env_calls_total"] for m in ms], dtype=float)
            rewards = np.array([m["reward_mean"] for m in ms])
            smooth = np.array([rewards[max(0, i - trailing + 1): i + 1].mean() for i in range(len(rewards))])
            rew.append(np.interp(grid, x, smooth))
            ev = [(m["env_calls_total"], m[eval_key]) for m in ms if eval_key in m]
            first_eval = max(first_eval, ev[0][0])
            acc.append(np.interp(grid, [e[0] for e in ev], [e[1] for e in ev]))
        for i, series in enumerate((rew, acc)):
            keep = grid >= (first_eval if i else 0)  # evaluation: only where every run has been evaluated once
            mean = np.mean(series, axis=0)[keep]
            se = standard_error(series, axis=0)[keep]
            ax[i].plot(grid[keep], mean, label=f"{name} ({len(metrics)} seeds)")
            ax[i].fill_between(grid[keep], mean - se, mean + se, alpha=0.2)
    for a, ylabel in zip(ax, ylabels):
        a.set_ylabel(ylabel)
    for a in ax:
        a.set_xlabel("env calls spent")
        a.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
