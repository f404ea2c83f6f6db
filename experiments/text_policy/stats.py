"""Statistics of the pre-registered text-policy tests (docs/results/text_policy.md, sections 0 and 0a).

Reads the committed evaluation outputs in ``experiments/text_policy/data/`` (gzip-compressed; ``--data``
names another folder, for example fresh outputs of ``seeds.sh``, where plain files are read as well):

* ``eval_1000_seeds_*.txt.gz``: section 1's sampled accuracy, seeds 0-4;
* ``exact_seeds0-4.jsonl.gz``: exact expected success of the same checkpoints;
* ``eval_seeds5-17.jsonl.gz``: ``forkyard eval-lm --samples 1000 --exact`` of section 0's runs, seeds 5-17;
* ``eval_entropy_seeds5-17.jsonl.gz``: the same for section 0a's ``tree_entropy`` arm;

prints the per-seed table (markdown) and the tests of the plan: one-sided paired t-test of ARM - traj on
the exact metric over seeds 5-17 (primary), and over 0-17 where ARM has them, the sign test and the
sampled metric (secondary); draws the per-seed figure. The tests are :func:`trainer.stats.paired_comparison`'s
(its docstring names them and their assumptions); the figures are drawn by ``plots.py`` beside this file.

With ``--parity`` it reports section 0b instead: ``data/parity/eval.jsonl.gz`` (the same evaluation of the
Hugging Face Llama's runs, ``parity/{arm}_seed{s}.metrics.jsonl.gz`` their metrics, ``parity/eval_sft.jsonl.gz``
both SFT checkpoints), the pre-registered test of tree_entropy - traj on the Llama, and each Llama arm against
forkyard's transformer on the same seeds (section 0a's committed runs).

Usage: .venv/bin/python experiments/text_policy/stats.py [--arm tree|tree_entropy] [--png PATH] [--curves PATH]
       .venv/bin/python experiments/text_policy/stats.py --parity [--png PATH] [--curves PATH]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # plots.py, whichever the working directory

from plots import plot_budget_curves, plot_per_seed  # noqa: E402

from trainer.stats import Paired, paired_comparison, sample_sd  # noqa: E402

#: the committed outputs (a module global: ``--data`` replaces it)
RUNS = HERE / "data"
ARMS = ("traj", "tree", "tree_entropy")
EVALS = ("exact_seeds0-4.jsonl", "eval_seeds5-17.jsonl", "eval_entropy_seeds5-17.jsonl")


def lines(path: Path) -> list[str]:
    """The text lines of ``path``, read through gzip when its name ends in ``.gz``."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return f.read().splitlines()


def files(pattern: str) -> list[Path]:
    """The files under :data:`RUNS` matching ``pattern`` (a glob without ``.gz``), compressed or not, sorted
    by name; a name present both ways counts once (the compressed file)."""
    found = {p.name.removesuffix(".gz"): p for p in sorted(RUNS.glob(pattern))}
    found.update({p.name.removesuffix(".gz"): p for p in sorted(RUNS.glob(pattern + ".gz"))})
    return [found[name] for name in sorted(found)]


def one(name: str) -> Path:
    """The file ``name`` under :data:`RUNS`, compressed or not. Raises FileNotFoundError when neither exists."""
    found = files(name)
    if not found:
        raise FileNotFoundError(f"neither {RUNS / name} nor {RUNS / name}.gz exists")
    return found[0]


def rows_of(path: Path) -> list[dict]:
    """The JSON lines of ``path`` (gzip or plain)."""
    return [json.loads(line) for line in lines(path) if line.strip()]


def _key(checkpoint: str) -> tuple[str, int] | None:
    m = re.search(r"/(traj|tree|tree_entropy)_seed(\d+)/model\.pt$", checkpoint)
    return (m[1], int(m[2])) if m else None


def load() -> dict[tuple[str, int], dict[str, float]]:
    """{(arm, seed): {"exact", "coverage", "sampled"}} for the pre-specified arms."""
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for path in files("eval_1000_seeds_*.txt"):
        for line in lines(path):
            ckpt, blob = line.split(" ", 1)
            if (k := _key(ckpt)):
                ev = json.loads(blob)
                rows.setdefault(k, {})["sampled"] = ev["sampled_accuracy"]
    for path in (p for name in EVALS for p in files(name)):  # a missing one is skipped
        for ev in rows_of(path):
            if (k := _key(ev["checkpoint"])):
                row = rows.setdefault(k, {})
                row.update(exact=ev["exact_success"], coverage=ev["exact_coverage"])
                if "sampled_accuracy" in ev:
                    row["sampled"] = ev["sampled_accuracy"]
    return rows


