"""The studies' committed raw data (experiments/, gzip) still give the figures their write-ups publish.

Each study's script is run on its committed files: the granularity sweeps' tables (docs/results/granularity/*.md
byte for byte, the reference comparison and the paired differences of docs/results/granularity.md), the
FileQA table's per-iteration rows (docs/results/fileqa.md) and the pre-registered text-policy tests
(docs/results/text_policy.md, sections 0, 0a and 0b).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"


def _module(path: Path):
    """The study script at ``path`` as a module (experiments/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"study_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass of the script looks its module up there
    spec.loader.exec_module(module)
    return module


def test_docs_results_holds_no_raw_data():
    raw = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*")
                 if p.suffix in (".jsonl", ".csv", ".gz", ".txt"))
    assert raw == []


@pytest.mark.parametrize("name", ["seeds5", "seeds50", "learn"])
def test_granularity_tables_from_the_committed_runs(name):
    from trainer.compare import markdown_table, summarize

    report = _module(EXPERIMENTS / "granularity" / "report.py")
    rows = report.load(EXPERIMENTS / "granularity" / f"{name}.csv.gz")
    assert len(rows) == {"seeds5": 100, "seeds50": 600, "learn": 150}[name]
    assert markdown_table(summarize(rows)) + "\n" == (ROOT / "docs/results/granularity" / f"{name}.md").read_text()


def test_granularity_reference_and_paired_tables():
    report = _module(EXPERIMENTS / "granularity" / "report.py")
    seeds5 = report.reference_table(report.load(EXPERIMENTS / "granularity" / "seeds5.csv.gz"))
    assert "| 5 | 1.00 | 0.550 / 0.691 | 0.175 / 0.168 | 0.750 / 0.778 | 79.7% / 79.7% |" in seeds5
    seeds50 = report.paired_table(report.load(EXPERIMENTS / "granularity" / "seeds50.csv.gz"))
    assert "| 5 | -0.512 ± 0.045 | +0.003 ± 0.059 |" in seeds50
    learn = report.paired_table(report.load(EXPERIMENTS / "granularity" / "learn.csv.gz")).splitlines()
    assert learn[0] == "| T | anchor − traj | tree − traj | anchor_fallback − traj | tree_entropy − traj |"
    assert learn[3] == "| 4 | -0.150 ± 0.082 | +0.188 ± 0.135 | -0.062 ± 0.113 | +0.175 ± 0.147 |"


def test_fileqa_rows_from_the_committed_metrics():
    report = _module(EXPERIMENTS / "fileqa" / "report.py")
    got = {}
    for backend in ("docker", "local"):
        s = report.summary(report.load(EXPERIMENTS / "fileqa" / f"{backend}-metrics.jsonl.gz"))
        got[backend] = (s["iterations"], round(s["env_calls"], 1), round(s["forks"], 1),
                        [round(x, 3) for x in s["success"]], s["infra_failures"])
    assert got == {"docker": (30, 29.9, 11.5, [0.265, 0.27, 0.285], 0),
                   "local": (30, 29.9, 11.5, [0.26, 0.27, 0.275], 0)}


