"""Echo-Trap detector on constructed metric sequences, and `forkyard plot` on a real metrics file."""

import json

from trainer.cli import main
from trainer.text.monitors import EchoTrapDetector


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


def test_format_collapse_detector_on_the_recorded_runs():
    """The 54 recorded BPE runs (experiments/text_policy/data, gzip: 15 of section 1, 26 of section 0's
    confirmation, 13 of section 0a's entropy-fork arm): replayed, the format-collapse detector fires on
    exactly the six runs whose invalid-action share rose, at the iteration the windowed share crossed;
    the Echo-Trap detector on four. For runs recorded by train-lm with the detectors in the loop, the
    replay gives the iterations that were logged."""
    import gzip
    from pathlib import Path

    from trainer.text.monitors import FormatCollapseDetector

    runs = sorted(Path(__file__).resolve().parents[2].glob("experiments/text_policy/data/*.metrics.jsonl.gz"))
    assert len(runs) == 54
    fired, echoed = {}, {}
    for path in runs:
        rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
        det, echo = FormatCollapseDetector(), EchoTrapDetector()
        name = path.name.split(".")[0]
        for m in rows:
            det.update(m["iteration"], m["invalid_share"])
            if echo.update(m["iteration"], m["reward_std"], m["entropy"], m["grad_norm"]) is not None:
                echoed[name] = m["iteration"]
        if name.startswith("confirm_"):  # recorded by train-lm with the detector in the loop: same iteration
            logged = [m["iteration"] for m in rows if m.get("format_collapse_warning")]
            assert logged == ([det.collapsed_at] if det.collapsed_at is not None else [])
            assert [m["iteration"] for m in rows if m.get("echo_trap_warning")] == (
                [echoed[name]] if name in echoed else [])
        if det.collapsed_at is not None:
            fired[name] = det.collapsed_at
    assert fired == {"traj_seed3": 84, "tree_answerfork_seed3": 11, "confirm_tree_seed11": 41,
                     "confirm_tree_entropy_seed6": 155, "confirm_tree_entropy_seed8": 61,
                     "confirm_tree_entropy_seed11": 38}
    assert echoed == {"confirm_tree_seed11": 139, "confirm_tree_entropy_seed5": 164,
                      "confirm_tree_entropy_seed11": 63, "confirm_tree_entropy_seed13": 106}


def test_format_collapse_detector_ignores_one_bad_iteration_and_warns_once():
    from trainer.text.monitors import FormatCollapseDetector

    det = FormatCollapseDetector()
    series = [0.0] * 10 + [0.9] + [0.0] * 10  # one bad iteration: window mean 0.18 < 0.25
    assert all(det.update(i, x) is None for i, x in enumerate(series))
    warnings = [det.update(21 + i, 0.6) for i in range(10)]
    # windowed means 0.12, 0.24, then 0.36 >= 0 + 0.25: fires at the third, once
    assert [w is not None for w in warnings] == [False, False, True] + [False] * 7
    assert det.collapsed_at == 23 and "format collapse at iteration 23" in warnings[2]
