"""CodeRepair-v0: generated packages with one bug (the generator's promises over many seeds), episodes whose edits and
test runs happen in the sandbox (local and docker), the submit gate, and forks and snapshots of a workspace the
episode changed: each branch continues from the edited files, and one branch's edits never reach another."""

from __future__ import annotations

import ast
import random
import textwrap

import gymnasium as gym
import pytest

import envs  # noqa: F401 - registers the ids
from envs.suite.code_tasks import FUNCTIONS, _define, draw_task
from tests.docker_support import require_bwrap, require_docker

ID = "forkyard/CodeRepair-v0"


@pytest.mark.parametrize("seed", range(40))
def test_every_task_has_one_bug_the_visible_and_the_hidden_tests_catch(seed):
    task = draw_task(random.Random(seed))
    bug = task["bug"]
    module = task["files"][bug["path"]]
    assert module.count(bug["buggy"]) == 1 and bug["buggy"] != bug["fixed"]
    fn = next(f for f in FUNCTIONS if f.name == bug["function"])
    scope: dict = {}
    exec(compile(module, bug["path"], "exec"), scope)  # noqa: S102 - the generator's own module text
    buggy, right = scope[fn.name], _define(fn.source)
    shown = cases(task["files"][task["tests"][0]] + task["files"][task["tests"][1]], fn.name)
    hidden = cases(task["hidden"], fn.name)
    assert len(shown) == 3 and len(hidden) == 6

    def fails(args: tuple, want) -> bool:
        assert right(*args) == want  # the generator's expected values are the reference's
        try:
            return buggy(*args) != want
        except Exception:  # noqa: BLE001 - the bug crashes on it: the test fails
            return True

    assert any(fails(*c) for c in shown) and any(fails(*c) for c in hidden)
    fixed = module.replace(bug["buggy"], bug["fixed"])
    assert textwrap.dedent(fn.source).strip() in fixed
    scope = {}
    exec(compile(module.replace(bug["buggy"], bug["wrong"]), bug["path"], "exec"), scope)  # noqa: S102
    buggy = scope[fn.name]
    assert any(fails(*c) for c in hidden)  # the menu's wrong repair: the hidden tests fail it too


