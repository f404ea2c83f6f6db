"""Sokoban-v0: push every box onto a target, in RAGEN's text form, on rooms generated from the seed.

The task form is RAGEN's (RAGEN / StarPO, arXiv 2504.20073), which plays the rules of DeepMind's Sokoban
(Imagination-Augmented Agents, arXiv 1707.06203) as gym-sokoban implements them. The room is shown as a grid of
symbols, one row per line:

====  ==================
``#``  wall
``_``  empty floor
``O``  target
``√``  box on a target
``X``  box
``P``  player
``S``  player on a target
====  ==================

Actions are four tools without arguments, ``Up()``, ``Down()``, ``Left()`` and ``Right()`` (RAGEN's action
names); all four are legal on every turn (``info["legal_actions"]``, the whole finite ``action_vocabulary``).
A move walks the player one cell; walking into a box pushes it one cell when the cell beyond is floor or an
empty target; a wall, or a box that cannot move, leaves everything in place (the turn and its step penalty
are spent all the same, as in RAGEN).

Rewards (gym-sokoban's, which RAGEN keeps): ``-0.1`` per move, ``+1`` for each box pushed onto a target, ``-1``
for each box pushed off a target, and ``+10`` on the move that puts the last box on a target. That move
*terminates* the episode (``termination_reason="answered"``: the task is done); running out of ``max_turns``
*truncates* it. The step that ends an episode carries ``info["episode_metrics"] = {"success": 0.0 or 1.0,
"boxes_on_target": n}``.

Rooms are generated at ``reset`` from ``self.np_random`` only (:func:`generate_room`), solvable within
``max_turns`` moves by construction: the boxes start on their targets and a *reverse play* pulls them away
(the player walks, and may drag a box it steps away from); replayed backwards, the reverse moves are a
solution of at most ``max_turns`` moves. :func:`solve` (A* over (player, boxes) states with a node cap) finds
a shortest solution; the demonstrator and the tests use it. The puzzle itself (symbols, moves, generation, the
solver) is :mod:`envs.suite.sokoban_puzzle`; this module is the env.

Fork method ``state_codec``: the task state is the room's walls and targets, the box cells and the player cell
(plain JSON lists).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from envs.actions import ToolCall, format_action
from envs.core import Action, IllegalActionError, Outcome, TextEnv
from envs.features import mixed_demo
from envs.suite.sokoban_puzzle import MOVES, SOLVER_NODE_CAP, TARGET, apply_move, generate_room, render_room, solve
from envs.tool_calls import function_tool

__all__ = ["MOVES", "SokobanEnv", "generate_room", "render_room", "solve"]

#: gym-sokoban's rewards, as RAGEN uses them.
STEP_PENALTY, BOX_ON_TARGET_REWARD, BOX_OFF_TARGET_PENALTY, SOLVED_REWARD = -0.1, 1.0, -1.0, 10.0

MIN_DIM, MAX_DIM = 5, 10
MAX_BOXES = 3
MAX_TURNS = 200
MAX_SEARCH_DEPTH = 2000
MAX_ROOMS = 10_000


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
    return value


class SokobanEnv(TextEnv):
    """Sokoban-v0 (see module docstring): RAGEN's text Sokoban on seeded rooms solvable by construction.

    Args:
        max_turns: the move budget T, 1..200 (default 10, the 10 actions per episode of RAGEN's SimpleSokoban);
            every room is solvable within it.
        dim: room size with its border walls: an int 5..10 (square, default 6 as RAGEN's 6x6) or
            ``[rows, cols]``, each 5..10.
        num_boxes: boxes and targets, 1..3 (default 1, as RAGEN's SimpleSokoban).
        search_depth: generation budget, 1..2000 reverse-play moves per layout tried (default 300, the default
            of RAGEN's config): more finds more scrambled rooms, and costs reset time linearly.
        n_rooms: ``None`` (default: a new room per episode) or a pool size 1..10,000: the episode plays room
            ``k`` of a fixed pool, ``k`` drawn from ``np_random`` (so ``reset(seed=s)`` always plays the same room of
            the pool), the room generated from ``numpy.random.default_rng(k)``: a fixed set of tasks, as in
            forkyard/Household-v0's ``n_games`` (a tabular policy can learn rooms that recur).
        render_mode: ``None`` or ``"ansi"``.

    Raises:
        ValueError: on a setting of the wrong type or out of range.
    """

    max_observation_length = 2048
    max_action_length = 256
    fork_method = "state_codec"

    def __init__(self, max_turns: int = 10, dim: int | list[int] | tuple[int, int] = 6, num_boxes: int = 1,
                 search_depth: int = 300, n_rooms: int | None = None, render_mode: str | None = None):
        _int_in("max_turns", max_turns, 1, MAX_TURNS)
        if n_rooms is not None:
            _int_in("n_rooms", n_rooms, 1, MAX_ROOMS)
        if isinstance(dim, (list, tuple)):
            if len(dim) != 2:
                raise ValueError(f"dim must be an int or [rows, cols], got {dim!r}")
            rows = _int_in("dim[0] (rows)", dim[0], MIN_DIM, MAX_DIM)
            cols = _int_in("dim[1] (cols)", dim[1], MIN_DIM, MAX_DIM)
            recorded: int | list[int] = [rows, cols]
        else:
            rows = cols = _int_in("dim", dim, MIN_DIM, MAX_DIM)
            recorded = rows
        _int_in("num_boxes", num_boxes, 1, MAX_BOXES)
        _int_in("search_depth", search_depth, 1, MAX_SEARCH_DEPTH)
        record: dict[str, Any] = {"max_turns": max_turns, "dim": recorded, "num_boxes": num_boxes,
                                  "search_depth": search_depth}
        if n_rooms is not None:
            record["n_rooms"] = n_rooms
        super().__init__(max_turns=max_turns, render_mode=render_mode, kwargs=record)
        self.rows, self.cols, self.num_boxes, self.search_depth = rows, cols, num_boxes, search_depth
        self.n_rooms = n_rooms
        self._layout: tuple[str, ...] = ()
        self._boxes: tuple[int, ...] = ()
        self._player = 0

    # ----------------------------------------------------------------- episode
    def _reset_task(self, options: dict[str, Any] | None) -> str:
        if options:
            raise ValueError(f"Sokoban takes no reset options, got {sorted(options)}")
        rng = self.np_random
        if self.n_rooms is not None:
            rng = np.random.default_rng(int(rng.integers(self.n_rooms)))
        self._layout, self._boxes, self._player, _ = generate_room(
            rng, self.rows, self.cols, self.num_boxes, self.max_turns, self.search_depth)
        return (
            "Sokoban: you are the player in a room; push every box onto a target. Symbols: # wall, _ empty, "
            "O target, √ box on target, X box, P player, S player on target. Up(), Down(), Left() and Right() "
            "move you one cell; walking into a box pushes it one cell if the cell beyond is free. You cannot "
            "pull a box, nor push two at once. Rewards: -0.1 per move, +1 for a box pushed onto a target, -1 for "
            f"one pushed off, +10 when every box is on a target. You have {self.max_turns} move(s).\n"
            f"{self.grid()}\n{self._prompt()}"
        )

    def grid(self) -> str:
        """The current room as RAGEN's text grid (module docstring), one row per line."""
        return render_room(self._layout, self._boxes, self._player)

    def _state_text(self) -> str:
        """The room alone (:meth:`grid`), without the step's ``"Left: moved."`` line."""
        return self.grid() if self._layout else super()._state_text()

    def _on_target(self, boxes: tuple[int, ...]) -> int:
        return sum(self._layout[b // self.cols][b % self.cols] == TARGET for b in boxes)

    def _prompt(self) -> str:
        return (f"Turn {self._turn + 1} of {self.max_turns}, {self._on_target(self._boxes)}/{self.num_boxes} "
                "box(es) on target: call Up(), Down(), Left() or Right().")

    def _legal_actions(self) -> list[str]:
        return [format_action(name) for name in MOVES]

    @property
    def action_vocabulary(self) -> list[str]:
        """The four move texts, ``["Up()", "Down()", "Left()", "Right()"]``; every one is legal on every turn."""
        return [format_action(name) for name in MOVES]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The four moves as JSON-schema tool definitions, without parameters (:class:`envs.features.ToolSchemas`)."""
        return [function_tool(name, f"move the player one cell {name.lower()} (pushing a box there if the cell "
                              "beyond it is free); -0.1 per move, +1 per box pushed onto a target, +10 when solved",
                              {}) for name in MOVES]

    def _act(self, call: ToolCall) -> Outcome:
        if call.name not in MOVES:
            raise IllegalActionError(
                f"this env has four tools without arguments: Up(), Down(), Left(), Right(); got {call.text()}.")
        if call.args or call.kwargs:
            raise IllegalActionError(f"{call.name}() takes no arguments; got {call.text()}.")
        before = self._on_target(self._boxes)
        self._boxes, self._player, what = apply_move(self._layout, self._boxes, self._player, call.name, self.cols)
        after = self._on_target(self._boxes)
        reward = STEP_PENALTY
        if after > before:
            reward += BOX_ON_TARGET_REWARD
        elif after < before:
            reward += BOX_OFF_TARGET_PENALTY
        solved = after == self.num_boxes
        if solved:
            reward += SOLVED_REWARD
        said = {"moved": "moved", "wall": "a wall is there: no move", "blocked": "the box cannot move: no move",
                "pushed": "pushed a box" + (" onto a target" if after > before else " off a target"
                                            if after < before else "")}[what]
        text = f"{call.name}: {said}.\n{self.grid()}"
        info: dict[str, Any] = {"action_is_effective": what in ("moved", "pushed"), "success": solved}
        if solved:
            return Outcome(text + "\nEvery box is on a target: solved.", reward=reward, terminated=True,
                           reason="answered", info=info)
        return Outcome(text, reward=reward, info=info)

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; at the episode's end ``info["episode_metrics"]`` (module docstring)."""
        out = TextEnv.step(self, action)
        if self._done:
            on = self._on_target(self._boxes)
            out[4]["episode_metrics"] = {"success": float(on == self.num_boxes), "boxes_on_target": on}
        return out

    # ----------------------------------------------------------------- state codec
    def _task_state(self) -> dict[str, Any]:
        return {"layout": list(self._layout), "boxes": [[b // self.cols, b % self.cols] for b in self._boxes],
                "player": [self._player // self.cols, self._player % self.cols]}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        layout = tuple(str(row) for row in state["layout"])
        if layout and (len(layout) != self.rows or any(len(row) != self.cols for row in layout)):
            raise ValueError(f"a Sokoban layout of {self.rows}x{self.cols} was expected")
        self._layout = layout
        self._boxes = tuple(sorted(int(r) * self.cols + int(c) for r, c in state["boxes"]))
        self._player = int(state["player"][0]) * self.cols + int(state["player"][1])

    # ----------------------------------------------------------------- reference policies
    def optimal_plan(self, max_nodes: int = SOLVER_NODE_CAP) -> tuple[str, ...] | None:
        """A shortest solution from the current position (:func:`solve`: action names), or None when there is
        none (a box pushed where it is stuck) or the solver's node cap was reached. Reads the visible grid only."""
        return solve(self._layout, self._boxes, self._player, max_nodes)

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """A demonstration action (:class:`envs.features.Demonstrator`), from the visible grid only.

        With probability ``skill``, the first move of a shortest solution from the current position
        (:meth:`optimal_plan`); else, and when no solution is found (a stuck box, the node cap), a uniformly
        random move. ``skill=1`` solves every room (each is solvable within ``max_turns``); ``skill=0`` is
        uniformly random legal moves.

        Raises:
            ValueError: if ``skill`` is outside [0, 1].
        """
        return mixed_demo(rng, skill, self._first_move, self._legal_actions)

    def _first_move(self) -> str | None:
        """The first move of :meth:`optimal_plan`, or None when there is none (:meth:`demo_action` plays randomly)."""
        plan = self.optimal_plan()
        return format_action(plan[0]) if plan else None
