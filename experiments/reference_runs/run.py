"""Reference runs before and after a restructuring, in one run on one machine: do behaviour and figures stay put?

Each reference command runs in a git worktree of the ``--before`` revision and one of the ``--after`` revision
(default: the working tree), with the same interpreter (the project's .venv), each in a fresh folder. Their
records are then compared: ``metrics.jsonl`` row by row, ``summary.json``'s evaluation, ``forkyard compare``'s
``results.csv`` and the JSON a command prints, leaving out wall-clock fields (``wall_s`` and friends). Numbers
must agree to ``--rtol`` (default 1e-6: float32 sums reordered by batching), everything else exactly.

Usage (from the repository root)::

    .venv/bin/python experiments/reference_runs/run.py --before 23a8044 --out runs/reference

Prints one line per command (same / differs, with the first difference) and writes ``report.md`` to ``--out``.
Exit status 1 when a command differs where it should not.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Fields whose values are clocks (never compared).
CLOCKS = {"wall_s", "seconds", "tokens_per_s", "steps_per_s"}

#: (name, arguments of `python -m trainer.cli`, what to compare). Both revisions take these spellings (the
#: turn budget's old flag ``--turns`` is an alias after the rename).
TINY_LM = ["--vocab", "300", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--context", "256"]
COMMANDS: list[tuple[str, list[str], str]] = [
    ("tabular tree T=3", ["train", "--turns", "3", "--estimator", "tree", "--iterations", "25", "--seed", "1",
                          "--device", "cpu", "--run-dir", "{out}"], "run"),
    ("tabular traj T=4", ["train", "--turns", "4", "--estimator", "traj", "--iterations", "25", "--seed", "2",
                          "--device", "cpu", "--run-dir", "{out}"], "run"),
    ("tabular gigpo T=5", ["train", "--turns", "5", "--estimator", "gigpo", "--iterations", "25", "--seed", "3",
                           "--device", "cpu", "--run-dir", "{out}"], "run"),
    ("compare sweep", ["compare", "--turns", "2", "3", "--seeds", "1", "--iterations", "15", "--workers", "1",
                       "--out", "{out}"], "compare"),
    ("text policy sft", ["sft", "--turns", "2", *TINY_LM, "--sft-steps", "20", "--sft-batch", "8", "--device", "cpu",
                         "--threads", "1", "--run-dir", "{out}"], "sft"),
    ("text policy RL (serial sampler)", ["train-lm", "--turns", "2", *TINY_LM, "--n-base", "3",
                                               "--branches", "2", "--iterations", "4", "--eval-every", "0",
                                               "--eval-samples", "16", "--max-new-tokens", "6", "--device", "cpu",
                                               "--threads", "1", "--run-dir", "{out}"], "run"),
]
#: Extra arguments for a command on a revision that knows them (marker text in a file the glob names; the
#: text policy's config moved between revisions): the serial sampler, the only one a revision before the
#: batched engine has.
EXTRA = {"text policy RL (serial sampler)": (["--sampler", "serial"], "trainer/**/text_config.py", "sampler")}


def extra_args(name: str, tree: Path) -> list[str]:
    """:data:`EXTRA`'s arguments of ``name`` when ``tree``'s code knows them, else none."""
    args, pattern, marker = EXTRA.get(name, ([], "", ""))
    return args if args and any(marker in p.read_text() for p in tree.glob(pattern)) else []


def worktree(rev: str, where: Path) -> Path:
    """A detached git worktree of ``rev`` at ``where`` (replaced if there)."""
    if where.exists():
        subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=ROOT, check=False)
        shutil.rmtree(where, ignore_errors=True)
    subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    return where


def run(tree: Path, args: list[str], out: Path) -> tuple[str, float]:
    """``python -m trainer.cli ARGS`` with ``tree``'s code first on the path; returns (stdout, seconds)."""
    argv = [a.replace("{out}", str(out)) for a in args]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0", "TQDM_DISABLE": "1"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainer.cli", *argv], cwd=tree, env=env, text=True,
                          capture_output=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} in {tree}: status {done.returncode}\n{done.stderr[-2000:]}")
    return done.stdout, time.perf_counter() - t0


def same(a, b, rtol: float, where: str = "") -> str | None:
    """None when ``a`` and ``b`` agree (numbers within ``rtol``, clock fields skipped), else where they differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in CLOCKS:
                continue
            if k not in a or k not in b:
                return f"{where}.{k}: only in {'after' if k in b else 'before'}"
            d = same(a[k], b[k], rtol, f"{where}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items before, {len(b)} after"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            d = same(x, y, rtol, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if math.isclose(a, b, rel_tol=rtol, abs_tol=rtol) or (math.isnan(a) and math.isnan(b)):
            return None
        return f"{where}: {a!r} before, {b!r} after"
    return None if a == b else f"{where}: {a!r} before, {b!r} after"


def records(kind: str, out: Path, stdout: str):
    """What a command's run is compared on (module docstring)."""
    if kind == "run":  # a list, so the first difference reported is the earliest iteration's
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [*rows, json.loads((out / "summary.json").read_text())["evaluation"]]
    if kind == "compare":
        def number(v: str):
            try:
                return float(v)
            except ValueError:
                return v
        with open(out / "results.csv") as f:
            return [{k: number(v) for k, v in row.items()} for row in csv.DictReader(f)]
    if kind == "sft":
        rows = [json.loads(line) for line in (out / "sft_metrics.jsonl").read_text().splitlines()]
        return [*rows, json.loads((out / "sft_summary.json").read_text())["evaluation"]]
    raise ValueError(kind)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="git revision of the reference (before the change)")
    ap.add_argument("--after", default=None, help="git revision after (default: the working tree)")
    ap.add_argument("--out", default="runs/reference", help="folder for the runs and report.md")
    ap.add_argument("--rtol", type=float, default=1e-6, help="relative (and absolute) tolerance on numbers")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    before = worktree(args.before, out / "before-tree")
    after = worktree(args.after, out / "after-tree") if args.after else ROOT
    lines = [f"# Reference runs: {args.before} against {args.after or 'the working tree'}", "",
             f"Command: `{' '.join(sys.argv)}`; numbers compared to rtol {args.rtol}, clocks left out.", "",
             "| run | before s | after s | result |", "|---|---|---|---|"]
    failed = False
    try:
        for name, argv, kind in COMMANDS:
            slug = name.split(" (")[0].replace(" ", "-").replace("=", "")
            got = {}
            secs = {}
            for side, tree in (("before", before), ("after", after)):
                folder = out / side / slug
                stdout, secs[side] = run(tree, argv + extra_args(name, tree), folder)
                got[side] = records(kind, folder, stdout)
            diff = same(got["before"], got["after"], args.rtol)
            failed |= diff is not None
            verdict = "same" if diff is None else f"differs: {diff}"
            print(f"{name}: {verdict}  ({secs['before']:.1f} s / {secs['after']:.1f} s)", flush=True)
            lines.append(f"| {name} | {secs['before']:.1f} | {secs['after']:.1f} | {verdict} |")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT, check=False)
        if args.after:
            subprocess.run(["git", "worktree", "remove", "--force", str(after)], cwd=ROOT, check=False)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
