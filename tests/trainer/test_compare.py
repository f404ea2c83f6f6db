"""The granularity sweep: aggregation by hand, and a small real sweep through the CLI."""

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.compare import markdown_table, optimum, summarize

ROOT = Path(__file__).resolve().parents[2]


def test_optimum():
    assert [optimum(t) for t in (2, 3, 4, 5)] == [0.25, 0.5, 1.0, 1.0]


def test_summarize_and_table():
    rows = [
        {"turns": 5, "variant": v, "seed": s, "accuracy": a, "distinct_probes": 2.0, "env_calls_per_iter": c,
         "iterations": 10, "degeneration": 0.8}
        for v, c, accs in (("traj", 80, [0.5, 0.75]), ("tree", 70, [1.0, 0.75]))
        for s, a in enumerate(accs)
    ]
    summary = summarize(rows)
    assert [(s["variant"], s["acc_mean"], s["acc_min"], s["acc_max"]) for s in summary] == [
        ("traj", 0.625, 0.5, 0.75), ("tree", 0.875, 0.75, 1.0)]
    # two seeds: standard error 0.125, t(0.975, 1) = 12.7062 (trainer.stats.mean_ci)
    assert summary[0]["acc_ci95"] == pytest.approx(12.706205 * 0.125, rel=1e-6)
    table = markdown_table(summary)
    assert "| 5 | 1.00 | tree | 0.875 ± 1.588 |" in table and "80.0%" in table


def test_one_seed_has_no_interval():
    rows = [{"turns": 2, "variant": "traj", "seed": 0, "accuracy": 0.25, "distinct_probes": 1.0,
             "env_calls_per_iter": 32, "iterations": 10, "degeneration": 0.1}]
    summary = summarize(rows)
    assert math.isnan(summary[0]["acc_ci95"])
    assert "| 0.250 ± n/a |" in markdown_table(summary)


def test_small_sweep_through_the_cli(tmp_path):
    out = tmp_path / "cmp"
    cmd = [sys.executable, "-m", "trainer.cli", "compare", "--max-turns", "2", "3", "--variants", "traj", "tree",
           "--seeds", "2", "--iterations", "15", "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "| 3 | 0.50 | tree |" in res.stdout
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 8
    assert {r["variant"] for r in rows} == {"traj", "tree"}
    assert all(float(r["env_calls_per_iter"]) == 16 * int(r["turns"]) for r in rows if r["variant"] == "traj")
    assert (out / "accuracy_vs_T.png").stat().st_size > 10_000
    assert len(list((out / "metrics").glob("*.jsonl"))) == 8


def test_equal_budget_gives_tree_more_iterations(tmp_path):
    from trainer.compare import SweepConfig, run_sweep

    rows, summary, _ = run_sweep(SweepConfig(turns=(5,), variants=("traj", "tree"), seeds=1, budget_iterations=10,
                                             out=str(tmp_path), progress=False, workers=1))
    by = {r["variant"]: r for r in rows}
    assert by["traj"]["iterations"] == 10 and by["traj"]["env_calls_total"] == 800
    assert by["tree"]["iterations"] > 10 and by["tree"]["env_calls_total"] >= 800
    assert by["tree"]["env_calls_total"] - 800 < 5 * 5 * 4  # stops within one iteration of the budget
