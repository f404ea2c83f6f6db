"""The granularity study across the suite: the runs, the export of their data and the analysis of
``experiments/granularity/suite_plan.md`` (written before the first analysed run).

Subcommands::

    python experiments/granularity/suite.py run [--only NAME ...] [--workers N]
    python experiments/granularity/suite.py export
    python experiments/granularity/suite.py report [--png PATH] [--md PATH]

``run`` runs every config of :data:`CONFIGS` in order (or those named by ``--only``) as a ``forkyard compare``
sweep (:func:`trainer.compare.run_sweep`) into ``runs/granularity-suite/<name>/``. Sweeps resume: a run whose
``rows/<run>.json`` exists is not run again, so the command can be stopped at any time and started again.
``export`` writes each finished config's ``results.csv`` as ``experiments/granularity/suite/<name>.csv.gz`` (the
committed data) and its metrics files as ``<name>.metrics.jsonl.gz`` (every iteration of every run: the curves).
``report`` reads the committed files and prints the plan's tables: per config the greedy success of each
variant (mean ± 95% t-interval over seeds) and the singleton-anchor share under each key, the write-up's short
table of the comparisons it reads (:data:`KEY`), and the paired differences
of the plan's comparisons with their two-sided paired t-test p-values, Holm-adjusted over the whole family
(:func:`trainer.stats.holm`); ``--png`` draws the success-against-env-calls curves, every run drawn.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

OUT = ROOT / "runs" / "granularity-suite"
DATA = ROOT / "experiments" / "granularity" / "suite"
#: every variant each config runs (trainer/compare.py's VARIANTS), in the tables' order
VARIANTS = ("traj", "rloo", "anchor", "anchor_state", "anchor_fallback", "gigpo_state", "tree", "tree_entropy")
#: the plan's comparisons within each config: (a, b) reads "a - b"
COMPARISONS = tuple((v, "traj") for v in VARIANTS[1:]) + (("tree", "gigpo_state"), ("tree_entropy", "gigpo_state"))
#: the comparisons of the write-up's short table (docs/results/granularity.md section 4), a subset of COMPARISONS
KEY = (("tree", "traj"), ("tree_entropy", "traj"), ("gigpo_state", "traj"), ("anchor_state", "traj"),
       ("tree_entropy", "gigpo_state"))
SEEDS = 20
ALPHA = 0.05


@dataclass(frozen=True)
class Config:
    """One env setting of the study: a ``forkyard compare`` sweep of :data:`VARIANTS` x :data:`SEEDS` seeds."""

    name: str
    env: str
    env_kwargs: dict[str, Any]
    turns: int
    budget_iterations: int  # equal env calls: each run may spend budget_iterations * 16 * turns
    eval_every: int
    policy_key: str = "history"
    eval_episodes: int = 64
    note: str = ""

    def sweep(self, workers: int | None = None):
        """The :class:`trainer.compare.SweepConfig` of this config (out: ``runs/granularity-suite/<name>``)."""
        from trainer.compare import SweepConfig

        return SweepConfig(env=self.env, env_kwargs=dict(self.env_kwargs), turns=(self.turns,), variants=VARIANTS,
                           seeds=SEEDS, lr=1.0, budget_iterations=self.budget_iterations,
                           eval_episodes=self.eval_episodes, eval_every=self.eval_every,
                           policy_key=self.policy_key, workers=workers, out=str(OUT / self.name), progress=True)


#: The plan's configs, in the order they run (cheapest first).
CONFIGS = (
    Config("bandit", "forkyard/Bandit-v0", {}, 2, 300, 50,
           note="one pull: a single-turn control (every key groups the whole group; tree forks at turn 0)"),
    Config("clueprobe_T4", "forkyard/ClueProbe-v0", {}, 4, 1000, 100,
           note="8 targets, probe 3 bits then answer; the observation shows the last clue only"),
    Config("clueprobe_T5", "forkyard/ClueProbe-v0", {}, 5, 1000, 100, note="as above, one more turn"),
    Config("frozenlake4_slippery", "forkyard/FrozenLake-v0", {"map_name": "4x4", "is_slippery": True}, 20, 100, 20,
           policy_key="state", note="Gymnasium's 4x4 map on slippery ice; a Markov (state-keyed) policy"),
    Config("frozenlake8", "forkyard/FrozenLake-v0", {"map_name": "8x8", "is_slippery": False}, 20, 300, 50,
           note="Gymnasium's 8x8 map, ice that does not slip: sparse reward, 14 moves at best"),
    Config("sokoban", "forkyard/Sokoban-v0", {"n_rooms": 4}, 10, 300, 50,
           note="6x6 rooms, one box, a pool of 4 rooms"),
    Config("household", "forkyard/Household-v0", {"n_games": 8}, 10, 20, 5, eval_episodes=8,
           note="8 TextWorld games (3 rooms, 6 objects, quests of 3 actions), each played once by the evaluation"),
)


def _config(name: str) -> Config:
    for c in CONFIGS:
        if c.name == name:
            return c
    raise SystemExit(f"unknown config {name!r}; the plan's: {[c.name for c in CONFIGS]}")


def run(names: list[str], workers: int | None) -> None:
    """Run (or resume) the configs ``names`` (default: all, in order)."""
    from trainer.compare import run_sweep

    for c in [_config(n) for n in names] if names else CONFIGS:
        print(f"== {c.name}: {c.env} {json.dumps(c.env_kwargs)} T={c.turns}", flush=True)
        rows, _, out = run_sweep(c.sweep(workers))
        print(f"== {c.name}: {len(rows)} runs in {out}", flush=True)


def export() -> None:
    """Write every finished config's data under ``experiments/granularity/suite/`` (gzip, reproducible bytes)."""
    DATA.mkdir(parents=True, exist_ok=True)
    for c in CONFIGS:
        out = OUT / c.name
        if not (out / "results.csv").exists() or len(list((out / "rows").glob("*.json"))) < SEEDS * len(VARIANTS):
            print(f"{c.name}: not finished, left out")
            continue
        (DATA / f"{c.name}.csv.gz").write_bytes(gzip.compress(_with_state_share(out), 9, mtime=0))
        lines = []
        for path in sorted((out / "metrics").glob("*.jsonl")):
            spent = 0  # env calls of the run up to and including this iteration
            for line in path.read_text().splitlines():
                m = json.loads(line)
                spent += m.get("env_calls", 0)
                evals = {k: v for k, v in m.items() if k.startswith("eval_")}
                if evals:
                    lines.append(json.dumps({"run": path.stem, "iteration": m.get("iteration"),
                                             "env_calls_so_far": spent, **evals}))
        (DATA / f"{c.name}.metrics.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), 9,
                                                                          mtime=0))
        print(f"{c.name}: wrote {DATA / (c.name + '.csv.gz')} and its metrics")