def paired(rows, seeds, metric, arm: str = "tree", base: str = "traj") -> Paired:
    """Paired ``arm - base`` differences of ``metric`` over ``seeds``: mean, 95% t-interval, one-sided paired
    t-test and sign test (:func:`trainer.stats.paired_comparison`)."""
    return paired_comparison([rows[(arm, s)][metric] for s in seeds], [rows[(base, s)][metric] for s in seeds])


def curves(arms, png: str, grid_step: int = 240) -> None:
    """Mean over the committed confirmation runs (``confirm_ARM_seedS.metrics.jsonl``, seeds 5-17) of the
    training reward (trailing mean over 10 iterations) and of the held-out sampled accuracy logged during
    training (128 episodes every 25 iterations), both against env calls spent, interpolated on a grid
    (``plots.plot_budget_curves``)."""
    runs = {name: [rows_of(path) for path in files(f"confirm_{name}_seed*.metrics.jsonl")] for name in arms}
    plot_budget_curves(
        runs, png, budget=14_400, grid_step=grid_step, trailing=10, eval_key="eval_sampled_accuracy",
        ylabels=("training reward (trailing mean of 10 iterations)", "held-out sampled accuracy (128 ep.)"),
        title="ClueProbe T=4 text policy, RL after the skill-0.5 SFT: mean over seeds 5-17 (band: ±1 s.e.)")
    print("wrote", png)


def _print_test(label: str, r: Paired, arm: str, base: str) -> None:
    print(f"{label}: n={r.n} mean diff {r.mean:+.4f} (s.d. {r.sd:.4f}), 95% CI ({r.lo:+.4f}, {r.hi:+.4f}); "
          f"one-sided t={r.t:.2f} p={r.p_t:.4f}; {arm} > {base} on {r.wins}/{r.n} (sign p={r.p_sign:.4f})")


