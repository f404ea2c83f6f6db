"""The TRL comparison's runner (``experiments/trl_fork/run.py``) is resumable: ``all`` runs the plan's (arm, seed)
runs in the plan's order, skips finished ones, and a stopped run leaves a ``.partial`` that never counts as done.
No training here: ``run_all`` is given a launcher that writes a run's lines the way ``train`` does."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _runner():
    spec = importlib.util.spec_from_file_location("trl_fork_run", ROOT / "experiments/trl_fork/run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(out: Path, **kw) -> argparse.Namespace:
    base = dict(seeds=[0, 1], arms=["factory", "tree", "control"], budget=100, eval_every=50, model="m", lr=1e-4,
                out=str(out), threads=1)
    return argparse.Namespace(**{**base, **kw})


def _fake_train(run, out: Path, log: list, stop_at: tuple | None = None):
    """A launcher that plays ``train``: lines to the RunLog, committed at the end (or stopped before it)."""
    def launch(argv: list[str]) -> None:
        arm, seed = argv[argv.index("--arm") + 1], int(argv[argv.index("--seed") + 1])
        log.append((arm, seed))
        runlog = run.RunLog(run.run_path(out, arm, seed))
        runlog.write({"arm": arm, "seed": seed, "env_calls": 0, "success": 0.125})
        if (arm, seed) == stop_at:
            raise KeyboardInterrupt  # stopped mid-run: no commit
        runlog.write({"arm": arm, "seed": seed, "env_calls": 104, "success": 0.25})
        runlog.commit()
    return launch


def test_all_runs_the_plan_in_order_and_resumes_after_a_stop(tmp_path):
    run = _runner()
    calls: list = []
    with pytest.raises(KeyboardInterrupt):
        run.run_all(_args(tmp_path), _fake_train(run, tmp_path, calls, stop_at=("tree", 1)))
    assert calls == [("factory", 0), ("tree", 0), ("control", 0), ("factory", 1), ("tree", 1)]
    assert not run.run_path(tmp_path, "tree", 1).exists()  # the stopped run is not a run file
    assert (tmp_path / "tree-seed1.jsonl.partial").exists()
    assert sorted(p.name for p in tmp_path.glob("*-seed*.jsonl")) == [
        "control-seed0.jsonl", "factory-seed0.jsonl", "factory-seed1.jsonl", "tree-seed0.jsonl"]

    calls.clear()
    paths = run.run_all(_args(tmp_path), _fake_train(run, tmp_path, calls))
    assert calls == [("tree", 1), ("control", 1)]  # the finished runs skipped, the stopped one started afresh
    assert [p.name for p in paths] == [f"{a}-seed{s}.jsonl" for s in (0, 1) for a in ("factory", "tree", "control")]
    assert not list(tmp_path.glob("*.partial"))
    lines = [json.loads(x) for x in run.run_path(tmp_path, "tree", 1).read_text().splitlines()]
    assert [x["env_calls"] for x in lines] == [0, 104]  # the stale partial's lines were not kept


def test_all_refuses_a_finished_run_of_a_smaller_budget(tmp_path):
    run = _runner()
    calls: list = []
    run.run_all(_args(tmp_path, seeds=[0], arms=["factory"]), _fake_train(run, tmp_path, calls))
    with pytest.raises(SystemExit, match="under the budget"):
        run.run_all(_args(tmp_path, seeds=[0], arms=["factory"], budget=2000), _fake_train(run, tmp_path, calls))


def test_plan_order_and_report_ignores_partials(tmp_path):
    run = _runner()
    assert run.plan_runs(list(range(12)), list(run.ARMS))[:4] == [("factory", 0), ("tree", 0), ("control", 0),
                                                                  ("factory", 1)]
    assert len(run.plan_runs(list(range(12)), list(run.ARMS))) == 36
    (tmp_path / "tree-seed0.jsonl.partial").write_text(json.dumps({"arm": "tree", "seed": 0, "env_calls": 0,
                                                                  "success": 0.5}) + "\n")
    assert "| tree |" not in run.report(argparse.Namespace(out=str(tmp_path)))


def test_export_copies_complete_runs_and_report_tests_the_pairs(tmp_path):
    run = _runner()
    src = tmp_path / "runs"
    src.mkdir()
    for arm, seed, final in (("factory", 0, 0.125), ("tree", 0, 0.25), ("factory", 1, 0.125), ("tree", 1, 0.5),
                             ("control", 0, 0.125)):
        lines = [{"arm": arm, "seed": seed, "env_calls": c, "sampled_tokens": 10 * c, "success": s}
                 for c, s in ((0, 0.125), (2001, final))]
        run.run_path(src, arm, seed).write_text("".join(json.dumps(x) + "\n" for x in lines))
    (src / "tree-seed2.jsonl.partial").write_text(json.dumps({"arm": "tree", "seed": 2}) + "\n")
    copied = run.export(argparse.Namespace(out=str(src), budget=2000, to=str(tmp_path / "data")))
    assert sorted(p.name for p in copied) == ["control-seed0.jsonl", "factory-seed0.jsonl", "factory-seed1.jsonl",
                                              "tree-seed0.jsonl", "tree-seed1.jsonl"]
    text = run.report(argparse.Namespace(out=str(tmp_path / "data"), md=str(tmp_path / "t.md"),
                                         png=str(tmp_path / "c.png")))
    assert "| tree | 2 | 0.375 ± " in text and "| tree − factory | primary | 2 | +0.250 |" in text
    assert (tmp_path / "t.md").read_text() == text + "\n" and (tmp_path / "c.png").stat().st_size > 10_000