def _with_state_share(out: Path) -> bytes:
    """``out/results.csv``, with a ``degeneration_state`` column computed from the runs' metrics files where the
    sweep did not write one (``forkyard compare`` wrote it only for envs other than ClueProbe before 2026-12-02):
    the mean over iterations of each iteration's singleton share under the state key, as compare computes it."""
    rows = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    if rows and "degeneration_state" not in rows[0]:
        for r in rows:
            ms = [json.loads(x) for x in (out / "metrics" / f"T{r['turns']}_{r['variant']}_s{r['seed']}.jsonl")
                  .read_text().splitlines()]
            r["degeneration_state"] = repr(sum(m.get("degeneration_state", math.nan) for m in ms) / len(ms))
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\r\n")
    w.writeheader()
    w.writerows(rows)
    return text.getvalue().encode()


def load(name: str) -> list[dict]:
    """The committed rows of config ``name`` (numbers parsed), or [] when it has no data yet."""
    path = DATA / f"{name}.csv.gz"
    if not path.exists():
        return []
    rows = []
    for r in csv.DictReader(io.StringIO(gzip.decompress(path.read_bytes()).decode())):
        rows.append({k: v if k == "variant" else float(v) for k, v in r.items()})
    return rows


def _by(rows: list[dict], variant: str) -> list[float]:
    return [r["accuracy"] for r in sorted((r for r in rows if r["variant"] == variant), key=lambda r: r["seed"])]


