"""The figures of forkyard's commands, drawn with matplotlib (Agg backend) to a PNG; the statistics behind
the error bars come from :mod:`trainer.stats`.

* :func:`plot_run` (``forkyard plot RUN_DIR``): the stability curves of a run (``RUN_DIR/metrics.jsonl``),
  one panel per monitored metric (:data:`trainer.text.monitors.MONITORED`, plus the periodic evaluation
  accuracies when present), x axis = iteration. ``compare`` draws more runs on the same axes (for
  example the tree-fork run and the trajectory-level run of the same budget). Iterations where the
  Echo-Trap detector fired are marked with a vertical red line.
* :func:`plot_sweep`: ``forkyard compare``'s ``accuracy_vs_T.png``, mean greedy accuracy against episode
  length per variant with 95% Student-t error bars (:func:`trainer.compare.summarize`).

The text-policy study's figures (per-seed values, mean training curves against env calls) are drawn by
``experiments/text_policy/plots.py``, beside the study's data.

matplotlib (``train`` extra) is imported by the functions that draw, so importing this module is cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from trainer.text.monitors import MONITORED

EVAL_KEYS = ("eval_greedy_accuracy", "eval_sampled_accuracy")


def _pyplot():
    """matplotlib.pyplot on the Agg (file-only) backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``RUN_DIR/metrics.jsonl`` (a torn tail of a killed run ignored with a warning:
    :func:`trainer.runlog.read_log`). Raises FileNotFoundError if it is missing, DamagedLogError if a line before
    the end is damaged."""
    from trainer.runlog import read_log

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(path)
    return read_log(path).rows


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
    for ax, key in zip(axes.flat, keys, strict=False):  # the grid may have more axes than keys
        for r, rows in data.items():
            pts = [(row["iteration"], row[key]) for row in rows if key in row]
            if pts:
                xs, ys = zip(*pts, strict=True)
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


def plot_sweep(summary: list[dict], path: str | Path, *, variants: Sequence[str],
               optimum: Callable[[int], float] | None, chance: float | None, title: str = "",
               ylabel: str = "greedy accuracy (exact over all targets)") -> None:
    """``forkyard compare``'s figure: greedy accuracy (or success) against T, one line per variant of ``summary``
    (in the order of ``variants``, slightly offset in x) with error bars of the 95% interval half-width
    (``acc_ci95``, none where it is NaN), ``optimum(T)`` (dashed) and ``chance`` (dotted) where given. ``summary``
    is :func:`trainer.compare.summarize`'s output; saved as a PNG at ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    variants = [v for v in variants if any(s["variant"] == v for s in summary)]
    for k, v in enumerate(variants):
        ss = [s for s in summary if s["variant"] == v]
        xs = [s["turns"] + (k - len(variants) / 2) * 0.05 for s in ss]
        err = [0 if math.isnan(s["acc_ci95"]) else s["acc_ci95"] for s in ss]
        ax.errorbar(xs, [s["acc_mean"] for s in ss], yerr=err, marker="o", capsize=3, label=v)
    ts = sorted({s["turns"] for s in summary})
    if optimum is not None:
        ax.plot(ts, [optimum(t) for t in ts], "k--", label="optimum")
    if chance is not None:
        ax.axhline(chance, color="grey", lw=0.8, ls=":", label="chance")
    ax.set_xlabel("turns T")
    ax.set_ylabel(ylabel)
    ax.set_xticks(ts)
    ax.set_title(title or "ClueProbe: advantage granularity vs episode length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
