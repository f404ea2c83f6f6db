"""Echo-Trap detector on constructed metric sequences, and `forkyard plot` on a real metrics file."""

import json

from trainer.cli import main
from trainer.monitors import EchoTrapDetector


def feed(det, rows):
    out = []
    for it, (std, ent, g) in enumerate(rows):
        w = det.update(it, std, ent, g)
        if w:
            out.append((it, w))
    return out


def collapse():
    rows = [(0.45, 0.8, 0.1)] * 10  # healthy
    rows += [(0.05, 0.8, 0.1)] * 6  # reward std falls (iterations 10..)
    rows += [(0.05, 0.1, 0.1)] * 6  # then entropy falls (16..)
    rows += [(0.05, 0.1, 2.0)]  # then a gradient-norm spike at 22
    return rows


def test_detects_the_ordered_pattern_once():
    det = EchoTrapDetector(window=3, drop=0.5, spike=3.0)
    fired = feed(det, collapse() + [(0.05, 0.1, 5.0)] * 3)
    assert len(fired) == 1 and fired[0][0] == 22
    assert det.std_fall is not None and 10 <= det.std_fall <= 12
    assert det.entropy_fall is not None and 16 <= det.entropy_fall <= 18
    assert "iteration 22" in fired[0][1]


def test_no_warning_without_the_order_or_on_a_healthy_run():
    healthy = [(0.45 + 0.01 * (i % 3), 0.8, 0.1 + 0.01 * (i % 2)) for i in range(40)]
    assert feed(EchoTrapDetector(window=3), healthy) == []
    # a spike with std and entropy intact is not the pattern
    assert feed(EchoTrapDetector(window=3), healthy[:20] + [(0.45, 0.8, 5.0)] + healthy[:5]) == []
    # entropy falls first, std never falls: not the pattern
    ent_only = [(0.45, 0.8, 0.1)] * 10 + [(0.45, 0.1, 0.1)] * 8 + [(0.45, 0.1, 3.0)]
    assert feed(EchoTrapDetector(window=3), ent_only) == []


def test_plot_command_writes_png(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with (run / "metrics.jsonl").open("w") as f:
        for it, (std, ent, g) in enumerate(collapse()):
            row = {"iteration": it, "reward_mean": 0.3, "reward_std": std, "entropy": ent, "grad_norm": g,
                   "clip_frac": 0.01, "ratio_mean": 1.0, "ratio_max": 1.2, "response_length": 9.0,
                   "invalid_share": 0.0, "zero_variance_groups": 0.5}
            if it % 5 == 4:
                row["eval_greedy_accuracy"] = 0.25
            if it == 22:
                row["echo_trap_warning"] = 1
            f.write(json.dumps(row) + "\n")
    assert main(["plot", str(run)]) == 0
    png = (run / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