def report(md_path: str | None, png: str | None) -> str:
    """The study's tables (markdown): success per config and variant, and the family of paired comparisons."""
    from trainer.stats import holm, mean_ci, paired_comparison, paired_p_two_sided

    done = [(c, load(c.name)) for c in CONFIGS]
    done = [(c, rows) for c, rows in done if rows]
    out = ["| config | " + " | ".join(VARIANTS) + " | singleton anchors (traj rollouts): history / state |",
           "|---|" + "---|" * len(VARIANTS) + "---|"]
    for c, rows in done:
        cells = []
        for v in VARIANTS:
            mean, half = mean_ci(_by(rows, v))
            cells.append(f"{mean:.3f} ± {half:.3f}")
        traj = [r for r in rows if r["variant"] == "traj"]
        hist = sum(r["degeneration"] for r in traj) / len(traj)
        state = sum(r["degeneration_state"] for r in traj) / len(traj) if "degeneration_state" in traj[0] else math.nan
        state_cell = "n/a" if math.isnan(state) else f"{100 * state:.0f}%"
        out.append(f"| {c.name} | " + " | ".join(cells) + f" | {100 * hist:.0f}% / {state_cell} |")
    tests = []
    for c, rows in done:
        for a, b in COMPARISONS:
            xa, xb = _by(rows, a), _by(rows, b)
            pc = paired_comparison(xa, xb)
            tests.append((c.name, a, b, pc, paired_p_two_sided(xa, xb)))
    adjusted = holm([t[4] for t in tests]) if tests else []
    cell = {(name, a, b): (pc, q) for (name, a, b, pc, _), q in zip(tests, adjusted, strict=True)}
    out += ["", "| config | " + " | ".join(f"{a} − {b}" for a, b in KEY) + " |", "|---|" + "---|" * len(KEY)]
    for c, _ in done:
        cells = []
        for a, b in KEY:
            pc, q = cell[(c.name, a, b)]
            mark = "**" if q <= ALPHA else ""
            cells.append(f"{mark}{pc.mean:+.3f}{mark} ({pc.lo:+.3f}, {pc.hi:+.3f})")
        out.append(f"| {c.name} | " + " | ".join(cells) + " |")
    out += ["", f"Paired differences over {SEEDS} seeds (mean, 95% t-interval; two-sided paired t-test p, "
            f"Holm-adjusted over all {len(tests)} tests of the family; **bold**: adjusted p <= {ALPHA}):", "",
            "| config | comparison | mean difference | 95% interval | p | Holm p | wins / ties / losses |",
            "|---|---|---|---|---|---|---|"]
    for (name, a, b, pc, p), q in zip(tests, adjusted, strict=True):
        mark = "**" if q <= ALPHA else ""
        losses = pc.n - pc.wins - pc.ties
        out.append(f"| {name} | {a} − {b} | {mark}{pc.mean:+.3f}{mark} | ({pc.lo:+.3f}, {pc.hi:+.3f}) | {p:.3g} | "
                   f"{q:.3g} | {pc.wins} / {pc.ties} / {losses} |")
    text = "\n".join(out)
    if md_path:
        Path(md_path).write_text(text + "\n")
    if png:
        curves(done, png)
    return text


def curves(done: list[tuple[Config, list[dict]]], png: str) -> None:
    """Greedy success against env calls, one panel per config, every run drawn (thin) with each variant's mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(done))
    rows = -(-len(done) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.4 * rows), squeeze=False)
    colors = {v: f"C{i}" for i, v in enumerate(VARIANTS)}
    for ax in axes.flat[len(done):]:
        ax.axis("off")
    for ax, (c, _) in zip(axes.flat, done, strict=False):  # the grid may have spare panels
        path = DATA / f"{c.name}.metrics.jsonl.gz"
        if not path.exists():
            continue
        runs: dict[str, list[tuple[float, float]]] = {}
        for line in gzip.decompress(path.read_bytes()).decode().splitlines():
            m = json.loads(line)
            score = m.get("eval_success", m.get("eval_accuracy"))
            runs.setdefault(m["run"], []).append((m["env_calls_so_far"], score))
        for run_name, pts in runs.items():
            variant = run_name.split("_", 1)[1].rsplit("_s", 1)[0]
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, color=colors.get(variant, "k"), lw=0.4, alpha=0.3)
        width = max((x for ps in runs.values() for x, _ in ps), default=1.0) / 10 or 1.0
        for v in VARIANTS:
            pts = [p for r, ps in runs.items() if r.split("_", 1)[1].rsplit("_s", 1)[0] == v for p in ps]
            if pts:
                grid: dict[float, list[float]] = {}
                for x, y in pts:  # the mean of the variant's evaluations in each tenth of the env-call axis
                    grid.setdefault((int(x // width) + 0.5) * width, []).append(y)
                xs = sorted(grid)
                ax.plot(xs, [sum(grid[x]) / len(grid[x]) for x in xs], color=colors[v], lw=1.5, label=v)
        ax.set_title(c.name, fontsize=9)
        ax.set_xlabel("env calls")
    for row in axes:
        row[0].set_ylabel("greedy success")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--only", nargs="*", default=[])
    r.add_argument("--workers", type=int, default=None)
    sub.add_parser("export")
    rep = sub.add_parser("report")
    rep.add_argument("--md", default=None)
    rep.add_argument("--png", default=None)
    args = p.parse_args(argv)
    if args.cmd == "run":
        run(args.only, args.workers)
    elif args.cmd == "export":
        export()
    else:
        print(report(args.md, args.png))


if __name__ == "__main__":
    main()
