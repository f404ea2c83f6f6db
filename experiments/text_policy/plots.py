"""The text-policy study's figures (docs/results/text_policy.md), drawn with matplotlib (Agg backend) to a PNG.

* :func:`plot_per_seed`: one value per (arm, seed), one panel per metric (``stats.py --png``);
* :func:`plot_budget_curves`: the mean over seeds of training curves against env calls spent, with a
  ±1 standard-error band (``stats.py --curves``; :func:`trainer.stats.standard_error`).

matplotlib and numpy (the ``train`` extra) are imported by the functions that draw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def _pyplot():
    """matplotlib.pyplot on the Agg (file-only) backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_per_seed(rows: Mapping[tuple[str, int], Mapping[str, float]], seeds: Sequence[int], path: str | Path, *,
                  panels: Sequence[tuple[str, str]], arms: Sequence[tuple[str, str]], xlabel: str, title: str,
                  split_at: float | None = None) -> None:
    """One panel per ``(metric, y label)`` of ``panels``; in each, one line per ``(arm, marker)`` of ``arms``
    through ``rows[(arm, seed)][metric]`` over ``seeds`` (a gap where a seed lacks it; an arm with no seed
    at all is left out). ``split_at``: x of a dotted vertical line (between two groups of seeds)."""
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for a, (metric, ylabel) in zip(ax[0], panels, strict=True):
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
    for a, ylabel in zip(ax, ylabels, strict=True):
        a.set_ylabel(ylabel)
    for a in ax:
        a.set_xlabel("env calls spent")
        a.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
