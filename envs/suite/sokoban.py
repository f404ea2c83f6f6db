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
a shortest solution; the demonstrator and the tests use it.

Fork method ``state_codec``: the task state is the room's walls and targets, the box cells and the player cell
(plain JSON lists).
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from typing import Any

import numpy as np

from envs.actions import ToolCall, format_action
from envs.core import IllegalActionError, Outcome, TextEnv
from envs.tool_calls import function_tool

#: RAGEN's grid symbols, by what they show.
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "√", "X", "P", "S"
#: RAGEN's action names, in its order (1 Up, 2 Down, 3 Left, 4 Right), with their (row, column) steps.
MOVES: dict[str, tuple[int, int]] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
#: gym-sokoban's rewards, as RAGEN uses them.
STEP_PENALTY, BOX_ON_TARGET_REWARD, BOX_OFF_TARGET_PENALTY, SOLVED_REWARD = -0.1, 1.0, -1.0, 10.0

MIN_DIM, MAX_DIM = 5, 10
MAX_BOXES = 3
MAX_TURNS = 200
MAX_SEARCH_DEPTH = 2000
#: Node cap of the demonstrator's solver (states expanded); a room it cannot solve within it gets random moves.
SOLVER_NODE_CAP = 100_000
_LAYOUT_TRIES = 10  # carved layouts tried per reset before the open-room fallbacks
_PULL_PROBABILITY = 0.85  # how often the reverse play drags a box it stands in front of
_MOMENTUM = 0.5  # how often the reverse play repeats its last move when it can
_RANKED, _RANK_NODE_CAP = 8, 1000  # generation: candidates ranked by their shortest solution, and its state cap


# --------------------------------------------------------------------------- rooms
def _carve_layout(rng: np.random.Generator, rows: int, cols: int, open_room: bool) -> list[bool]:
    """Floor mask of a rows x cols room (row-major, True = floor) with walls all around: a random walk over the
    interior carves the floor, widened now and then by a neighbouring cell; ``open_room`` makes all of it floor."""
    floor = [False] * (rows * cols)
    if open_room:
        for r in range(1, rows - 1):
            for c in range(1, cols - 1):
                floor[r * cols + c] = True
        return floor
    r, c = int(rng.integers(1, rows - 1)), int(rng.integers(1, cols - 1))
    steps = int(1.7 * (rows + cols))
    dr, dc = list(MOVES.values())[int(rng.integers(4))]
    for _ in range(steps):
        floor[r * cols + c] = True
        if rng.random() < 0.5:  # widen the corridor by one neighbour
            nr, nc = r + int(rng.integers(-1, 2)), c + int(rng.integers(-1, 2))
            if 1 <= nr < rows - 1 and 1 <= nc < cols - 1:
                floor[nr * cols + nc] = True
        if rng.random() < 0.35 or not (1 <= r + dr < rows - 1 and 1 <= c + dc < cols - 1):
            dr, dc = list(MOVES.values())[int(rng.integers(4))]
        if 1 <= r + dr < rows - 1 and 1 <= c + dc < cols - 1:
            r, c = r + dr, c + dc
    return floor