@pytest.mark.parametrize("args, lines", [
    ([], ["PRIMARY exact, seeds 5-17: n=13 mean diff -0.0097 (s.d. 0.0614), 95% CI (-0.0468, +0.0274); "
          "one-sided t=-0.57 p=0.7099; tree > traj on 7/13 (sign p=0.5000)"]),
    (["--arm", "tree_entropy"], [
        "PRIMARY exact, seeds 5-17: n=13 mean diff +0.0217 (s.d. 0.0354), 95% CI (+0.0003, +0.0431); "
        "one-sided t=2.21 p=0.0235; tree_entropy > traj on 10/13 (sign p=0.0461)"]),
    (["--parity"], [
        "PRIMARY Llama exact, seeds 5-17: n=13 mean diff +0.0179 (s.d. 0.0521), 95% CI (-0.0136, +0.0494); "
        "one-sided t=1.24 p=0.1196; tree_entropy > traj on 9/13 (sign p=0.1334)"]),
])
def test_text_policy_tests_from_the_committed_evaluations(args, lines, tmp_path):
    # run from another folder: the script finds its data beside itself
    res = subprocess.run([sys.executable, str(EXPERIMENTS / "text_policy" / "stats.py"), *args],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    for line in lines:
        assert line in out


def test_reference_runs_compare_numbers_within_tolerance_and_skip_clocks():
    """experiments/reference_runs/run.py: the first difference is reported, clocks never count."""
    same = _module(EXPERIMENTS / "reference_runs" / "run.py").same
    rows = [{"iteration": 0, "reward_mean": 0.25, "wall_s": 1.0}, {"iteration": 1, "reward_mean": 0.5, "wall_s": 2.0}]
    moved = [{"iteration": 0, "reward_mean": 0.25 + 1e-9, "wall_s": 9.0}, {"iteration": 1, "reward_mean": 0.5,
                                                                            "wall_s": 3.0}]
    assert same(rows, moved, 1e-6) is None
    assert same(rows, [rows[0], {**rows[1], "reward_mean": 0.75}], 1e-6) == "[1].reward_mean: 0.5 before, 0.75 after"
    assert same(rows, rows[:1], 1e-6) == ": 2 items before, 1 after"
    assert same({"a": "x"}, {"a": "x", "b": 1}, 1e-6) == ".b: only in after"


def test_two_sweeps_compared_cell_by_cell(tmp_path, capsys):
    """experiments/reference_runs/compare_sweeps.py: per (T, variant) means, Welch's interval, cells holding 0."""
    for name, accs in (("a", [0.25, 0.5, 0.25, 0.5]), ("b", [0.5, 0.75, 0.5, 0.75])):
        (tmp_path / name).mkdir()
        rows = "".join(f"3,tree,{s},{a}\n" for s, a in enumerate(accs))
        rows += "".join(f"2,traj,{s},0.25\n" for s in range(4))
        (tmp_path / name / "results.csv").write_text("turns,variant,seed,accuracy\n" + rows)
    assert _module(EXPERIMENTS / "reference_runs" / "compare_sweeps.py").main(str(tmp_path / "a"),
                                                                              str(tmp_path / "b")) == 0
    out = capsys.readouterr().out
    assert "| 2 | traj | 0.250 (n=4) | 0.250 (n=4) | +0.000 (+0.000, +0.000) | 1.00 |" in out
    assert "| 3 | tree | 0.375 (n=4) | 0.625 (n=4) | +0.250 (" in out and "1 of 2 intervals hold 0" in out


def test_granularity_suite_tables_from_the_committed_runs(tmp_path):
    """The suite study's page (docs/results/granularity/suite.md) is its report over the committed files, byte for
    byte; section 4 of docs/results/granularity.md shows its first two tables as they are; every config of the
    plan that has data has all its runs (8 variants x 20 seeds)."""
    suite = _module(EXPERIMENTS / "granularity" / "suite.py")
    text = suite.report(str(tmp_path / "suite.md"), str(tmp_path / "suite.png"))
    assert (tmp_path / "suite.md").read_text() == (ROOT / "docs/results/granularity/suite.md").read_text()
    assert (tmp_path / "suite.png").stat().st_size > 20_000
    page = (ROOT / "docs/results/granularity.md").read_text()
    for table in text.split("\n\n")[:2]:
        assert table in page
    for c in suite.CONFIGS:
        rows = suite.load(c.name)
        if rows:
            assert sorted((r["variant"], int(r["seed"])) for r in rows) == sorted(
                (v, s) for v in suite.VARIANTS for s in range(suite.SEEDS)), c.name


def test_trl_fork_table_from_the_committed_runs(tmp_path):
    """docs/results/trl_fork.md shows the report of the committed runs (experiments/trl_fork/data/budget2000) as it
    is, and every committed run spent its budget."""
    import argparse

    run = _module(EXPERIMENTS / "trl_fork" / "run.py")
    data = EXPERIMENTS / "trl_fork" / "data" / "budget2000"
    text = run.report(argparse.Namespace(out=str(data), md=None, png=str(tmp_path / "curves.png")))
    assert text in (ROOT / "docs/results/trl_fork.md").read_text()
    runs = run.load_runs(data)
    assert sum(len(by_seed) for by_seed in runs.values()) >= 3
    assert all(lines[-1]["env_calls"] >= 2000 for by_seed in runs.values() for lines in by_seed.values())
