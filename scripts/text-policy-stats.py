"""Statistics of the pre-registered text-policy confirmation (docs/results/text_policy.md, section 0).

Reads the committed evaluation outputs:

* ``docs/results/text_policy_runs/eval_1000_seeds_*.txt``: section 1's sampled accuracy, seeds 0-4;
* ``docs/results/text_policy_runs/exact_seeds0-4.jsonl``: exact expected success of the same checkpoints;
* ``docs/results/text_policy_runs/eval_seeds5-17.jsonl``: ``forkyard eval-lm --samples 1000 --exact`` of
  the new runs, seeds 5-17;

prints the per-seed table (markdown) and the tests of the plan: one-sided paired t-test of tree - traj on
the exact metric over seeds 5-17 (primary), and over 0-17, the sign test and the sampled metric
(secondary); draws the per-seed figure.

Usage: .venv/bin/python scripts/text-policy-stats.py [--png PATH]
"""

from __future__ import annotations

import argparse
import glob
import json
import re
from pathlib import Path

import numpy as np
from scipy import stats

RUNS = Path("docs/results/text_policy_runs")
ARMS = ("traj", "tree")


def _key(checkpoint: str) -> tuple[str, int] | None:
    m = re.search(r"/(traj|tree)_seed(\d+)/model\.pt$", checkpoint)
    return (m[1], int(m[2])) if m else None


def load() -> dict[tuple[str, int], dict[str, float]]:
    """{(arm, seed): {"exact", "coverage", "sampled"}} for the two pre-specified arms."""
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for path in sorted(glob.glob(str(RUNS / "eval_1000_seeds_*.txt"))):
        for line in open(path):
            ckpt, blob = line.split(" ", 1)
            if (k := _key(ckpt)):
                ev = json.loads(blob)
                rows.setdefault(k, {})["sampled"] = ev["sampled_accuracy"]
    for name in ("exact_seeds0-4.jsonl", "eval_seeds5-17.jsonl"):
        if not (RUNS / name).exists():
            continue
        for line in open(RUNS / name):
            ev = json.loads(line)
            if (k := _key(ev["checkpoint"])):
                row = rows.setdefault(k, {})
                row.update(exact=ev["exact_success"], coverage=ev["exact_coverage"])
                if "sampled_accuracy" in ev:
                    row["sampled"] = ev["sampled_accuracy"]
    return rows


def paired(rows, seeds, metric) -> dict[str, float]:
    """Paired tree - traj differences over ``seeds``: mean, 95% t-interval, one-sided t and sign tests."""
    d = np.array([rows[("tree", s)][metric] - rows[("traj", s)][metric] for s in seeds])
    n = len(d)
    se = d.std(ddof=1) / np.sqrt(n)
    half = stats.t.ppf(0.975, n - 1) * se
    t = stats.ttest_1samp(d, 0.0, alternative="greater")
    wins = int((d > 0).sum())
    sign = stats.binomtest(wins, int((d != 0).sum()), 0.5, alternative="greater").pvalue
    return {"n": n, "mean": d.mean(), "sd": d.std(ddof=1), "lo": d.mean() - half, "hi": d.mean() + half,
            "t": float(t.statistic), "p_t": float(t.pvalue), "wins": wins, "p_sign": float(sign)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--png", default=None)
    args = ap.parse_args()
    rows = load()
    seeds = sorted({s for (a, s) in rows if all((b, s) in rows and "exact" in rows[(b, s)] for b in ARMS)})
    print("| seed | traj exact | tree exact | diff | traj sampled | tree sampled | coverage traj / tree |")
    print("|---|---|---|---|---|---|---|")
    for s in seeds:
        a, b = rows[("traj", s)], rows[("tree", s)]
        print(f"| {s} | {a['exact']:.3f} | {b['exact']:.3f} | {b['exact'] - a['exact']:+.3f} | "
              f"{a.get('sampled', float('nan')):.3f} | {b.get('sampled', float('nan')):.3f} | "
              f"{a['coverage']:.2f} / {b['coverage']:.2f} |")
    for arm in ARMS:
        e = [rows[(arm, s)]["exact"] for s in seeds]
        print(f"{arm}: exact mean {np.mean(e):.4f} (s.d. {np.std(e, ddof=1):.4f}) over {len(e)} seeds")
    new = [s for s in seeds if s >= 5]
    for label, ss, metric in (("PRIMARY exact, seeds 5-17", new, "exact"), ("exact, seeds 0-17", seeds, "exact"),
                              ("sampled, seeds 5-17", new, "sampled"), ("sampled, seeds 0-17", seeds, "sampled")):
        if len(ss) >= 2:
            r = paired(rows, ss, metric)
            print(f"{label}: n={r['n']} mean diff {r['mean']:+.4f} (s.d. {r['sd']:.4f}), 95% CI "
                  f"({r['lo']:+.4f}, {r['hi']:+.4f}); one-sided t={r['t']:.2f} p={r['p_t']:.4f}; "
                  f"tree > traj on {r['wins']}/{r['n']} (sign p={r['p_sign']:.4f})")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for i, metric in enumerate(("exact", "sampled")):
            for arm, mk in (("traj", "o"), ("tree", "s")):
                ax[i].plot(seeds, [rows[(arm, s)].get(metric, np.nan) for s in seeds], mk + "-", label=arm, alpha=0.8)
            ax[i].axvline(4.5, color="grey", ls=":", lw=1)
            ax[i].set_xlabel("training seed (0-4: section 1; 5-17: pre-registered)")
            ax[i].set_ylabel("exact expected success (lower bound)" if metric == "exact"
                             else "sampled accuracy, 1,000 held-out seeds")
            ax[i].legend()
        fig.suptitle("ClueProbe T=4 text policy after SFT + RL at ~14,400 env calls: tree forks vs traj")
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print("wrote", args.png)


if __name__ == "__main__":
    main()
