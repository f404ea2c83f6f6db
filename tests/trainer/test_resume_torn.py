"""Field case S57: a resume that trusted the last line of its log.

A run killed mid-write leaves a torn last line in ``metrics.jsonl`` (``sft_metrics.jsonl``); a power loss leaves
NUL bytes or bytes that are not UTF-8 where the last rows were. Resumed, the run cuts that tail off (kept in
``<name>.torn``), says so naming the file and the bytes, and goes on into the run left alone. A damaged line
with whole rows after it is corruption: the resume is refused naming the file and the line, nothing changed.
A torn ``config.json`` is rewritten from the copy in ``resume.pt``.

Real runs: the training loop in process (ClueProbe, tabular policy, stopped by SIGTERM after an iteration, as in
``tests/trainer/test_resume.py``) and the ``forkyard train`` / ``forkyard sft`` commands in a subprocess."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from envs.clueprobe import ClueProbeEnv
from tests.trainer.test_resume import SFT, TABULAR, TINY, forkyard, interrupted, rows, without_wall

#: The in-process runs: 7 iterations, stopped by SIGTERM after iteration STOP (the state covers 0..STOP).
ITERATIONS, STOP = 7, 3


def run_loop(run_dir: Path, resume: bool = False, kill_at: int | None = None):
    """The tabular loop on ClueProbe T=2 into ``run_dir`` (or resuming it); SIGTERM after ``kill_at``."""
    from trainer.loop import LoopConfig, train_loop
    from trainer.tabular import TabularPolicy

    cfg = LoopConfig(estimator="tree", n_base=2, branches=2, iterations=ITERATIONS, seed=5, save_every=0,
                     run_dir=None if resume else str(run_dir), resume=str(run_dir) if resume else None)
    policy = TabularPolicy(device="cpu")

    def on_iteration(m):
        if m["iteration"] == kill_at:
            os.kill(os.getpid(), signal.SIGTERM)

    train_loop(cfg, ClueProbeEnv(max_turns=2), policy, on_iteration=on_iteration)
    return policy


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``(whole, cut, policy of whole)``: the run left alone, and the run stopped after iteration STOP."""
    from trainer.loop import TrainingInterrupted

    tmp = tmp_path_factory.mktemp("torn")
    whole, cut = tmp / "whole", tmp / "cut"
    want = run_loop(whole)
    with pytest.raises(TrainingInterrupted):
        run_loop(cut, kill_at=STOP)
    assert [m["iteration"] for m in rows(cut / "metrics.jsonl")] == list(range(STOP + 1))
    return whole, cut, want


def line(whole: Path, i: int) -> bytes:
    """Row ``i`` of the run left alone, as written (with its newline)."""
    return (whole / "metrics.jsonl").read_bytes().splitlines(keepends=True)[i]


NEXT = STOP + 1
#: name -> (damage: (log bytes, run left alone) -> log bytes, bytes kept in metrics.jsonl.torn or None, reason)
TAILS = {
    "half a row, killed mid-write": (lambda b, w: b + line(w, NEXT)[:40], lambda w: line(w, NEXT)[:40],
                                     "not a whole JSON row"),
    "a line of NULs (power loss)": (lambda b, w: b + b"\0" * 512, None, "NUL bytes"),
    "a line of NULs and a newline": (lambda b, w: b + b"\0" * 64 + b"\n", None, "NUL bytes"),
    "NULs after the last row, its newline lost": (lambda b, w: b[:-1] + b"\0" * 300, None, "NUL bytes"),
    "bytes that are not UTF-8": (lambda b, w: b + line(w, NEXT)[:25] + b"\xff\xfe\x80", lambda w: line(w, NEXT)[:25]
                                 + b"\xff\xfe\x80", "not UTF-8"),
    "a whole last row without its newline": (lambda b, w: b[:-1], None, "without its newline"),
    "a row past the saved state, then half a row": (lambda b, w: b + line(w, NEXT) + line(w, NEXT + 1)[:-9],
                                                    lambda w: line(w, NEXT + 1)[:-9], "not a whole JSON row"),
}


