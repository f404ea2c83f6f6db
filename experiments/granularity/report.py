"""The tables of docs/results/granularity.md, recomputed from the committed per-run results.

Each ``*.csv.gz`` beside this file is the ``results.csv`` of one ``forkyard compare`` run (one row per
training run: T, variant, seed, greedy accuracy, distinct probes, iterations, env calls, degeneration, wall
time), gzip-compressed; a fresh ``results.csv`` (plain) is read as well. For one file this prints:

* the summary table that ``forkyard compare`` printed (:func:`trainer.compare.markdown_table`; the
  ``docs/results/granularity/*.md`` tables);
* with ``--reference``: section 1's table, ours against the reference study's published means (:data:`REFERENCE`);
* with ``--paired``: each variant minus ``traj``, paired by seed: mean difference ± the half-width of its 95%
  Student-t interval (:func:`trainer.stats.paired_comparison`), the paired tables of sections 2 and 3;
* with ``--png PATH``: the sweep's figure, as ``forkyard compare`` draws it (:func:`trainer.plot.plot_sweep`;
  from the committed files it reproduces ``docs/results/granularity/*.png`` byte for byte with the same
  matplotlib).

Usage: .venv/bin/python experiments/granularity/report.py experiments/granularity/seeds5.csv.gz --reference
       .venv/bin/python experiments/granularity/report.py experiments/granularity/learn.csv.gz --paired \
           --png docs/results/granularity/learn.png
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
from pathlib import Path

from trainer.compare import VARIANTS, markdown_table, optimum, summarize
from trainer.stats import paired_comparison

#: The reference study's published table (a blog article on advantage granularity in multi-turn agent RL,
#: quoted in docs/results/granularity.md): T -> (optimum, traj, anchor, tree, degeneration of traj rollouts).
REFERENCE = {
    2: (0.25, 0.251, 0.257, 0.257, 0.151),
    3: (0.50, 0.451, 0.430, 0.395, 0.536),
    4: (1.00, 0.556, 0.394, 0.603, 0.709),
    5: (1.00, 0.691, 0.168, 0.778, 0.797),
}
INTS = ("turns", "seed", "iterations", "env_calls_total")


def load(path: str | Path) -> list[dict]:
    """The rows of a ``forkyard compare`` ``results.csv`` (plain, or gzip when the name ends in ``.gz``),
    numbers parsed: ``turns``, ``seed``, ``iterations``, ``env_calls_total`` as int, every other column but
    ``variant`` as float. Raises FileNotFoundError on a missing file."""
    raw = Path(path).read_bytes()
    text = gzip.decompress(raw).decode() if str(path).endswith(".gz") else raw.decode()
    rows = []
    for r in csv.DictReader(io.StringIO(text)):
        rows.append({k: v if k == "variant" else int(v) if k in INTS else float(v) for k, v in r.items()})
    return rows


def reference_table(rows: list[dict]) -> str:
    """Section 1's markdown table: per T, the mean greedy accuracy of traj, anchor and tree and the mean
    degeneration of traj's rollouts, ours / reference (:data:`REFERENCE`; T outside it are left out)."""
    summary = {(s["turns"], s["variant"]): s for s in summarize(rows)}
    lines = ["| T | optimum | traj (ours / article) | anchor (ours / article) | tree (ours / article) "
             "| degeneration, traj rollouts (ours / article) |", "|---|---|---|---|---|---|"]
    for t, (opt, *ref, degen) in sorted(REFERENCE.items()):
        if (t, "traj") not in summary:
            continue
        cells = [f"{summary[(t, v)]['acc_mean']:.3f} / {r:.3f}" if (t, v) in summary else f"n/a / {r:.3f}"
                 for v, r in zip(("traj", "anchor", "tree"), ref, strict=True)]
        ours = 100 * summary[(t, "traj")]["degeneration"]
        lines.append(f"| {t} | {opt:.2f} | {' | '.join(cells)} | {ours:.1f}% / {100 * degen:.1f}% |")
    return "\n".join(lines)


def paired_table(rows: list[dict], base: str = "traj") -> str:
    """Every variant minus ``base`` at each T, paired by seed: ``mean ± half-width`` of the two-sided 95%
    Student-t interval of the mean difference (``+0.000 ± 0.000`` where every pair is equal)."""
    acc = {(r["turns"], r["variant"], r["seed"]): r["accuracy"] for r in rows}
    turns = sorted({r["turns"] for r in rows})
    others = [v for v in VARIANTS if v != base and any(r["variant"] == v for r in rows)]
    lines = ["| T | " + " | ".join(f"{v} − {base}" for v in others) + " |", "|---" * (len(others) + 1) + "|"]
    for t in turns:
        cells = []
        for v in others:
            seeds = sorted(s for (tt, vv, s) in acc if tt == t and vv == v and (t, base, s) in acc)
            if len(seeds) < 2:
                cells.append("n/a")
                continue
            r = paired_comparison([acc[(t, v, s)] for s in seeds], [acc[(t, base, s)] for s in seeds])
            cells.append(f"{r.mean:+.3f} ± {(r.hi - r.lo) / 2:.3f}")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("results", help="a results.csv of forkyard compare, or its .csv.gz")
    ap.add_argument("--bits", type=int, default=3, help="ClueProbe target bits of the sweep (the optimum column)")
    ap.add_argument("--reference", action="store_true", help="also the table against the reference study")
    ap.add_argument("--paired", action="store_true", help="also every variant minus traj, paired by seed")
    ap.add_argument("--png", default=None, help="draw the sweep's figure to this PNG")
    args = ap.parse_args(argv)
    rows = load(args.results)
    summary = summarize(rows)
    print(markdown_table(summary, args.bits))
    if args.png:
        from trainer.plot import plot_sweep

        plot_sweep(summary, args.png, variants=tuple(VARIANTS), optimum=lambda t: optimum(t, args.bits),
                   chance=1 / 2**args.bits)
    if args.reference:
        print()
        print(reference_table(rows))
    if args.paired:
        print()
        print(paired_table(rows))


if __name__ == "__main__":
    main()
