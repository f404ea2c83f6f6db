"""Field case S41: an interrupted run keeps its state and resumes as if never stopped.

Each test runs the real ``forkyard`` command in a subprocess, sends it SIGTERM once its metrics file has a
few rows, resumes it with ``--resume RUN_DIR`` and compares with the same run left alone: equal metrics
(``wall_s`` aside) and equal weights. Also: a new run into a folder holding a run's records is refused and
the records are untouched, rows written after the last saved state are kept aside (never lost), and a resumed
run refuses settings that differ from its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.clueprobe import ClueProbeEnv
from tests.docker_support import ROOT

FORKYARD = str(ROOT / ".venv" / "bin" / "forkyard")

#: A tabular run of a few seconds (ClueProbe T=3, tree rollouts).
TABULAR = ["train", "--max-turns", "3", "--estimator", "tree", "--eval-episodes", "8", "--device", "cpu",
           "--save-every", "7"]
#: A tiny text policy on the CPU (byte tokenizer, 1 block of width 16), for sft and train-lm.
TINY = ["--vocab", "300", "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--context", "256",
        "--max-turns", "2",
        "--threads", "1", "--device", "cpu", "--save-every", "3"]
#: SFT on the scripted demonstrator: after 60 steps the policy writes valid actions and sometimes answers right.
SFT = ["--sft-batch", "8", "--sft-lr", "1e-2", "--demo-skill", "1"]


def forkyard(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([FORKYARD, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def without_wall(ms: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if k != "wall_s"} for m in ms]


def interrupted(args: list[str], metrics: Path, after_rows: int, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``forkyard args``, send SIGTERM once ``metrics`` holds ``after_rows`` rows, and wait for it."""
    proc = subprocess.Popen([FORKYARD, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= after_rows:
                proc.send_signal(signal.SIGTERM)
                break
            time.sleep(0.005)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_tabular_run_stopped_by_sigterm_resumes_into_the_uninterrupted_run(tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = [*TABULAR, "--iterations", "60"]
    r = forkyard(*args, "--run-dir", str(whole))
    assert r.returncode == 0, r.stderr[-2000:]
    r = interrupted([*args, "--run-dir", str(cut)], cut / "metrics.jsonl", 10)
    assert r.returncode == 128 + signal.SIGTERM, (r.returncode, r.stderr[-2000:])
    assert "--resume" in r.stderr and not (cut / "summary.json").exists()
    state = torch.load(cut / "resume.pt", weights_only=True)
    done = state["iteration"]
    assert 10 <= done < 60  # stopped mid-run, after the iteration during which the signal came
    assert [m["iteration"] for m in rows(cut / "metrics.jsonl")] == list(range(done))
    r = forkyard("train", "--resume", str(cut))
    assert r.returncode == 0, r.stderr[-2000:]
    got, want = rows(cut / "metrics.jsonl"), rows(whole / "metrics.jsonl")
    assert [m["iteration"] for m in got] == list(range(60))  # the same file, continued
    assert without_wall(got) == without_wall(want)  # the next iterations' seeds, RNG and table as if never stopped
    a, b = (torch.load(d / "resume.pt", weights_only=True)["policy"] for d in (cut, whole))
    assert torch.equal(a["table"], b["table"]) and a["rows"] == b["rows"]
    def summary(d):
        return json.loads((d / "summary.json").read_text())["evaluation"]

    assert summary(cut) == summary(whole)


@settings(max_examples=12, deadline=None)
@given(stop_after=st.integers(0, 6), save_every=st.integers(0, 3), estimator=st.sampled_from(["tree", "grpo", "gigpo"]))
def test_any_stop_point_resumes_into_the_same_run(stop_after, save_every, estimator):
    """In process, for any iteration the SIGTERM comes in, any save period and estimator: the loop saves
    after that iteration, stops, and the resumed loop ends where the uninterrupted one does (metrics, table)."""
    from trainer.loop import LoopConfig, TrainingInterrupted, train_loop
    from trainer.tabular import TabularPolicy

    def run(run_dir: str, resume: bool = False, kill_at: int | None = None):
        cfg = LoopConfig(estimator=estimator, group_size=4, n_base=2, branches=2, iterations=7, seed=3,
                         save_every=save_every, run_dir=None if resume else run_dir, resume=run_dir if resume else None)
        policy = TabularPolicy(device="cpu")

        def on_iteration(m):
            if m["iteration"] == kill_at:
                os.kill(os.getpid(), signal.SIGTERM)

        train_loop(cfg, ClueProbeEnv(max_turns=2), policy, on_iteration=on_iteration)
        return policy

    with tempfile.TemporaryDirectory() as tmp:
        whole, cut = Path(tmp) / "whole", Path(tmp) / "cut"
        want = run(str(whole))
        with pytest.raises(TrainingInterrupted) as stopped:
            run(str(cut), kill_at=stop_after)
        assert stopped.value.done == stop_after + 1 and stopped.value.signal == signal.SIGTERM
        assert len(rows(cut / "metrics.jsonl")) == stop_after + 1
        got = run(str(cut), resume=True)
        assert without_wall(rows(cut / "metrics.jsonl")) == without_wall(rows(whole / "metrics.jsonl"))
        n = want.n_rows
        assert got.rows == want.rows and torch.equal(got.table[:n], want.table[:n])


def test_a_new_run_never_replaces_a_runs_records(tmp_path):
    run = tmp_path / "run"
    r = forkyard(*TABULAR, "--iterations", "5", "--run-dir", str(run))
    assert r.returncode == 0, r.stderr[-2000:]
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    for argv in ([*TABULAR, "--iterations", "5", "--run-dir", str(run)],  # the same command again
                 ["train", "--policy", "lm", *TINY, "--iterations", "1", "--run-dir", str(run)]):
        r = forkyard(*argv)
        assert r.returncode == 2 and "--resume" in r.stderr and "holds a run" in r.stderr, r.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    # resuming a finished run with more iterations extends it, in the same file
    r = forkyard("train", "--resume", str(run), "--iterations", "8")
    assert r.returncode == 0, r.stderr[-2000:]
    assert [m["iteration"] for m in rows(run / "metrics.jsonl")] == list(range(8))
    # a resumed run keeps its settings; another command's run is not resumed; nor is a folder without a run
    r = forkyard("train", "--resume", str(run), "--lr", "0.5")
    assert r.returncode == 2 and "lr is 0.1 in the run, 0.5 given" in r.stderr
    from trainer.loop import RunDirError, resume_config
    from trainer.text.text_config import TextTrainConfig
    from trainer.tabular_config import TrainConfig

    with pytest.raises(RunDirError, match="another command"):
        resume_config(TextTrainConfig(resume=str(run)))
    with pytest.raises(RunDirError, match="no config.json"):
        resume_config(TrainConfig(resume=str(tmp_path / "nothing")))
    assert resume_config(TrainConfig(resume=str(run), iterations=9)).iterations == 9
    assert {p.name for p in run.iterdir()} == set(before)  # nothing written by the refused commands


def test_rows_past_the_saved_state_are_kept_aside_and_redone(tmp_path):
    """A run killed without warning (SIGKILL) after its last save: the rows it wrote since are moved to
    metrics.discarded.jsonl, and the resumed run writes those iterations again, as the uninterrupted run."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = [*TABULAR, "--save-every", "4"]
    assert forkyard(*args, "--iterations", "10", "--run-dir", str(whole)).returncode == 0
    assert forkyard(*args, "--iterations", "4", "--run-dir", str(cut)).returncode == 0
    # as if killed during iteration 6: the state saved after iteration 3, rows 4 and 5 written since
    extra = (whole / "metrics.jsonl").read_text().splitlines()[4:6]
    with (cut / "metrics.jsonl").open("a") as f:
        f.write("".join(line + "\n" for line in extra))
    (cut / "summary.json").unlink()
    r = forkyard("train", "--resume", str(cut), "--iterations", "10")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (cut / "metrics.discarded.jsonl").read_text().splitlines() == extra
    assert without_wall(rows(cut / "metrics.jsonl")) == without_wall(rows(whole / "metrics.jsonl"))


def test_sft_stopped_by_sigterm_resumes_into_the_uninterrupted_run(tmp_path):
    """The text policy's SFT on the CPU (tiny config): stopped by SIGTERM and resumed, it equals the run left
    alone (per-step losses and the weights of sft.pt)."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    sft = ["sft", *TINY, *SFT, "--sft-steps", "24"]
    r = forkyard(*sft, "--run-dir", str(whole))
    assert r.returncode == 0, r.stderr[-2000:]
    r = interrupted([*sft, "--run-dir", str(cut)], cut / "sft_metrics.jsonl", 4)
    assert r.returncode == 128 + signal.SIGTERM, (r.returncode, r.stderr[-2000:])
    assert not (cut / "sft.pt").exists() and (cut / "sft_resume.pt").is_file()
    done = torch.load(cut / "sft_resume.pt", weights_only=True)["step"]
    assert 4 <= done < 24 and len(rows(cut / "sft_metrics.jsonl")) == done
    r = forkyard("sft", "--resume", str(cut))
    assert r.returncode == 0, r.stderr[-2000:]
    got, want = rows(cut / "sft_metrics.jsonl"), rows(whole / "sft_metrics.jsonl")
    assert [m["step"] for m in got] == list(range(24)) and without_wall(got) == without_wall(want)
    a, b = (torch.load(d / "sft.pt", weights_only=True)["state_dict"] for d in (cut, whole))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    r = forkyard(*sft, "--run-dir", str(whole))  # and a new SFT run into it is refused
    assert r.returncode == 2 and "holds a run" in r.stderr


def test_train_lm_stopped_by_sigterm_resumes_into_the_uninterrupted_run(tmp_path):
    """The text policy's RL on the CPU (tiny config, from a short SFT, with a KL reference): stopped by
    SIGTERM and resumed, it equals the run left alone (every metric, and the weights of model.pt)."""
    from trainer.text.text_config import TextTrainConfig
    from trainer.text.text_sft import sft

    tiny = dict(vocab=300, d_model=32, n_layers=1, n_heads=2, context=256, max_turns=2, threads=1, device="cpu")
    sft(TextTrainConfig(**tiny, sft_steps=60, sft_batch=8, sft_lr=1e-2, demo_skill=1, run_dir=str(tmp_path / "sft")))
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    rl = ["train-lm", *TINY, "--model", str(tmp_path / "sft" / "sft.pt"), "--estimator", "traj", "--group-size", "6",
          "--iterations", "8", "--max-new-tokens", "8", "--eval-samples", "8", "--eval-every", "4", "--kl-coef", "0.1"]
    r = forkyard(*rl, "--run-dir", str(whole))
    assert r.returncode == 0, r.stderr[-2000:]
    want = rows(whole / "metrics.jsonl")
    assert sum(m["trained_tokens"] > 0 for m in want) >= 3  # the policy learns: the comparison is not vacuous
    r = interrupted([*rl, "--run-dir", str(cut)], cut / "metrics.jsonl", 2)
    assert r.returncode == 128 + signal.SIGTERM, (r.returncode, r.stderr[-2000:])
    assert not (cut / "model.pt").exists() and 2 <= torch.load(cut / "resume.pt", weights_only=True)["iteration"] < 8
    r = forkyard("train-lm", "--resume", str(cut))
    assert r.returncode == 0, r.stderr[-2000:]
    got = rows(cut / "metrics.jsonl")
    assert [m["iteration"] for m in got] == list(range(8))
    for g, w in zip(without_wall(got), without_wall(want), strict=True):
        assert g.keys() == w.keys()
        for k in g:
            assert g[k] == pytest.approx(w[k], rel=1e-5, abs=1e-7), k
    a, b = (torch.load(d / "model.pt", weights_only=True)["state_dict"] for d in (cut, whole))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
