"""Statistics of the pre-registered text-policy tests (docs/results/text_policy.md, sections 0 and 0a).

Reads the committed evaluation outputs:

* ``docs/results/text_policy_runs/eval_1000_seeds_*.txt``: section 1's sampled accuracy, seeds 0-4;
* ``docs/results/text_policy_runs/exact_seeds0-4.jsonl``: exact expected success of the same checkpoints;
* ``docs/results/text_policy_runs/eval_seeds5-17.jsonl``: ``forkyard eval-lm --samples 1000 --exact`` of
  section 0's runs, seeds 5-17;
* ``docs/results/text_policy_runs/eval_entropy_seeds5-17.jsonl``: the same for section 0a's
  ``tree_entropy`` arm;

prints the per-seed table (markdown) and the tests of the plan: one-sided paired t-test of ARM - traj on
the exact metric over seeds 5-17 (primary), and over 0-17 where ARM has them, the sign test and the
sampled metric (secondary); draws the per-seed figure.

Usage: .venv/bin/python scripts/text-policy-stats.py [--arm tree|tree_entropy] [--png PATH]
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
ARMS = ("traj", "tree", "tree_entropy")
EVALS = ("exact_seeds0-4.jsonl", "eval_seeds5-17.jsonl", "eval_entropy_seeds5-17.jsonl")


def _key(checkpoint: str) -> tuple[str, int] | None:
    m = re.search(r"/(traj|tree|tree_entropy)_seed(\d+)/model\.pt$", checkpoint)
    return (m[1], int(m[2])) if m else None


def load() -> dict[tuple[str, int], dict[str, float]]:
    """{(arm, seed): {"exact", "coverage", "sampled"}} for the pre-specified arms."""
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for path in sorted(glob.glob(str(RUNS / "eval_1000_seeds_*.txt"))):
        for line in open(path):
            ckpt, blob = line.split(" ", 1)
            if (k := _key(ckpt)):
                ev = json.loads(blob)
                rows.setdefault(k, {})["sampled"] = ev["sampled_accuracy"]
    for name in EVALS:
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


def paired(rows, seeds, metric, arm: str = "tree", base: str = "traj") -> dict[str, float]:
    """Paired ``arm - base`` differences over ``seeds``: mean, 95% t-interval, one-sided t and sign tests."""
    d = np.array([rows[(arm, s)][metric] - rows[(base, s)][metric] for s in seeds])
    n = len(d)
    se = d.std(ddof=1) / np.sqrt(n)
    half = stats.t.ppf(0.975, n - 1) * se
    t = stats.ttest_1samp(d, 0.0, alternative="greater")
    wins = int((d > 0).sum())
    sign = stats.binomtest(wins, int((d != 0).sum()), 0.5, alternative="greater").pvalue
    return {"n": n, "mean": d.mean(), "sd": d.std(ddof=1), "lo": d.mean() - half, "hi": d.mean() + half,
            "t": float(t.statistic), "p_t": float(t.pvalue), "wins": wins, "p_sign": float(sign)}


def curves(arms, png: str, grid_step: int = 240) -> None:
    """Mean over the committed confirmation runs (``confirm_ARM_seedS.metrics.jsonl``, seeds 5-17) of the
    training reward (trailing mean over 10 iterations) and of the held-out sampled accuracy logged during
    training (128 episodes every 25 iterations), both against env calls spent, interpolated on a grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.arange(grid_step, 14_400 + 1, grid_step)
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for name in arms:
        paths = sorted(RUNS.glob(f"confirm_{name}_seed*.metrics.jsonl"))
        rew, acc, first_eval = [], [], 0.0
        for path in paths:
            ms = [json.loads(line) for line in path.read_text().splitlines()]
            x = np.array([m["env_calls_total"] for m in ms], dtype=float)
            rewards = np.array([m["reward_mean"] for m in ms])
            trailing = np.array([rewards[max(0, i - 9): i + 1].mean() for i in range(len(rewards))])
            rew.append(np.interp(grid, x, trailing))
            ev = [(m["env_calls_total"], m["eval_sampled_accuracy"]) for m in ms if "eval_sampled_accuracy" in m]
            first_eval = max(first_eval, ev[0][0])
            acc.append(np.interp(grid, [e[0] for e in ev], [e[1] for e in ev]))
        for i, series in enumerate((rew, acc)):
            keep = grid >= (first_eval if i else 0)  # accuracy: only where every run has been evaluated once
            mean = np.mean(series, axis=0)[keep]
            se = (np.std(series, axis=0, ddof=1) / np.sqrt(len(series)))[keep]
            ax[i].plot(grid[keep], mean, label=f"{name} ({len(paths)} seeds)")
            ax[i].fill_between(grid[keep], mean - se, mean + se, alpha=0.2)
    ax[0].set_ylabel("training reward (trailing mean of 10 iterations)")
    ax[1].set_ylabel("held-out sampled accuracy (128 ep.)")
    for a in ax:
        a.set_xlabel("env calls spent")
        a.legend()
    fig.suptitle("ClueProbe T=4 text policy, RL after the skill-0.5 SFT: mean over seeds 5-17 (band: ±1 s.e.)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print("wrote", png)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arm", default="tree", choices=ARMS[1:], help="the tree arm tested against traj")
    ap.add_argument("--png", default=None)
    ap.add_argument("--curves", default=None, help="PNG of training curves vs env calls, seeds 5-17, per arm")
    args = ap.parse_args()
    rows = load()
    arm = args.arm
    pair = ("traj", arm)
    seeds = sorted({s for (a, s) in rows if all((b, s) in rows and "exact" in rows[(b, s)] for b in pair)})
    print(f"| seed | traj exact | {arm} exact | diff | traj sampled | {arm} sampled | coverage traj / {arm} |")
    print("|---|---|---|---|---|---|---|")
    for s in seeds:
        a, b = rows[("traj", s)], rows[(arm, s)]
        print(f"| {s} | {a['exact']:.3f} | {b['exact']:.3f} | {b['exact'] - a['exact']:+.3f} | "
              f"{a.get('sampled', float('nan')):.3f} | {b.get('sampled', float('nan')):.3f} | "
              f"{a['coverage']:.2f} / {b['coverage']:.2f} |")
    for name in pair:
        e = [rows[(name, s)]["exact"] for s in seeds]
        print(f"{name}: exact mean {np.mean(e):.4f} (s.d. {np.std(e, ddof=1):.4f}) over {len(e)} seeds")
    new = [s for s in seeds if s >= 5]
    tests = [("PRIMARY exact, seeds 5-17", new, "exact", "traj"), ("exact, seeds 0-17", seeds, "exact", "traj"),
             ("sampled, seeds 5-17", new, "sampled", "traj"), ("sampled, seeds 0-17", seeds, "sampled", "traj")]
    if arm != "tree":
        tests.append((f"exact, seeds 5-17, {arm} - tree", [s for s in new if ("tree", s) in rows], "exact", "tree"))
    seen = set()
    for label, ss, metric, base in tests:
        if len(ss) >= 2 and (tuple(ss), metric, base) not in seen:
            seen.add((tuple(ss), metric, base))
            r = paired(rows, ss, metric, arm, base)
            print(f"{label}: n={r['n']} mean diff {r['mean']:+.4f} (s.d. {r['sd']:.4f}), 95% CI "
                  f"({r['lo']:+.4f}, {r['hi']:+.4f}); one-sided t={r['t']:.2f} p={r['p_t']:.4f}; "
                  f"{arm} > {base} on {r['wins']}/{r['n']} (sign p={r['p_sign']:.4f})")
    if args.curves:
        curves(("traj", "tree", arm) if arm != "tree" else ("traj", "tree"), args.curves)
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for i, metric in enumerate(("exact", "sampled")):
            for name, mk in (("traj", "o"), ("tree", "s"), ("tree_entropy", "^")):
                if any((name, s) in rows for s in seeds):
                    ax[i].plot(seeds, [rows.get((name, s), {}).get(metric, np.nan) for s in seeds], mk + "-",
                               label=name, alpha=0.8)
            ax[i].axvline(4.5, color="grey", ls=":", lw=1)
            ax[i].set_xlabel("training seed (0-4: section 1; 5-17: pre-registered)")
            ax[i].set_ylabel("exact expected success (lower bound)" if metric == "exact"
                             else "sampled accuracy, 1,000 held-out seeds")
            ax[i].legend()
        fig.suptitle(f"ClueProbe T=4 text policy after SFT + RL at ~14,400 env calls: {arm} vs traj")
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print("wrote", args.png)


if __name__ == "__main__":
    main()