def _reverse_play(rng: np.random.Generator, floor: list[bool], cols: int, targets: list[int], player: int,
                  max_moves: int, budget: int) -> list[tuple[tuple[int, int, int], tuple[int, ...], int, list[int]]]:
    """Random reverse plays from the solved position (boxes on ``targets``, the player at ``player``): each walk
    of at most ``max_moves`` moves steps the player to a free neighbouring cell (repeating its last move with
    probability 0.5) and, when it steps away from a box, drags that box along with probability 0.85. ``budget``
    moves in all.

    Returns:
        The positions seen with a box off its target, best first, each ``(score, boxes, player, reverse_moves)``
        (sorted box cells, the player cell, the reverse moves as cell offsets), each position once, reached by
        its shortest reverse walk seen. Score: boxes off target, the boxes' summed Manhattan distance from their
        own targets, the player's distance from the nearest box.
    """
    deltas = [dr * cols + dc for dr, dc in MOVES.values()]
    target_set = set(targets)
    seen: dict[tuple[tuple[int, ...], int], tuple[tuple[int, int, int], tuple[int, ...], int, list[int]]] = {}
    spent = 0
    while spent < budget:
        boxes = list(targets)
        at, walk = player, list[int]()
        for _ in range(min(max_moves, budget - spent)):
            spent += 1
            options = [d for d in deltas if floor[at + d] and at + d not in boxes]
            if not options:
                break
            if walk and walk[-1] in options and rng.random() < _MOMENTUM:
                d = walk[-1]  # keep going: a dragged box travels further
            else:
                d = options[int(rng.integers(len(options)))]
            behind = at - d
            if behind in boxes and rng.random() < _PULL_PROBABILITY:
                boxes[boxes.index(behind)] = at
            at += d
            walk.append(d)
            off = sum(b not in target_set for b in boxes)
            key = (tuple(sorted(boxes)), at)
            if not off or (key in seen and len(seen[key][3]) <= len(walk)):
                continue
            spread = sum(abs(b // cols - o // cols) + abs(b % cols - o % cols)
                         for b, o in zip(boxes, targets, strict=True))
            near = min(abs(b // cols - at // cols) + abs(b % cols - at % cols) for b in boxes)
            seen[key] = ((off, spread, near), key[0], at, list(walk))
        if not walk:
            break  # the player is walled in: no walk will move it
    return sorted(seen.values(), key=lambda c: c[0], reverse=True)


def generate_room(rng: np.random.Generator, rows: int, cols: int, num_boxes: int, max_moves: int,
                  search_depth: int) -> tuple[tuple[str, ...], tuple[int, ...], int, tuple[str, ...]]:
    """A Sokoban room drawn from ``rng``, solvable in at most ``max_moves`` moves by construction.

    The reverse-play idea of gym-sokoban's generator and of Imagination-Augmented Agents (arXiv 1707.06203), in
    our own implementation. Up to 10 layouts are carved (the last one an open room) until one gives a position
    with a box off its target: on a layout, ``num_boxes`` targets are drawn, the player stands beside one (the
    solved position: it just pushed the last box home), and :func:`_reverse_play` spends ``search_depth`` reverse
    moves. Of the 8 best-scored positions found, the one whose shortest solution (:func:`solve`, capped at 1,000
    states) is longest is the start: the hardest room the search saw. If no layout gives a position (only in
    cramped settings), a fixed open-room position is used: one box a single push from its target, the others
    on theirs.

    Args:
        rng: the env's ``numpy.random.Generator`` (the only source of randomness).
        rows, cols: room size with its border walls, each 5..10.
        num_boxes: boxes (= targets), 1..3.
        max_moves: the solution-length bound (the env's ``max_turns``), >= 1.
        search_depth: reverse-play moves per layout, >= 1.

    Returns:
        ``(layout, boxes, player, solution)``: the layout as ``rows`` strings of ``#``, ``_`` and ``O``; the box
        cells and the player cell as row-major indices ``r * cols + c``; a solution as action names
        (``len(solution) <= max_moves``: the reverse walk, replayed backwards).
    """
    names = {dr * cols + dc: name for name, (dr, dc) in MOVES.items()}
    for attempt in range(_LAYOUT_TRIES):
        floor = _carve_layout(rng, rows, cols, open_room=attempt == _LAYOUT_TRIES - 1)
        cells = [i for i, f in enumerate(floor) if f]
        if len(cells) < num_boxes + 1:
            continue
        picks = rng.choice(len(cells), size=num_boxes, replace=False)
        targets = [cells[int(i)] for i in picks]
        beside = [t + dr * cols + dc for t in targets for dr, dc in MOVES.values()]
        beside = [c for c in beside if floor[c] and c not in targets]
        if not beside:
            continue
        player = beside[int(rng.integers(len(beside)))]
        found = _reverse_play(rng, floor, cols, targets, player, max_moves, search_depth)
        if not found:
            continue
        layout = _layout_text(floor, set(targets), rows, cols)
        best, best_len = found[0], -1
        for cand in found[:_RANKED]:
            plan = _astar(layout, cand[1], cand[2], _RANK_NODE_CAP)
            length = len(cand[3]) if plan is None else len(plan)  # capped: at most its own walk
            if length > best_len:
                best, best_len = cand, length
        _score, boxes, start, walk = best
        return layout, boxes, start, tuple(names[-d] for d in reversed(walk))
    # The fallback: seen only in cramped settings with tiny budgets (5x5 rooms with max_turns or search_depth of
    # 1 or 2, in a few percent of seeds; never at the defaults); it keeps reset from ever failing.
    floor = _carve_layout(rng, rows, cols, open_room=True)
    targets = [1 * cols + 1 + k for k in range(num_boxes)]
    boxes = tuple(sorted([2 * cols + 1] + targets[1:]))
    return _layout_text(floor, set(targets), rows, cols), boxes, 3 * cols + 1, ("Up",)


def _layout_text(floor: list[bool], targets: set[int], rows: int, cols: int) -> tuple[str, ...]:
    return tuple("".join(TARGET if r * cols + c in targets else FLOOR if floor[r * cols + c] else WALL
                         for c in range(cols)) for r in range(rows))


def render_room(layout: tuple[str, ...] | list[str], boxes: tuple[int, ...] | list[int], player: int) -> str:
    """The room as RAGEN's text grid: ``len(layout)`` lines of symbols (module docstring).

    Args:
        layout: rows of ``#`` (wall), ``_`` (floor) and ``O`` (target).
        boxes: box cells, row-major indices.
        player: the player's cell, a row-major index.
    """
    cols = len(layout[0])
    flat = list("".join(layout))
    for b in boxes:
        flat[b] = BOX_ON_TARGET if flat[b] == TARGET else BOX
    flat[player] = PLAYER_ON_TARGET if flat[player] == TARGET else PLAYER
    return "\n".join("".join(flat[r * cols:(r + 1) * cols]) for r in range(len(layout)))


# --------------------------------------------------------------------------- solver
def _push_distances(floor: list[bool], targets: list[int], cols: int) -> list[int]:
    """For every cell, the fewest pushes that bring a box standing there onto some target, other boxes ignored
    (a breadth-first search of pulls from the targets); -1 where no push sequence reaches one (a dead cell)."""
    dist = [-1] * len(floor)
    queue = deque(targets)
    for t in targets:
        dist[t] = 0
    deltas = [dr * cols + dc for dr, dc in MOVES.values()]
    while queue:
        cell = queue.popleft()
        for d in deltas:  # a box at cell - d pushed by a player at cell - 2d lands on cell
            prev, stand = cell - d, cell - 2 * d
            if 0 <= stand < len(floor) and floor[prev] and floor[stand] and dist[prev] < 0:
                dist[prev] = dist[cell] + 1
                queue.append(prev)
    return dist


def solve(layout: tuple[str, ...], boxes: tuple[int, ...], player: int,
          max_nodes: int = SOLVER_NODE_CAP) -> tuple[str, ...] | None:
    """A shortest solution (fewest moves) of a Sokoban position, or None.

    A* over (player cell, box cells) states, one move per edge, with an admissible and consistent heuristic (the
    summed per-box push distance to the nearest target, other boxes ignored) and dead cells (from which no push
    reaches a target) pruned.

    Args:
        layout: rows of ``#``, ``_`` and ``O``, walls all around.
        boxes: box cells (row-major indices).
        player: the player's cell.
        max_nodes: cap on expanded states; past it the search gives up (None).

    Returns:
        The action names of a shortest solution (``()`` when every box is on a target already), or None when the
        position is unsolvable (a box on a dead cell, or no solution) or the cap was reached first.
    """
    key = (tuple(layout), tuple(sorted(boxes)), int(player))
    cached = _PLANS.get(key)
    if cached is not None:
        _PLANS.move_to_end(key)
        return cached
    plan = _astar(*key, max_nodes)
    if plan is not None:  # every state along the plan gets its suffix: the demonstrator replays it cheaply
        _remember_plan(key, plan)
    return plan


_PLANS: OrderedDict[tuple[tuple[str, ...], tuple[int, ...], int], tuple[str, ...]] = OrderedDict()
_PLAN_CACHE_SIZE = 20_000


def _remember_plan(key: tuple[tuple[str, ...], tuple[int, ...], int], plan: tuple[str, ...]) -> None:
    layout, boxes, player = key
    cols = len(layout[0])
    for k in range(len(plan) + 1):
        _PLANS[(layout, boxes, player)] = plan[k:]
        if k < len(plan):
            boxes, player, _ = _apply_move(layout, boxes, player, plan[k], cols)
    while len(_PLANS) > _PLAN_CACHE_SIZE:
        _PLANS.popitem(last=False)


def _astar(layout: tuple[str, ...], boxes: tuple[int, ...], player: int, max_nodes: int) -> tuple[str, ...] | None:
    cols = len(layout[0])
    flat = "".join(layout)
    floor = [ch != WALL for ch in flat]
    targets = [i for i, ch in enumerate(flat) if ch == TARGET]
    dist = _push_distances(floor, targets, cols)
    if any(dist[b] < 0 for b in boxes):
        return None
    moves = [(name, dr * cols + dc) for name, (dr, dc) in MOVES.items()]
    start = (player, boxes)
    h0 = sum(dist[b] for b in boxes)
    best_g = {start: 0}
    parent: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, tuple[int, ...]], str] | None] = {start: None}
    heap: list[tuple[int, int, int, int, tuple[int, ...]]] = [(h0, 0, 0, player, boxes)]
    pushed = 0
    expanded = 0
    while heap:
        _f, neg_g, _n, at, bx = heapq.heappop(heap)
        g = -neg_g
        if best_g.get((at, bx), -1) != g:
            continue
        if all(dist[b] == 0 for b in bx):
            path = []
            link = parent[(at, bx)]
            while link is not None:
                path.append(link[1])
                link = parent[link[0]]
            return tuple(reversed(path))
        expanded += 1
        if expanded > max_nodes:
            return None
        for name, d in moves:
            nxt = at + d
            if not floor[nxt]:
                continue
            if nxt in bx:
                beyond = nxt + d
                if not floor[beyond] or beyond in bx or dist[beyond] < 0:
                    continue
                nbx = tuple(sorted(beyond if b == nxt else b for b in bx))
            else:
                nbx = bx
            state = (nxt, nbx)
            if best_g.get(state, 1 << 30) <= g + 1:
                continue
            best_g[state] = g + 1
            parent[state] = ((at, bx), name)
            pushed += 1
            heapq.heappush(heap, (g + 1 + sum(dist[b] for b in nbx), -(g + 1), pushed, nxt, nbx))
    return None