def cases(module: str, name: str) -> list[tuple[tuple, object]]:
    """``(arguments, expected)`` of every ``self.assertEqual(name(...), expected)`` of a test module's text."""
    out = []
    for node in ast.walk(ast.parse(module)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "assertEqual":
            call, want = node.args
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == name:
                out.append((tuple(ast.literal_eval(a) for a in call.args), ast.literal_eval(want)))
    return out


def backends() -> list:
    return [pytest.param("local", id="local"), pytest.param("docker", id="docker", marks=pytest.mark.docker)]


@pytest.fixture(params=backends())
def env(request):
    (require_docker if request.param == "docker" else require_bwrap)()
    e = gym.make(ID, backend=request.param, max_turns=8).unwrapped
    yield e
    e.close()


def play(env, actions):
    out = []
    for a in actions:
        out.append(env.step(a))
        if out[-1][2] or out[-1][3]:
            break
    return out


def test_the_scripted_repair_earns_the_reward_and_the_gate_holds(env):
    obs, info = env.reset(seed=11)
    bug = env._task["bug"]
    assert "has a bug" in obs and bug["path"] in obs and len(info["legal_actions"]) == 10
    early = env.step("submit()")
    assert early[1] == 0.0 and not early[2] and early[4]["invalid_action"] and "run_tests() first" in early[0]
    failing = env.step("run_tests()")[0]
    assert "FAIL" in failing and "[some tests fail]" in failing
    total, steps = 0.0, 0
    while True:
        obs, r, term, trunc, info = env.step(env.oracle_action())
        total, steps = total + r, steps + 1
        if term or trunc:
            break
    assert (total, info["correct"], info["termination_reason"]) == (1.0, True, "submitted")
    assert "the hidden tests pass" in obs


def test_a_wrong_repair_and_an_untested_edit_are_not_rewarded(env):
    env.reset(seed=12)
    right, wrong = env._repairs()
    steps = play(env, ["run_tests()", wrong, "submit()"])
    assert steps[-1][4]["invalid_action"]  # edited since the last test run: refused, the episode goes on
    last = play(env, ["run_tests()", "submit()"])[-1]
    assert (last[1], last[2], last[4]["correct"]) == (0.0, True, False) and "the hidden tests fail" in last[0]


def test_what_the_episode_put_in_the_hidden_tests_folder_earns_nothing(env):
    """A policy that plants a passing test (or one that exits 0 at once) where the hidden tests go gets no reward:
    the folder is cleared at submit and the summary must count every hidden test."""
    env.reset(seed=16)
    steps = play(env, ["write('hidden_tests/test_a.py', 'import os\\nos._exit(0)\\n')", "run_tests()", "submit()"])
    assert (steps[-1][1], steps[-1][4]["correct"]) == (0.0, False)


def test_forks_carry_the_edited_workspace_and_branches_stay_apart(env):
    env.reset(seed=13)
    bug = env._task["bug"]
    fix = env._repairs()[0]
    assert "replaced 1 occurrence" in env.step(fix)[0]
    kids = env.fork(2)
    try:
        spoiled, kept = kids
        assert bug["fixed"] in spoiled.step(f"cat({bug['path']!r})")[0]  # the edit made before the fork
        spoiled.step(f"write({bug['path']!r}, 'def broken(:\\n')")
        assert "[some tests fail]" in spoiled.step("run_tests()")[0]
        assert spoiled.step("submit()")[1] == 0.0
        assert "[the tests pass]" in kept.step("run_tests()")[0]  # the sibling's write never reached it
        assert kept.step("submit()")[1] == 1.0
        assert "[the tests pass]" in env.step("run_tests()")[0]  # nor the parent
        assert env.step("submit()")[1] == 1.0
    finally:
        for k in kids:
            k.close()


def test_forks_carry_the_live_python_session(env):
    """Variables of the episode's Python session reach every branch of a fork (by value) and diverge there; a name
    that cannot be carried is named in the branch's observation; the probe reads the files as they are now."""
    env.reset(seed=13)
    first = env.step("python('seen = [1]\\nimport random\\nrandom.seed(4)\\nseen')")[0]
    assert "[1]" in first and "[a new Python session: no variables from before]" in first
    probe = env._probe()
    buggy = env.step(probe)[0]
    kids = env.fork(2)
    try:
        step = "python('seen.append(len(seen) + 1); seen, random.random()')"
        outs = [k.step(step)[0] for k in kids]
        assert outs[0] == outs[1] and "([1, 2], 0." in outs[0] and "Python session" not in outs[0], outs
        kids[0].step("python('seen.append(99)')")
        assert "[1, 2]" in kids[1].step("python('seen')")[0]  # apart
        assert env.step(step)[0] == outs[0]  # the parent's own session reads as each branch did
        env.step("python('fh = open(\\'x.txt\\', \\'w\\')')")
        [late] = env.fork(1)
        kids.append(late)
        assert "not carried: fh (TypeError" in late.step("python('seen')")[0]
        late.step(env._repairs()[0])
        assert late.step(probe)[0].split("\n", 1)[1] != buggy.split("\n", 1)[1]  # the fixed function now
    finally:
        for k in kids:
            k.close()


def test_a_python_session_survives_its_own_mistakes_and_says_why_it_ended(env):
    env.reset(seed=17)
    env.step("python('import sys\\nsys.stdout = None')")
    assert "\n2\n" in env.step("python('1 + 1')")[0]  # the session put its output back
    ended = env.step("python('import os\\nos._exit(1)')")[0]
    assert "[the cell ended the interpreter (os._exit" in ended, ended  # the sandbox's own reason


def test_a_snapshot_carries_the_edits_and_the_gate(env):
    env.reset(seed=14)
    fix = env._repairs()[0]
    play(env, [fix, "run_tests()"])
    snap = env.snapshot()
    fresh = gym.make(ID, backend=env.backend, max_turns=8).unwrapped
    try:
        fresh.restore(snap)
        obs, r, term, _, info = fresh.step("submit()")  # tested after the edit: allowed, and the fix is there
        assert (r, term, info["correct"]) == (1.0, True, True)
    finally:
        fresh.close()


def test_bad_settings_and_actions_are_explained(env):
    with pytest.raises(ValueError, match="functions"):
        gym.make(ID, backend=env.backend, functions=1)
    env.reset(seed=15)
    for action, words in (("cat()", "needs a path"), ("rm('x')", "unknown tool"), ("grep('')", "non-empty"),
                          ("replace('a.py', '', 'x')", "non-empty"), ("cat('/data/../etc/passwd')", "refused")):
        obs, r, term, trunc, info = env.step(action)
        assert info["invalid_action"] and words in obs and not (term or trunc), (action, obs)
    outside = env.step("write('/tmp/x.py', 'print(1)')")
    assert outside[4]["invalid_action"] and "outside the readable roots" in outside[0]