def parity(args) -> None:
    """Section 0b: the Llama runs' table and tests (module docstring)."""
    own = load()
    hf: dict[tuple[str, int], dict[str, float]] = {}
    for ev in rows_of(one("parity/eval.jsonl")):
        m = re.search(r"/(traj|tree_entropy)_seed(\d+)/model$", ev["checkpoint"])
        hf[(m[1], int(m[2]))] = {"exact": ev["exact_success"], "coverage": ev["exact_coverage"],
                                 "sampled": ev["sampled_accuracy"], "greedy": ev["greedy_accuracy"],
                                 "probes": ev["sampled_distinct_probes"], "invalid": ev["sampled_invalid_share"]}
    for ev in rows_of(one("parity/eval_sft.jsonl")):
        print(f"SFT {ev['checkpoint']}: exact {ev['exact_success']:.4f} (coverage {ev['exact_coverage']:.3f}), "
              f"sampled {ev['sampled_accuracy']:.3f}, greedy {ev['greedy_accuracy']:.3f}, "
              f"invalid {ev['sampled_invalid_share']:.3f}")
    seeds = sorted(s for (a, s) in hf if a == "traj" and ("tree_entropy", s) in hf)
    print("| seed | Llama traj | Llama tree_entropy | difference | forkyard traj | forkyard tree_entropy |")
    print("|---|---|---|---|---|---|")
    for s in seeds:
        a, b = hf[("traj", s)], hf[("tree_entropy", s)]
        print(f"| {s} | {a['exact']:.3f} | {b['exact']:.3f} | {b['exact'] - a['exact']:+.3f} | "
              f"{own[('traj', s)]['exact']:.3f} | {own[('tree_entropy', s)]['exact']:.3f} |")
    for name in ("traj", "tree_entropy"):
        for k in ("exact", "sampled", "greedy", "probes", "invalid", "coverage"):
            v = [hf[(name, s)][k] for s in seeds]
            print(f"Llama {name} {k}: mean {np.mean(v):.4f} (s.d. {sample_sd(v):.4f})")
        print(f"forkyard {name} exact on these seeds: {np.mean([own[(name, s)]['exact'] for s in seeds]):.4f}")
    _print_test(f"PRIMARY Llama exact, seeds {seeds[0]}-{seeds[-1]}", paired(hf, seeds, "exact", "tree_entropy"),
                "tree_entropy", "traj")
    _print_test("Llama sampled", paired(hf, seeds, "sampled", "tree_entropy"), "tree_entropy", "traj")
    for name in ("traj", "tree_entropy"):
        r = paired_comparison([hf[(name, s)]["exact"] for s in seeds], [own[(name, s)]["exact"] for s in seeds])
        _print_test(f"{name}: Llama - forkyard transformer, exact", r, "Llama", "forkyard")
    if args.curves:
        def metrics(pattern: str) -> list[list[dict]]:
            return [rows_of(path) for path in files(pattern) if int(re.search(r"seed(\d+)", path.name)[1]) in seeds]
        plot_budget_curves(
            {"Llama traj": metrics("parity/traj_seed*.metrics.jsonl"),
             "Llama tree_entropy": metrics("parity/tree_entropy_seed*.metrics.jsonl"),
             "forkyard traj": metrics("confirm_traj_seed*.metrics.jsonl"),
             "forkyard tree_entropy": metrics("confirm_tree_entropy_seed*.metrics.jsonl")},
            args.curves, budget=14_400, grid_step=240, trailing=10, eval_key="eval_sampled_accuracy",
            ylabels=("training reward (trailing mean of 10 iterations)", "held-out sampled accuracy (128 ep.)"),
            title="ClueProbe T=4: transformers Llama vs forkyard's transformer, same size and seeds (±1 s.e.)")
        print("wrote", args.curves)
    if args.png:
        rows = {**{(f"Llama {a}", s): v for (a, s), v in hf.items()},
                **{(f"forkyard {a}", s): v for (a, s), v in own.items() if a != "tree"}}
        plot_per_seed(rows, seeds, args.png,
                      arms=(("Llama traj", "o"), ("Llama tree_entropy", "^"), ("forkyard traj", "x"),
                            ("forkyard tree_entropy", "v")),
                      panels=(("exact", "exact expected success (lower bound)"),
                              ("sampled", "sampled accuracy, 1,000 held-out seeds")),
                      xlabel="training seed", title="Section 0b: the 0a test on the transformers Llama")
        print("wrote", args.png)


def main(argv: list[str] | None = None) -> None:
    """The command line (module docstring); ``argv`` defaults to ``sys.argv[1:]``."""
    global RUNS
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--arm", default="tree", choices=ARMS[1:], help="the tree arm tested against traj")
    ap.add_argument("--png", default=None)
    ap.add_argument("--curves", default=None, help="PNG of training curves vs env calls, seeds 5-17, per arm")
    ap.add_argument("--parity", action="store_true", help="section 0b (module docstring)")
    ap.add_argument("--data", type=Path, default=RUNS, help="folder of the evaluation outputs and metrics")
    args = ap.parse_args(argv)
    RUNS = args.data
    if args.parity:
        return parity(args)
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
        print(f"{name}: exact mean {np.mean(e):.4f} (s.d. {sample_sd(e):.4f}) over {len(e)} seeds")
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
            print(f"{label}: n={r.n} mean diff {r.mean:+.4f} (s.d. {r.sd:.4f}), 95% CI "
                  f"({r.lo:+.4f}, {r.hi:+.4f}); one-sided t={r.t:.2f} p={r.p_t:.4f}; "
                  f"{arm} > {base} on {r.wins}/{r.n} (sign p={r.p_sign:.4f})")
    if args.curves:
        curves(("traj", "tree", arm) if arm != "tree" else ("traj", "tree"), args.curves)
    if args.png:
        plot_per_seed(
            rows, seeds, args.png, arms=(("traj", "o"), ("tree", "s"), ("tree_entropy", "^")),
            panels=(("exact", "exact expected success (lower bound)"),
                    ("sampled", "sampled accuracy, 1,000 held-out seeds")),
            split_at=4.5, xlabel="training seed (0-4: section 1; 5-17: pre-registered)",
            title=f"ClueProbe T=4 text policy after SFT + RL at ~14,400 env calls: {arm} vs traj")
        print("wrote", args.png)


if __name__ == "__main__":
    main()
