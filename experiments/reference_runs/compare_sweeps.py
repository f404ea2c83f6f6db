"""Two ``forkyard compare`` sweeps side by side, for a change meant to move the episodes drawn but not their law.

For each (T, variant): the mean greedy accuracy of each sweep over its seeds, the difference (after - before)
with Welch's 95% interval (``scipy.stats.ttest_ind(equal_var=False)``: the seeds of the two sweeps are
independent draws, not pairs, once the sampling streams differ) and its p-value. Prints a markdown table and
how many cells' intervals hold 0; with 40 cells at the 5% level about 2 would miss by chance alone.

Usage::

    .venv/bin/python experiments/reference_runs/compare_sweeps.py BEFORE_DIR AFTER_DIR
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from pathlib import Path


def accuracies(folder: str) -> dict[tuple[int, str], list[float]]:
    """``{(T, variant): [accuracy of each seed]}`` from ``folder/results.csv``."""
    out: dict[tuple[int, str], list[float]] = defaultdict(list)
    with open(Path(folder) / "results.csv") as f:
        for row in csv.DictReader(f):
            out[(int(row["turns"]), row["variant"])].append(float(row["accuracy"]))
    return out


def main(before: str, after: str) -> int:
    from scipy import stats

    a, b = accuracies(before), accuracies(after)
    print("| T | variant | before | after | after - before (95% CI) | p |")
    print("|---|---|---|---|---|---|")
    holds = total = 0
    for key in sorted(a.keys() & b.keys()):
        x, y = a[key], b[key]
        mx, my = sum(x) / len(x), sum(y) / len(y)
        if len(set(x)) == 1 and len(set(y)) == 1:  # no spread on either side: the interval is the point itself
            lo = hi = my - mx
            p = 1.0 if mx == my else 0.0
        else:
            test = stats.ttest_ind(y, x, equal_var=False)
            lo, hi = test.confidence_interval(0.95)
            p = float(test.pvalue)
        total += 1
        holds += lo <= 0 <= hi
        print(f"| {key[0]} | {key[1]} | {mx:.3f} (n={len(x)}) | {my:.3f} (n={len(y)}) | "
              f"{my - mx:+.3f} ({lo:+.3f}, {hi:+.3f}) | {p:.2f} |")
    print(f"\n{holds} of {total} intervals hold 0")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