@pytest.mark.parametrize("name", list(TAILS))
def test_a_torn_tail_is_cut_off_with_a_warning_and_the_run_resumes_into_the_run_left_alone(runs, tmp_path, caplog,
                                                                                          name):
    damage, kept, reason = TAILS[name]
    whole, cut, want = runs
    run = tmp_path / "cut"
    shutil.copytree(cut, run)
    log = run / "metrics.jsonl"
    before = log.read_bytes()
    log.write_bytes(damage(before, whole))
    with caplog.at_level(logging.WARNING):
        got = run_loop(run, resume=True)
    assert without_wall(rows(log)) == without_wall(rows(whole / "metrics.jsonl"))  # the run left alone
    assert got.rows == want.rows and torch.equal(got.table[:want.n_rows], want.table[:want.n_rows])
    assert log.read_bytes().startswith(before)  # the rows the state covers, byte for byte
    torn = [r.getMessage() for r in caplog.records if "torn tail" in r.getMessage()]
    assert len(torn) == 1 and str(log) in torn[0] and reason in torn[0], torn
    dropped = len(damage(before, whole)) - len(before)
    if name == "a whole last row without its newline":
        assert " 0 bytes cut off, the last row kept and ended" in torn[0]
    elif name == "NULs after the last row, its newline lost":
        assert f" {dropped + 1} bytes cut off, the last row kept and ended" in torn[0]
    elif name != "a row past the saved state, then half a row":
        assert f" {dropped} bytes cut off" in torn[0]
    if kept is None:
        assert not (run / "metrics.jsonl.torn").exists()
    else:
        assert (run / "metrics.jsonl.torn").read_bytes() == kept(whole)  # the torn bytes are never lost
    if name == "a row past the saved state, then half a row":
        assert (run / "metrics.discarded.jsonl").read_bytes() == line(whole, NEXT)
    assert {p.name for p in run.iterdir()} <= {"config.json", "metrics.jsonl", "resume.pt", "summary.json",
                                               "metrics.jsonl.torn", "metrics.discarded.jsonl"}


def test_a_whole_last_line_is_kept_and_nothing_is_cut(runs, tmp_path, caplog):
    whole, cut, _ = runs
    run = tmp_path / "cut"
    shutil.copytree(cut, run)
    with caplog.at_level(logging.WARNING):
        run_loop(run, resume=True)
    assert without_wall(rows(run / "metrics.jsonl")) == without_wall(rows(whole / "metrics.jsonl"))
    assert not [r for r in caplog.records if "torn" in r.getMessage() or "no rows" in r.getMessage()]
    assert {p.name for p in run.iterdir()} == {"config.json", "metrics.jsonl", "resume.pt"}


@pytest.mark.parametrize("lost", ["an empty file", "all NULs, the file's length kept"])
def test_a_log_that_lost_every_row_resumes_from_the_state_and_names_the_rows_lost(runs, tmp_path, caplog, lost):
    whole, cut, want = runs
    run = tmp_path / "cut"
    shutil.copytree(cut, run)
    log = run / "metrics.jsonl"
    log.write_bytes(b"" if lost == "an empty file" else b"\0" * len(log.read_bytes()))
    with caplog.at_level(logging.WARNING):
        got = run_loop(run, resume=True)
    assert without_wall(rows(log)) == without_wall(rows(whole / "metrics.jsonl")[NEXT:])
    assert got.rows == want.rows and torch.equal(got.table[:want.n_rows], want.table[:want.n_rows])
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"{log}: no rows for iteration 0..{STOP} ({NEXT} rows)" in m for m in messages), messages