def _apply_move(layout: tuple[str, ...], boxes: tuple[int, ...], player: int, name: str,
                cols: int) -> tuple[tuple[int, ...], int, str]:
    """One move: ``(boxes, player, what)``, ``what`` one of ``moved``, ``pushed``, ``wall``, ``blocked``."""
    dr, dc = MOVES[name]
    d = dr * cols + dc
    flat_at = layout[(player + d) // cols][(player + d) % cols]
    if flat_at == WALL:
        return boxes, player, "wall"
    if player + d not in boxes:
        return boxes, player + d, "moved"
    beyond = player + 2 * d
    if layout[beyond // cols][beyond % cols] == WALL or beyond in boxes:
        return boxes, player, "blocked"
    return tuple(sorted(beyond if b == player + d else b for b in boxes)), player + d, "pushed"


# --------------------------------------------------------------------------- the env
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
        render_mode: ``None`` or ``"ansi"``.

    Raises:
        ValueError: on a setting of the wrong type or out of range.
    """

    max_observation_length = 2048
    max_action_length = 256
    fork_method = "state_codec"

    def __init__(self, max_turns: int = 10, dim: int | list[int] | tuple[int, int] = 6, num_boxes: int = 1,
                 search_depth: int = 300, render_mode: str | None = None):
        _int_in("max_turns", max_turns, 1, MAX_TURNS)
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
        super().__init__(max_turns=max_turns, render_mode=render_mode, kwargs={
            "max_turns": max_turns, "dim": recorded, "num_boxes": num_boxes, "search_depth": search_depth})
        self.rows, self.cols, self.num_boxes, self.search_depth = rows, cols, num_boxes, search_depth
        self._layout: tuple[str, ...] = ()
        self._boxes: tuple[int, ...] = ()
        self._player = 0

    # ----------------------------------------------------------------- episode
    def _reset_task(self, options: dict[str, Any] | None) -> str:
        if options:
            raise ValueError(f"Sokoban takes no reset options, got {sorted(options)}")
        self._layout, self._boxes, self._player, _ = generate_room(
            self.np_random, self.rows, self.cols, self.num_boxes, self.max_turns, self.search_depth)
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
        self._boxes, self._player, what = _apply_move(self._layout, self._boxes, self._player, call.name, self.cols)
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

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
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
        if not 0.0 <= skill <= 1.0:
            raise ValueError(f"skill must be in [0, 1], got {skill!r}")
        if skill and rng.random() < skill:
            plan = self.optimal_plan()
            if plan:
                return format_action(plan[0])
        return rng.choice(self._legal_actions())
