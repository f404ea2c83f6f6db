"""``forkyard plot RUN_DIR``: the stability curves of a run (``RUN_DIR/metrics.jsonl``) in one PNG.

One panel per monitored metric (:data:`trainer.monitors.MONITORED`, plus the periodic evaluation
accuracies when present), x axis = iteration. ``compare`` draws more runs on the same axes (for
example the tree-fork run and the trajectory-level run of the same budget). Iterations where the
Echo-Trap detector fired are marked with a vertical red line.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.monitors import MONITORED

EVAL_KEYS = ("eval_greedy_accuracy", "eval_sampled_accuracy")


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of ``RUN_DIR/metrics.jsonl``. Raises FileNotFoundError if it is missing."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_run(run_dir: str | Path, out: str | Path | None = None, compare: tuple | list = ()) -> str:
    """Draw the curves of ``run_dir`` (and of each run in ``compare``) to ``out`` (default
    ``RUN_DIR/curves.png``). Returns the PNG path. Raises FileNotFoundError / ValueError on a missing or
    empty metrics file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