@pytest.mark.parametrize("damage", [
    lambda ls: [ls[0], ls[1][:30] + b"\n", *ls[2:]],  # a half row in the middle
    lambda ls: [ls[0], b"\0" * 40 + b"\n", *ls[2:]],  # a NUL-filled line in the middle
    lambda ls: [ls[0], b"\0" * 40, *ls[2:]],  # a block of NULs glued to the next row
    lambda ls: [ls[0], ls[1][:30] + b"\xff\n", *ls[2:], b"\0" * 30],  # and a torn tail as well
], ids=["half row", "NUL line", "NULs glued to a row", "and a torn tail"])
def test_a_damaged_line_in_the_middle_is_refused_naming_file_and_line_and_nothing_changes(runs, tmp_path, damage):
    from trainer.loop import RunDirError

    _, cut, _ = runs
    run = tmp_path / "cut"
    shutil.copytree(cut, run)
    log = run / "metrics.jsonl"
    log.write_bytes(b"".join(damage(log.read_bytes().splitlines(keepends=True))))
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    with pytest.raises(RunDirError, match=f"{log}: line 2 is damaged .* corrupt in the middle"):
        run_loop(run, resume=True)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_forkyard_train_resumes_a_torn_log_and_config_and_refuses_a_corrupt_log(tmp_path):
    """The command: a run killed mid-row (state saved after iteration 3, half of row 4 and NUL padding after,
    its config.json torn too) resumes into the run left alone with the warnings on stderr, config.json rewritten
    from resume.pt; corruption in the middle of the log, or a torn config.json without resume.pt, is a usage
    error that changes nothing."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = [*TABULAR, "--save-every", "4"]
    assert forkyard(*args, "--iterations", "10", "--run-dir", str(whole)).returncode == 0
    assert forkyard(*args, "--iterations", "4", "--run-dir", str(cut)).returncode == 0
    (cut / "summary.json").unlink()
    good, config = (cut / "metrics.jsonl").read_bytes(), (cut / "config.json").read_bytes()
    bad = good.splitlines(keepends=True)
    bad[2] = bad[2][:20] + b"\n"
    (cut / "metrics.jsonl").write_bytes(b"".join(bad))
    r = forkyard("train", "--resume", str(cut), "--iterations", "10")
    assert r.returncode == 2 and f"{cut / 'metrics.jsonl'}: line 3 is damaged" in r.stderr, r.stderr[-2000:]
    assert (cut / "metrics.jsonl").read_bytes() == b"".join(bad) and not (cut / "metrics.jsonl.torn").exists()

    stateless = tmp_path / "stateless"
    shutil.copytree(cut, stateless)
    (stateless / "resume.pt").unlink()
    (stateless / "config.json").write_bytes(config[:70])
    r = forkyard("train", "--resume", str(stateless))
    assert r.returncode == 2 and "config.json cannot be read" in r.stderr and "no copy" in r.stderr, r.stderr[-2000:]
    assert (stateless / "config.json").read_bytes() == config[:70]

    half = (whole / "metrics.jsonl").read_bytes().splitlines(keepends=True)[4][:50]
    (cut / "metrics.jsonl").write_bytes(good + half + b"\0" * 4096)
    (cut / "config.json").write_bytes(config[:70] + b"\0" * 100)
    r = forkyard("train", "--resume", str(cut), "--iterations", "10")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{cut / 'metrics.jsonl'}: torn tail (not a whole JSON row) after its 4 whole rows: {50 + 4096} bytes" \
        in r.stderr, r.stderr[-2000:]
    assert (cut / "metrics.jsonl.torn").read_bytes() == half + b"\0" * 4096
    assert without_wall(rows(cut / "metrics.jsonl")) == without_wall(rows(whole / "metrics.jsonl"))
    a, b = (torch.load(d / "resume.pt", weights_only=True)["policy"] for d in (cut, whole))
    assert torch.equal(a["table"], b["table"]) and a["rows"] == b["rows"]
    assert f"{cut / 'config.json'} cannot be read" in r.stderr and "resume.pt" in r.stderr, r.stderr[-2000:]
    assert (cut / "config.json.torn").read_bytes() == config[:70] + b"\0" * 100

    def settings(d):
        return {k: v for k, v in json.loads((d / "config.json").read_text()).items() if k not in ("run_dir", "resume")}

    assert settings(cut) == settings(whole)  # the run's own settings back (the rewritten file names the resume)


def test_sft_resumes_a_torn_sft_metrics_log_into_the_uninterrupted_run(tmp_path):
    """``forkyard sft`` (tiny text policy on the CPU), stopped by SIGTERM, then its log torn after the saved
    steps (half the next row, NUL padding): the resumed run equals the run left alone (losses, sft.pt)."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    sft = ["sft", *TINY, *SFT, "--sft-steps", "12"]
    assert forkyard(*sft, "--run-dir", str(whole)).returncode == 0
    r = interrupted([*sft, "--run-dir", str(cut)], cut / "sft_metrics.jsonl", 4)
    assert r.returncode == 128 + signal.SIGTERM, (r.returncode, r.stderr[-2000:])
    done = torch.load(cut / "sft_resume.pt", weights_only=True)["step"]
    assert 4 <= done < 12
    log = cut / "sft_metrics.jsonl"
    log.write_bytes(log.read_bytes() + (whole / "sft_metrics.jsonl").read_bytes().splitlines(True)[done][:17]
                    + b"\0" * 1000)
    r = forkyard("sft", "--resume", str(cut))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{log}: torn tail" in r.stderr and f"{17 + 1000} bytes cut off" in r.stderr, r.stderr[-2000:]
    got, want = rows(log), rows(whole / "sft_metrics.jsonl")
    assert [m["step"] for m in got] == list(range(12)) and without_wall(got) == without_wall(want)
    a, b = (torch.load(d / "sft.pt", weights_only=True)["state_dict"] for d in (cut, whole))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
