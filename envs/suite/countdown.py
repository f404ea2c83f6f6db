"""Countdown-v0: reach a target number from a few numbers with + - * /, in one answer or one step at a time.

The task form is RAGEN's Countdown (RAGEN / StarPO, arXiv 2504.20073; the puzzles of TinyZero's Countdown set):
the observation gives ``Target: T, nums: [a, b, c, d]``, and the agent writes an arithmetic expression over the
numbers that equals the target. As in RAGEN's scoring, each given number must be used exactly once
(``use_all=True``; with ``use_all=False`` each at most once, the classic game's rule).

Puzzles are generated from the env's seeded RNG, solvable by construction: ``num_count`` numbers are drawn from
``[min_number, max_number]`` and the target is the value of a random combination of them (two numbers combined
into one with + - * / until one is left, or, with ``use_all=False``, for a random number of steps), keeping every
intermediate value a positive integer (a - b only when a > b, a / b only when exact); targets above
``max_target`` are redrawn.

Two modes (``mode``):

``"single"`` (RAGEN's, the default)
    One answer: ``answer(expression)``, e.g. ``answer('(8 - 2) * 4')``. The expression is parsed with :mod:`ast`
    (integers, ``+ - * /``, unary minus and parentheses; never evaluated as code) and computed exactly with
    fractions. Reward as RAGEN's: 1.0 when it uses the numbers as required and equals the target, 0.1 (RAGEN's
    format score) when it uses them as required but misses, 0.0 otherwise (other numbers, or not an
    arithmetic expression). Any answer terminates the episode (``"answered"``); a call that is no answer (text that
    is no tool call, another tool, a number instead of a quoted expression) is refused and takes a turn, and the
    default budget of 2 turns leaves one retry. The action set is open, so
    ``info["legal_actions"]`` is a curated menu drawn per puzzle: one right expression, three wrong ones over the
    same numbers and one that uses a number twice, sorted.

``"multi"``
    One combination per turn with ``combine(a, op, b)``: two numbers of the pool (``a`` and ``b``, values; ``op``
    one of ``'+'``, ``'-'``, ``'*'``, ``'/'``) are replaced by the result, which must be a positive integer. The
    pool shrinks by one per turn, so the legal menu (every valid combination, the larger number first) is finite
    and forks branch on the next combination. The episode terminates when the target is made (reward 1.0; with
    ``use_all=True`` only when it is the last number left) or when one number is left that misses it (0.1, the
    format score of a complete but wrong solution); running out of ``max_turns`` truncates it (0.0).

The step that ends an episode carries ``info["episode_metrics"] = {"success": 0.0 or 1.0}``. :func:`solve`
(a search over combinations) serves the demonstrator. Fork method ``state_codec``. The arithmetic, the solver, the
expression reader and the generator are :mod:`envs.suite.countdown_puzzle`; this module is the env.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np

from envs.actions import ToolCall, bind_arguments, format_action
from envs.core import Action, IllegalActionError, Outcome, TextEnv
from envs.features import mixed_demo
from envs.suite.countdown_puzzle import (
    OPS,
    PRECEDENCE,
    ExpressionError,
    combine,
    evaluate,
    expression_of,
    generate_puzzle,
    solve,
    valid_combinations,
)
from envs.tool_calls import function_tool

__all__ = ["CountdownEnv", "ExpressionError", "evaluate", "expression_of", "generate_puzzle", "solve"]

#: RAGEN's scores: a right answer, and a well-formed answer (the numbers used as required) that misses.
SCORE, FORMAT_SCORE = 1.0, 0.1
MODES = ("single", "multi")
MIN_COUNT, MAX_COUNT = 3, 5
MAX_NUMBER = 1000
MAX_TARGET = 1_000_000
MAX_TURNS = 64


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
    return value


class CountdownEnv(TextEnv):
    """Countdown-v0 (see module docstring): RAGEN's Countdown, single-turn ``answer`` or multi-turn ``combine``.

    Args:
        max_turns: turn budget, 1..64, or None (default): the turns the task needs plus one, since a refused call
            (not a tool call of the mode) takes a turn: 2 in ``"single"`` mode (RAGEN's one answer),
            ``num_count`` in ``"multi"`` mode (``num_count - 1`` combinations).
        mode: ``"single"`` (default) or ``"multi"``.
        num_count: how many numbers, 3..5 (default 4; RAGEN's puzzles have 3 or 4).
        min_number: the smallest number drawn, 1..1000 (default 1).
        max_number: the largest number drawn, min_number..1000 (default 100).
        max_target: the largest target, 1..1,000,000 (default 100); see :func:`generate_puzzle`.
        use_all: True (default, RAGEN's scoring): use every number exactly once; False: each at most once.
        render_mode: ``None`` or ``"ansi"``.

    Raises:
        ValueError: on a setting of the wrong type or out of range.
    """

    max_observation_length = 2048
    max_action_length = 512
    fork_method = "state_codec"

    def __init__(self, max_turns: int | None = None, mode: str = "single", num_count: int = 4, min_number: int = 1,
                 max_number: int = 100, max_target: int = 100, use_all: bool = True, render_mode: str | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        _int_in("num_count", num_count, MIN_COUNT, MAX_COUNT)
        _int_in("min_number", min_number, 1, MAX_NUMBER)
        _int_in("max_number", max_number, min_number, MAX_NUMBER)
        _int_in("max_target", max_target, 1, MAX_TARGET)
        if not isinstance(use_all, bool):
            raise ValueError(f"use_all must be true or false, got {use_all!r}")
        turns = max_turns if max_turns is not None else (2 if mode == "single" else num_count)
        _int_in("max_turns", turns, 1, MAX_TURNS)
        super().__init__(max_turns=turns, render_mode=render_mode, kwargs={
            "max_turns": max_turns, "mode": mode, "num_count": num_count, "min_number": min_number,
            "max_number": max_number, "max_target": max_target, "use_all": use_all})
        self.mode, self.num_count, self.use_all = mode, num_count, use_all
        self.min_number, self.max_number, self.max_target = min_number, max_number, max_target
        self._nums: list[int] = []
        self._target = 0
        self._pool: list[int] = []
        self._menu: list[str] = []

    # ----------------------------------------------------------------- episode
    def _reset_task(self, options: dict[str, Any] | None) -> str:
        if options:
            raise ValueError(f"Countdown takes no reset options, got {sorted(options)}")
        rng = self.np_random
        self._nums, self._target = generate_puzzle(rng, self.num_count, self.min_number, self.max_number,
                                                   self.max_target, self.use_all)
        self._pool = list(self._nums)
        self._menu = self._draw_menu(rng) if self.mode == "single" else []
        rule = "each number exactly once" if self.use_all else "each number at most once"
        if self.mode == "single":
            how = ("Answer with one expression, answer('(8 - 2) * 4'): reward 1 if it equals the target, 0.1 if it "
                   "uses the numbers right but misses, 0 otherwise.")
        else:
            end = "the last number left" if self.use_all else "any number you make"
            how = ("Combine two numbers per turn with combine(a, op, b), op one of '+', '-', '*', '/': they are "
                   f"replaced by the result, which must be a positive integer. Reward 1 when {end} is the target, "
                   "0.1 when you end on another number.")
        return (f"Countdown: make the target from the numbers with + - * /, using {rule}.\n"
                f"Target: {self._target}, nums: {self._nums}\n{how}\n{self._prompt()}")

    def _draw_menu(self, rng: np.random.Generator) -> list[str]:
        """The single-turn menu: a right expression, three wrong ones over the numbers, one using a number twice."""
        plan = solve(tuple(self._nums), self._target, self.use_all)
        right = expression_of(self._nums, plan or ())
        menu = {right}
        for _ in range(60):
            if len(menu) >= 4:
                break
            nums = [int(x) for x in rng.permutation(self._nums)]
            text = str(nums[0])
            for n in nums[1:]:
                op = OPS[int(rng.integers(len(OPS)))]
                text = f"({text}) {op} {n}" if PRECEDENCE[op] == 2 and " " in text else f"{text} {op} {n}"
            value, _ = evaluate(text)
            if value != self._target:
                menu.add(text)
        twice = list(self._nums) + [self._nums[0]]
        menu.add(" + ".join(str(n) for n in twice))
        return sorted(format_action("answer", t) for t in menu)

    def _prompt(self) -> str:
        left = f"{self.max_turns - self._turn} turn(s) left"
        if self.mode == "single":
            return f"Turn {self._turn + 1} of {self.max_turns} ({left}): call answer(expression)."
        return (f"Turn {self._turn + 1} of {self.max_turns} ({left}). Target {self._target}, numbers {self._pool}: "
                "call combine(a, op, b).")

    def _legal_actions(self) -> list[str]:
        if self.mode == "single":
            return list(self._menu)
        return [format_action("combine", a, op, b) for a, op, b, _ in valid_combinations(tuple(sorted(self._pool)))]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The mode's tool as a JSON-schema definition (:class:`envs.features.ToolSchemas`): ``answer(expression)``
        in ``"single"`` mode, ``combine(a, op, b)`` in ``"multi"`` mode."""
        if self.mode == "single":
            return [function_tool("answer", "answer with one arithmetic expression over the numbers (ends the "
                                  "episode; reward 1 if it equals the target, 0.1 if only the numbers are right)",
                                  {"expression": {"type": "string", "description": "e.g. '(8 - 2) * 4'"}})]
        return [function_tool("combine", "replace two numbers of the pool by a op b (a positive integer)", {
            "a": {"type": "integer", "minimum": 1, "description": "a number of the pool"},
            "op": {"type": "string", "enum": list(OPS), "description": "the operation"},
            "b": {"type": "integer", "minimum": 1, "description": "another number of the pool"}})]

    def _act(self, call: ToolCall) -> Outcome:
        if self.mode == "single":
            if call.name != "answer":
                raise IllegalActionError(f"this env has one tool: answer(expression), e.g. answer('(8 - 2) * 4'); "
                                         f"got {call.text()}.")
            expression = bind_arguments(call, ["expression"]).get("expression")
            if not isinstance(expression, str):
                raise IllegalActionError("answer(expression) takes the expression as a quoted string, e.g. "
                                         f"answer('(8 - 2) * 4'); got {call.text()}.")
            return self._answer(expression)
        if call.name != "combine":
            raise IllegalActionError(f"this env has one tool: combine(a, op, b) with op one of '+', '-', '*', '/'; "
                                     f"got {call.text()}.")
        args = bind_arguments(call, ["a", "op", "b"])
        a, op, b = args.get("a"), args.get("op"), args.get("b")
        if type(a) is not int or type(b) is not int or op not in OPS:
            raise IllegalActionError(f"combine(a, op, b) takes two ints of the pool and op one of '+', '-', '*', "
                                     f"'/', e.g. combine(8, '-', 2); got {call.text()}.")
        need = Counter([a, b])
        have = Counter(self._pool)
        if any(have[n] < k for n, k in need.items()):
            raise IllegalActionError(f"combine needs two numbers of the pool {self._pool}; got {call.text()}.")
        result = combine(a, op, b)
        if result is None:
            raise IllegalActionError(f"{a} {op} {b} is not a positive integer; the result must be one.")
        pool = list(self._pool)  # a new list: forks share the old one (a shallow copy)
        pool.remove(a)
        pool.remove(b)
        self._pool = pool + [result]
        text = f"{a} {op} {b} = {result}. Numbers left: {self._pool}."
        made = result == self._target and (not self.use_all or len(self._pool) == 1)
        if made:
            return Outcome(f"{text} You made the target {self._target}.", reward=SCORE, terminated=True,
                           reason="answered", info={"success": True})
        if len(self._pool) == 1:
            return Outcome(f"{text} One number is left and it is not the target {self._target}.",
                           reward=FORMAT_SCORE, terminated=True, reason="answered", info={"success": False})
        return Outcome(text)

    def _answer(self, expression: str) -> Outcome:
        try:
            value, used = evaluate(expression)
        except ExpressionError as exc:
            return Outcome(f"answer({expression!r}) is not an arithmetic expression ({exc}): reward 0.", reward=0.0,
                           terminated=True, reason="answered", info={"success": False})
        given, counted = Counter(self._nums), Counter(used)
        well_formed = counted == given if self.use_all else bool(used) and not counted - given
        if not well_formed:
            rule = "every number exactly once" if self.use_all else "each number at most once"
            return Outcome(f"answer({expression!r}) does not use {rule} ({self._nums}): reward 0.", reward=0.0,
                           terminated=True, reason="answered", info={"success": False})
        if value != self._target:
            shown = "undefined (a division by zero)" if value is None else f"{value}"
            return Outcome(f"answer({expression!r}) = {shown}, not {self._target}: reward {FORMAT_SCORE:g}.",
                           reward=FORMAT_SCORE, terminated=True, reason="answered", info={"success": False})
        return Outcome(f"answer({expression!r}) = {self._target}: correct, reward {SCORE:g}.", reward=SCORE,
                       terminated=True, reason="answered", info={"success": True})

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; at the episode's end ``info["episode_metrics"]`` (module docstring)."""
        out = TextEnv.step(self, action)
        if self._done:
            out[4]["episode_metrics"] = {"success": float(out[1] == SCORE and out[2])}
        return out

    # ----------------------------------------------------------------- state codec
    def _task_state(self) -> dict[str, Any]:
        return {"nums": list(self._nums), "target": self._target, "pool": list(self._pool), "menu": list(self._menu)}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        self._nums = [int(n) for n in state["nums"]]
        self._target = int(state["target"])
        self._pool = [int(n) for n in state["pool"]]
        self._menu = [str(m) for m in state["menu"]]

    # ----------------------------------------------------------------- reference policies
    def solution(self) -> tuple[tuple[int, str, int], ...] | None:
        """Combinations that make the target from the current pool (:func:`solve`), or None when none does (after
        combinations that lost it). Reads the visible numbers and target only."""
        return solve(tuple(sorted(self._pool)), self._target, self.use_all)

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """A demonstration action (:class:`envs.features.Demonstrator`), from the visible numbers and target.

        With probability ``skill`` the solver's play (:meth:`solution`): in ``"single"`` mode the expression of
        a solution, in ``"multi"`` mode the next combination of a solution from the current pool. Else, and when
        the pool has lost every solution, a uniformly random action of ``info["legal_actions"]``. ``skill=1``
        solves every puzzle (each is solvable by construction).

        Raises:
            ValueError: if ``skill`` is outside [0, 1].
        """
        return mixed_demo(rng, skill, self._solver_action, self._legal_actions)

    def _solver_action(self) -> str | None:
        """The solver's play of :meth:`demo_action`, or None when the pool has lost every solution."""
        plan = self.solution()
        if plan is not None and self.mode == "single":
            return format_action("answer", expression_of(self._pool, plan))
        if plan:
            return format_action("combine", *plan[0])
        return None
