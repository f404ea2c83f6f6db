"""Any Gymnasium env with Discrete (or Text) actions as a forkable forkyard :class:`~envs.core.TextEnv`.

:class:`GymTextEnv` wraps one Gymnasium env, *the wrapped env*, named by its id in Gymnasium's registry
(``gym_id``), and makes it a multi-turn text env with fork, snapshot and restore (issue 32, section 1). It is
registered once, as ``forkyard/Gym-v0``: ``gymnasium.make("forkyard/Gym-v0", gym_id="Taxi-v4")``, the server's
``/v1/envs`` (``{"env_id": "forkyard/Gym-v0", "kwargs": {"gym_id": "Taxi-v4", "gym_kwargs": {"is_rainy": true}}}``)
and ``envs.trl.environment_factory("forkyard/Gym-v0", gym_id="Blackjack-v1")`` reach every allowed env with no glue.

Actions
    A Discrete(n) action space becomes n tools without arguments, one per action, named from a small table per
    env (FrozenLake ``left down right up``, Taxi ``south north east west pickup dropoff``, CliffWalking ``up right
    down left``, Blackjack ``stick hit``, MiniGrid ``turn_left turn_right forward pickup drop toggle finish``) or
    from the ``action_names`` kwarg; an env with neither gets one tool ``act(a)`` with the integer action
    (``start <= a < start + n``). A ``gymnasium.spaces.Text`` action space becomes ``act(text)``. Every turn
    ``info["legal_actions"]`` lists the menu: all n action texts for a Discrete space (the wrapped env accepts
    each of them in every state), a fixed curated handful for a Text space (the env's own menu where its profile
    has one, else four strings drawn once from the space with seed 0: the action set itself stays open).
Observations
    Text, built per env (:attr:`GymTextEnv.observation_source` says which): ``"ansi"`` is the wrapped env's own
    ``ansi`` render (CliffWalking; ANSI colour codes removed); ``"state"`` is a rendering we build from the
    wrapped env's state, used where the ``ansi`` render marks the player by colour alone, so that without colour
    the text would not say where the player is (FrozenLake: RAGEN's grid symbols; Taxi: the map with the taxi
    and a sentence on the passenger and destination) or where there is no ``ansi`` render (MiniGrid: the full
    grid, the agent's heading, the cell in front and what it carries); ``"described"`` is the Gymnasium
    observation written out (Blackjack's ``(player sum, dealer card, usable ace)``; any other env without an
    ``ansi`` render). The first observation adds the rules, the legend and the action menu.
Reward, terminated, truncated
    The wrapped env's reward, as a float. Wrapped ``terminated`` (the game ended: goal reached, hole, bust,
    passenger delivered) -> ``terminated`` with ``termination_reason="answered"`` (the one terminal reason of
    :data:`envs.core.TERMINATION_REASONS`); wrapped ``truncated`` (the env's own step limit, e.g. MiniGrid's
    ``max_steps``) -> ``truncated`` with ``"max_turns"``. Gymnasium's ``TimeLimit`` wrapper is not applied
    (the bare env is wrapped): forkyard's turn budget ``max_turns`` (default: the id's ``max_episode_steps``, or
    a per-env default) truncates, as in every TextEnv. At an episode's end ``info["episode_metrics"] =
    {"success": 0.0 or 1.0, "return": summed reward}``; success per env: FrozenLake goal reached, Taxi passenger
    delivered, CliffWalking goal reached, Blackjack hand won, MiniGrid reward > 0, otherwise return > 0.

Fork and snapshot (``fork_method``; ``"auto"`` takes the first that the wrapped env allows, and
:attr:`GymTextEnv.fork_method` declares the one taken):

``"state_codec"``
    The wrapped env's own state codec. The protocol: a codec is a pair ``get_state(env) -> state`` and
    ``set_state(env, state)`` where ``state`` is plain JSON data (dicts, lists, str, int, float, bool, None)
    and ``set_state(fresh, get_state(env))`` on a fresh env built with the same kwargs (reset or not) makes it
    continue exactly as ``env`` would: same observations, rewards and RNG draws (the codec includes the wrapped
    env's ``np_random.bit_generator.state``). A wrapped env offers it with methods ``get_state()`` and
    ``set_state(state)``; the toy-text envs, which keep their state in a few attributes, get one from the table
    here (FrozenLake and CliffWalking ``s``, ``lastaction``; Taxi also ``fickle_step``, ``taxi_orientation``;
    Blackjack the ``player`` and ``dealer`` hands and the dealer's face card). Fork sets the state on a fresh
    wrapped env (for the toy-text envs on a shallow copy, whose transition table and map are constants:
    :attr:`StateCodec.share_constants`); the snapshot carries the state, so it restores in another process.
``"deepcopy"``
    ``copy.deepcopy`` of the wrapped env (MiniGrid: its grid of objects has no codec): in-process fork only. Its
    snapshot restores by the verified replay below (the snapshot carries the seed and the action log).
``"replay"``
    Fork and restore rebuild the wrapped env, reset it with the episode's recorded seed and replay the action
    log, **verifying** every step against the record (a BLAKE2b digest of the raw observation and its text,
    the reward, terminated, truncated). A replay that differs raises :class:`ReplayDivergedError` naming the
    env and the step: never a silently different copy (an env that draws from an unseeded global RNG is refused).

Every episode resets the wrapped env with a seed drawn from this env's ``np_random``, so ``reset(seed=s)`` is a
fresh env's episode for ``s`` and replays are possible for any env that is deterministic given its seed.

Security: kwargs come from untrusted clients of a server. ``gym_id`` must be an id of :data:`GYM_PROFILES` (the
allow-list: the toy-text and MiniGrid ids tested here), never a ``module:Id`` form; the adapter makes only ids
already in Gymnasium's registry (it imports a package only from that table, minigrid for ``MiniGrid-*``, never
one a client names). ``gym_kwargs`` (a JSON object or its text, at most 4096 characters) may hold only the keys
the id's profile allows, each checked for type and range. An operator adds ids in-process with
:func:`allow_gym_id`, never through kwargs.

The package of the field beyond Gymnasium: minigrid 3.2 (Farama). It is Gymnasium-native (its ids join
Gymnasium's registry, Discrete actions, ``reset(seed=...)`` seeds its ``np_random``), so it tests the adapter
as it is, and it is the case the toy-text envs do not cover: no text render (the text is built from the grid
state) and no state codec (fork by ``deepcopy``, snapshots by verified replay). TextArena's games are
multi-player with their own API, and reasoning-gym is datasets of single-turn questions, not envs with a
Gymnasium action space: adapting either would test glue rather than the adapter.

Demonstrators (``demo_action(rng, skill)``; with probability ``skill`` the scripted action, else a uniformly
random legal one), from the visible state: FrozenLake, Taxi and CliffWalking greedy on a finite-horizon
dynamic programme (discount 0.999, horizon = the turns left) over the transition table ``P`` the env publishes,
which follows from the visible map and the documented rules (shortest paths where moves are deterministic, the
most likely success on slippery ice); Blackjack the basic strategy for hit / stick (Sutton & Barto, Reinforcement
Learning, 2nd ed., ch. 5); MiniGrid breadth-first search over (cell, heading) on the visible grid, to the goal,
or first to the key and the door it opens.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import keyword
import random
import re
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.actions import ToolCall, bind_arguments, format_action
from envs.core import IllegalActionError, Outcome, TextEnv
from envs.tool_calls import function_tool

#: The fork methods a :class:`GymTextEnv` can take (``"auto"`` picks the first the wrapped env allows).
GYM_FORK_METHODS = ("state_codec", "deepcopy", "replay")
MAX_TURNS_LIMIT = 1000
MAX_GYM_KWARGS_CHARS = 4096
#: Tool names a client's ``action_names`` may not take: TRL's tool-env protocol members and our generic tool.
RESERVED_TOOL_NAMES = frozenset({"reset", "step", "close", "get_reward", "env", "rewards", "done", "info", "act"})
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class ReplayDivergedError(RuntimeError):
    """A fork or restore by seeded replay did not reproduce the recorded episode (the wrapped env is not
    deterministic given its seed and actions): the copy is refused rather than silently different."""


# --------------------------------------------------------------------------- kwargs validation
def _v_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"gym_kwargs[{name!r}] must be true or false, got {value!r}")
    return value


def _v_float(lo: float, hi: float) -> Callable[[str, Any], float]:
    def check(name: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= float(value) <= hi:
            raise ValueError(f"gym_kwargs[{name!r}] must be a number in [{lo}, {hi}], got {value!r}")
        return float(value)
    return check


def _v_int(lo: int, hi: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"gym_kwargs[{name!r}] must be an int in {lo}..{hi}, got {value!r}")
        return value
    return check


def _v_choice(*choices: str) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if value not in choices:
            raise ValueError(f"gym_kwargs[{name!r}] must be one of {list(choices)}, got {value!r}")
        return str(value)
    return check


def _v_lake_map(name: str, value: Any) -> list[str]:
    """A FrozenLake ``desc``: 2..12 rows of equal length 2..12 over ``SFHG``, one ``S``, at least one ``G``."""
    ok = (isinstance(value, list) and 2 <= len(value) <= 12 and all(isinstance(r, str) for r in value)
          and len({len(r) for r in value}) == 1 and 2 <= len(value[0]) <= 12
          and set("".join(value)) <= set("SFHG") and "".join(value).count("S") == 1 and "G" in "".join(value))
    if not ok:
        raise ValueError(f"gym_kwargs[{name!r}] must be 2..12 equal rows of 2..12 letters S F H G with one S "
                         f"and a G, got {value!r}")
    return list(value)


def _parse_gym_kwargs(gym_id: str, allowed: Mapping[str, Callable[[str, Any], Any]],
                      gym_kwargs: dict[str, Any] | str | None) -> dict[str, Any]:
    """The checked ``gym_kwargs`` as plain JSON data (a dict), from a dict, its JSON text or None.

    Raises:
        ValueError: text over :data:`MAX_GYM_KWARGS_CHARS`, not a JSON object, a key the id does not allow, or a
            value its check refuses.
    """
    if gym_kwargs is None:
        return {}
    if isinstance(gym_kwargs, str):
        if len(gym_kwargs) > MAX_GYM_KWARGS_CHARS:
            raise ValueError(f"gym_kwargs text is {len(gym_kwargs)} characters long; the limit is "
                             f"{MAX_GYM_KWARGS_CHARS}")
        try:
            gym_kwargs = json.loads(gym_kwargs)
        except json.JSONDecodeError as exc:
            raise ValueError(f"gym_kwargs is not valid JSON: {exc}") from None
    if not isinstance(gym_kwargs, dict):
        raise ValueError(f"gym_kwargs must be a JSON object (dict), got {type(gym_kwargs).__name__}")
    if len(json.dumps(gym_kwargs, default=str)) > MAX_GYM_KWARGS_CHARS:
        raise ValueError(f"gym_kwargs is longer than {MAX_GYM_KWARGS_CHARS} characters as JSON")
    unknown = sorted(str(k) for k in gym_kwargs if k not in allowed)
    if unknown:
        raise ValueError(f"{gym_id} takes no gym_kwargs {unknown} here; allowed: {sorted(allowed) or 'none'}")
    return {k: allowed[k](k, v) for k, v in sorted(gym_kwargs.items())}


# --------------------------------------------------------------------------- state codecs
@dataclass(frozen=True)
class StateCodec:
    """A wrapped env's state codec (module docstring): ``get(env) -> JSON data`` and ``set(env, data)``.

    ``share_constants``: an in-process fork may start from ``copy.copy`` of the wrapped env instead of a fresh one,
    because everything outside the codec's state is constant after construction (the toy-text envs' transition
    table ``P`` and map, built in tens of milliseconds for Taxi); ``set`` then rebinds every mutable attribute."""

    get: Callable[[Any], dict[str, Any]]
    set: Callable[[Any, dict[str, Any]], None]
    share_constants: bool = False


def _rng_get(env: Any) -> dict[str, Any]:
    return dict(env.np_random.bit_generator.state)


def _rng_set(env: Any, state: dict[str, Any]) -> None:
    bitgen = getattr(np.random, state["bit_generator"])()
    bitgen.state = state
    env.np_random = np.random.Generator(bitgen)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _grid_get(env: Any) -> dict[str, Any]:
    return {"s": int(env.s), "lastaction": _opt_int(env.lastaction), "rng": _rng_get(env)}


def _grid_set(env: Any, state: dict[str, Any]) -> None:
    env.s, env.lastaction = int(state["s"]), _opt_int(state["lastaction"])
    _rng_set(env, state["rng"])


def _taxi_get(env: Any) -> dict[str, Any]:
    return {**_grid_get(env), "fickle_step": bool(env.fickle_step), "taxi_orientation": int(env.taxi_orientation)}


def _taxi_set(env: Any, state: dict[str, Any]) -> None:
    _grid_set(env, state)
    env.fickle_step, env.taxi_orientation = bool(state["fickle_step"]), int(state["taxi_orientation"])


def _blackjack_get(env: Any) -> dict[str, Any]:
    return {"player": [int(c) for c in env.player], "dealer": [int(c) for c in env.dealer],
            "suit": str(env.dealer_top_card_suit), "face": str(env.dealer_top_card_value_str), "rng": _rng_get(env)}


def _blackjack_set(env: Any, state: dict[str, Any]) -> None:
    env.player, env.dealer = [int(c) for c in state["player"]], [int(c) for c in state["dealer"]]
    env.dealer_top_card_suit, env.dealer_top_card_value_str = str(state["suit"]), str(state["face"])
    _rng_set(env, state["rng"])


GRID_CODEC = StateCodec(_grid_get, _grid_set, share_constants=True)
TAXI_CODEC = StateCodec(_taxi_get, _taxi_set, share_constants=True)
BLACKJACK_CODEC = StateCodec(_blackjack_get, _blackjack_set, share_constants=True)
#: The documented protocol of a wrapped env with its own codec: methods ``get_state()`` and ``set_state(state)``.
def _method_get(env: Any) -> dict[str, Any]:
    return env.get_state()


def _method_set(env: Any, state: dict[str, Any]) -> None:
    env.set_state(state)


METHOD_CODEC = StateCodec(_method_get, _method_set)


# --------------------------------------------------------------------------- text renderings
def lake_rows(env: Any) -> list[str]:
    """A FrozenLake env's map as ``nrow`` strings over ``SFHG``."""
    return [b"".join(row).decode("ascii") for row in env.desc.tolist()]


#: RAGEN's FrozenLake symbols (RAGEN / StarPO, arXiv 2504.20073): the player, frozen ice (the start included), a
#: hole, the goal, the player in a hole, the player on the goal.
LAKE_LEGEND = "P you | _ frozen ice | O hole | G goal | X you in a hole | √ you on the goal"


def lake_grid(rows: list[str], position: int) -> str:
    """The lake in RAGEN's text form: one line per row, ``P _ O G`` and ``X`` / ``√`` for the player on a hole /
    the goal. ``rows``: the map over ``SFHG``; ``position``: the player's cell, ``row * ncol + col``."""
    ncol = len(rows[0])
    cells = [["O" if ch == "H" else "G" if ch == "G" else "_" for ch in row] for row in rows]
    r, c = divmod(int(position), ncol)
    here = rows[r][c]
    cells[r][c] = "X" if here == "H" else "√" if here == "G" else "P"
    return "\n".join("".join(row) for row in cells)


def _lake_text(env: Any, obs: Any, ended: bool) -> str:
    rows = lake_rows(env)
    r, c = divmod(int(env.s), len(rows[0]))
    return f"{lake_grid(rows, env.s)}\nYou are at row {r}, column {c} (row 0 is the top)."


_TAXI_STANDS = "RGYB"


def _taxi_text(env: Any, obs: Any, ended: bool) -> str:
    row, col, passenger, dest = env.decode(env.s)
    cells = [[ch.decode("ascii") for ch in line] for line in env.desc.tolist()]
    cells[1 + row][2 * col + 1] = "@" if passenger == 4 else "T"
    where = "in the taxi" if passenger == 4 else f"waiting at {_TAXI_STANDS[passenger]}"
    if ended:
        where = f"delivered to {_TAXI_STANDS[dest]}"
    return ("\n".join("".join(line) for line in cells)
            + f"\nTaxi at row {row}, column {col}. Passenger: {where}. Destination: {_TAXI_STANDS[dest]}.")


def _ansi_text(env: Any, obs: Any, ended: bool) -> str:
    text = env.render()
    return _ANSI_ESCAPE.sub("", text if isinstance(text, str) else str(text)).strip("\n")


def _blackjack_text(env: Any, obs: Any, ended: bool) -> str:
    total, dealer, usable = (int(x) for x in obs)
    text = (f"Observation: your sum is {total} (usable ace: {'yes' if usable else 'no'}); the dealer shows "
            f"{'an ace' if dealer == 1 else dealer}.")
    if ended:
        dealer_sum = sum(env.dealer) + (10 if 1 in env.dealer and sum(env.dealer) + 10 <= 21 else 0)
        text += f" Dealer's hand: {', '.join(map(str, env.dealer))} (sum {dealer_sum})."
    return text


def _plain(obs: Any) -> Any:
    """``obs`` as JSON-like plain data for a described observation (arrays over 256 entries summarised)."""
    if isinstance(obs, np.ndarray):
        return obs.tolist() if obs.size <= 256 else f"<array shape {obs.shape} dtype {obs.dtype}>"
    if isinstance(obs, np.generic):
        return obs.item()
    if isinstance(obs, dict):
        return {str(k): _plain(v) for k, v in obs.items()}
    if isinstance(obs, (list, tuple)):
        return [_plain(v) for v in obs]
    return obs


def _described_text(env: Any, obs: Any, ended: bool) -> str:
    return "Observation: " + json.dumps(_plain(obs), default=str)


_MG_SYMBOLS = {"wall": "#", "floor": ".", "goal": "G", "lava": "~", "key": "K", "ball": "O", "box": "B"}
_MG_HEADINGS = ("right", "down", "left", "up")
_MG_AGENT = (">", "v", "<", "^")
_MG_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))
MINIGRID_LEGEND = ("# wall | . empty floor | G goal | ~ lava | K key | B box | O ball | D closed door | L locked "
                   "door | / open door | > v < ^ you, facing right / down / left / up")


def _mg_name(cell: Any) -> str:
    if cell is None:
        return "empty floor"
    if cell.type == "door":
        state = "open" if cell.is_open else "locked" if cell.is_locked else "closed"
        return f"a {state} {cell.color} door"
    if cell.type in ("wall", "lava", "goal", "floor"):
        return {"wall": "a wall", "lava": "lava", "goal": "the goal", "floor": "empty floor"}[cell.type]
    return f"a {cell.color} {cell.type}"


def _minigrid_text(env: Any, obs: Any, ended: bool) -> str:
    grid, (ax, ay), heading = env.grid, (int(env.agent_pos[0]), int(env.agent_pos[1])), int(env.agent_dir)
    lines, objects = [], []
    for y in range(grid.height):
        line = []
        for x in range(grid.width):
            cell = grid.get(x, y)
            if (x, y) == (ax, ay):
                line.append(_MG_AGENT[heading])
            elif cell is None:
                line.append(".")
            elif cell.type == "door":
                line.append("/" if cell.is_open else "L" if cell.is_locked else "D")
            else:
                line.append(_MG_SYMBOLS.get(cell.type, "?"))
            if cell is not None and cell.type not in ("wall", "floor", "lava"):
                objects.append(f"{_mg_name(cell)} at row {y}, column {x}")
        lines.append("".join(line))
    fx, fy = ax + _MG_VEC[heading][0], ay + _MG_VEC[heading][1]
    front = _mg_name(grid.get(fx, fy)) if 0 <= fx < grid.width and 0 <= fy < grid.height else "the edge"
    carrying = _mg_name(env.carrying) if env.carrying is not None else "nothing"
    return (f"Mission: {env.mission}\n" + "\n".join(lines)
            + f"\nYou are at row {ay}, column {ax}, facing {_MG_HEADINGS[heading]}. In front of you: {front}. "
              f"You carry: {carrying}." + (f"\nObjects: {'; '.join(objects)}." if objects else ""))


# --------------------------------------------------------------------------- scripted policies
_DP_CACHE: OrderedDict[str, dict[str, Any]] = OrderedDict()
_DP_LOCK = threading.Lock()
DP_DISCOUNT = 0.999
#: Turns left beyond this are planned as this many (the discounted values have settled by then).
DP_MAX_HORIZON = 300


def tabular_policy(env: "GymTextEnv") -> int:
    """The action of a finite-horizon dynamic programme over the wrapped env's transition table ``P`` (toy-text
    envs: ``P[s][a] = [(prob, next_s, reward, terminated), ...]``), with discount :data:`DP_DISCOUNT` and the
    horizon of the turns left (at most :data:`DP_MAX_HORIZON`); ties go to the lowest action index. Tables are cached
    per model (32 at most), under a lock."""
    wrapped = env._wrapped
    key = env._model_key()
    with _DP_LOCK:
        return _tabular_action(wrapped, key, max(1, min(env.max_turns - env.turn, DP_MAX_HORIZON)))


def _tabular_action(wrapped: Any, key: str, horizon: int) -> int:
    model = _DP_CACHE.get(key)
    if model is None:  # P as padded arrays: successor index and probability (0 for terminal) per outcome
        table = wrapped.P
        n_s, n_a = len(table), len(table[0])
        width = max(len(table[s][a]) for s in range(n_s) for a in range(n_a))
        reward, nxt, prob = np.zeros((n_s, n_a)), np.zeros((n_s, n_a, width), int), np.zeros((n_s, n_a, width))
        for s in range(n_s):
            for a in range(n_a):
                for k, (p, s2, r, done) in enumerate(table[s][a]):
                    reward[s, a] += p * r
                    nxt[s, a, k], prob[s, a, k] = s2, 0.0 if done else p
        model = _DP_CACHE[key] = {"R": reward, "N": nxt, "P": prob, "V": [np.zeros(n_s)]}
        while len(_DP_CACHE) > 32:
            _DP_CACHE.popitem(last=False)
    _DP_CACHE.move_to_end(key)
    values: list[np.ndarray] = model["V"]
    while len(values) < horizon:
        q_all = model["R"] + DP_DISCOUNT * (model["P"] * values[-1][model["N"]]).sum(axis=-1)
        values.append(q_all.max(axis=1))
    s = int(wrapped.s)
    q = model["R"][s] + DP_DISCOUNT * (model["P"][s] * values[horizon - 1][model["N"][s]]).sum(axis=-1)
    return int(np.flatnonzero(q >= q.max() - 1e-12)[0])


def blackjack_policy(env: "GymTextEnv") -> int:
    """Basic strategy for hit (1) / stick (0) from the visible (sum, dealer card, usable ace): soft 19+ stick,
    soft 18 stick against 2..8; hard 17+ stick, 13..16 stick against 2..6, 12 stick against 4..6; else hit."""
    total, dealer, usable = (int(x) for x in env._wrapped._get_obs())
    if usable:
        return 0 if total >= 19 or (total == 18 and 2 <= dealer <= 8) else 1
    if total >= 17 or (13 <= total <= 16 and 2 <= dealer <= 6) or (total == 12 and 4 <= dealer <= 6):
        return 0
    return 1


_MG_LEFT, _MG_RIGHT, _MG_FORWARD, _MG_PICKUP, _MG_DROP, _MG_TOGGLE = range(6)


def _mg_plan(w: Any, target: Callable[[Any], bool], act: int) -> int | None:
    """First action of a shortest (cell, heading) plan until the cell in front satisfies ``target``, then ``act``;
    None when no such state is reachable over empty cells, open doors and the goal (never lava)."""
    grid = w.grid

    def cell(x: int, y: int) -> Any:
        return grid.get(x, y) if 0 <= x < grid.width and 0 <= y < grid.height else False

    def front(x: int, y: int, d: int) -> tuple[int, int]:
        return x + _MG_VEC[d][0], y + _MG_VEC[d][1]

    start = (int(w.agent_pos[0]), int(w.agent_pos[1]), int(w.agent_dir))
    seen = {start}
    queue: deque[tuple[tuple[int, int, int], int | None]] = deque([(start, None)])
    while queue:
        (x, y, d), first = queue.popleft()
        ahead = cell(*front(x, y, d))
        if ahead is not False and target(ahead):
            return act if first is None else first
        steps = [((x, y, (d - 1) % 4), _MG_LEFT), ((x, y, (d + 1) % 4), _MG_RIGHT)]
        if ahead is None or (ahead is not False and ahead.can_overlap() and ahead.type not in ("lava", "goal")):
            steps.append(((*front(x, y, d), d), _MG_FORWARD))
        for state, action in steps:
            if state not in seen:
                seen.add(state)
                queue.append((state, action if first is None else first))
    return None


def minigrid_policy(env: "GymTextEnv") -> int:
    """Scripted MiniGrid play on the visible grid (:func:`_mg_plan`): to the goal if a path is open; else open a
    closed door; else with the key of a locked door in hand, unlock it; else pick that key up."""
    w = env._wrapped
    carrying = w.carrying
    locked = {c.color for c in w.grid.grid if c is not None and c.type == "door" and c.is_locked}
    plans: list[tuple[Callable[[Any], bool], int]] = [
        (lambda c: c is not None and c.type == "goal", _MG_FORWARD),
        (lambda c: c is not None and c.type == "door" and not c.is_open and not c.is_locked, _MG_TOGGLE),
    ]
    if carrying is not None and carrying.type == "key":
        plans.append((lambda c: c is not None and c.type == "door" and c.is_locked and c.color == carrying.color,
                      _MG_TOGGLE))
    elif carrying is None:
        plans.append((lambda c: c is not None and c.type == "key" and c.color in locked, _MG_PICKUP))
    for target, act in plans:
        action = _mg_plan(w, target, act)
        if action is not None:
            return action
    return _MG_LEFT


# --------------------------------------------------------------------------- profiles
Renderer = Callable[[Any, Any, bool], str]


def reached_goal(ret: float, last: float, terminated: bool) -> bool:
    """Success rule: the last reward was positive (FrozenLake's goal, Blackjack's won hand, MiniGrid's mission)."""
    return last > 0


def ended_by_game(ret: float, last: float, terminated: bool) -> bool:
    """Success rule: the game terminated the episode (Taxi's delivery, CliffWalking's goal)."""
    return terminated


@dataclass(frozen=True)
class GymProfile:
    """What the adapter knows of one allowed Gymnasium id.

    Attributes:
        rules: a paragraph on the task (first observation).
        action_names: tool names of the Discrete actions in index order (None: ``act(a)``).
        action_help: one description per action (tool schemas).
        gym_kwargs: the wrapped env's kwargs a client may set, each with its check ``(name, value) -> value``.
        render: ``(wrapped env, raw observation, ended) -> text``; None: ``ansi`` render if any, else described.
        observation_source: ``"ansi"``, ``"state"`` or ``"described"`` (module docstring).
        codec: the wrapped env's state codec, or None (then its ``get_state`` / ``set_state`` methods, if any).
        policy: the scripted demonstrator (``GymTextEnv -> wrapped action``), or None.
        success: ``(episode return, last reward, terminated) -> bool``; None: return > 0.
        max_turns: default turn budget; None: the id's ``max_episode_steps``, else the env's own
            ``max_steps`` attribute, else 100.
        package: a module to import so that the id is in Gymnasium's registry (``"minigrid"``), or None.
        text_menu: ``wrapped env -> list of action strings`` offered as the legal menu of a Text action space.
    """

    rules: str = ""
    action_names: tuple[str, ...] | None = None
    action_help: tuple[str, ...] = ()
    gym_kwargs: Mapping[str, Callable[[str, Any], Any]] = field(default_factory=dict)
    render: Renderer | None = None
    observation_source: str | None = None
    codec: StateCodec | None = None
    policy: Callable[["GymTextEnv"], Any] | None = None
    success: Callable[[float, float, bool], bool] | None = None
    max_turns: int | None = None
    package: str | None = None
    text_menu: Callable[[Any], list[str]] | None = None


_LAKE_KWARGS: dict[str, Callable[[str, Any], Any]] = {
    "is_slippery": _v_bool, "map_name": _v_choice("4x4", "8x8"), "desc": _v_lake_map,
    "success_rate": _v_float(0.0, 1.0)}
FROZENLAKE_PROFILE = GymProfile(
    rules=("FrozenLake: walk from the top-left corner to the goal G over frozen ice without falling into a hole. "
           f"Symbols: {LAKE_LEGEND}. On slippery ice a move may carry you to either side of the direction you "
           "chose. Reward 1 on reaching the goal, else 0; the episode ends at the goal or in a hole."),
    action_names=("left", "down", "right", "up"),
    action_help=("move one cell left", "move one cell down", "move one cell right", "move one cell up"),
    gym_kwargs=_LAKE_KWARGS, render=_lake_text, observation_source="state", codec=GRID_CODEC,
    policy=tabular_policy, success=reached_goal)
TAXI_PROFILE = GymProfile(
    rules=("Taxi: drive the taxi (T, or @ with the passenger aboard) on the 5x5 map to the passenger's stand "
           "(R, G, Y or B), pick the passenger up, drive to the destination stand and drop them off. | is a wall; "
           "the taxi cannot cross it. Reward -1 per move, +20 for the delivery (the episode ends), -10 for a "
           "pickup or dropoff in the wrong place."),
    action_names=("south", "north", "east", "west", "pickup", "dropoff"),
    action_help=("drive one cell down (south)", "drive one cell up (north)", "drive one cell right (east)",
                 "drive one cell left (west)", "pick the passenger up (at the passenger's stand)",
                 "drop the passenger off (at the destination)"),
    gym_kwargs={"is_rainy": _v_bool, "fickle_passenger": _v_bool, "rainy_probability": _v_float(0.0, 1.0),
                "fickle_probability": _v_float(0.0, 1.0)},
    render=_taxi_text, observation_source="state", codec=TAXI_CODEC, policy=tabular_policy,
    success=ended_by_game)
CLIFF_PROFILE = GymProfile(
    rules=("CliffWalking: walk from the start (bottom left) to the goal T (bottom right). x marks you, o safe "
           "ground, C the cliff: stepping onto it costs -100 and sends you back to the start. Reward -1 per move; "
           "the episode ends at the goal."),
    action_names=("up", "right", "down", "left"),
    action_help=("move one cell up", "move one cell right", "move one cell down", "move one cell left"),
    gym_kwargs={"is_slippery": _v_bool}, render=_ansi_text, observation_source="ansi", codec=GRID_CODEC,
    policy=tabular_policy, success=ended_by_game, max_turns=100)
BLACKJACK_PROFILE = GymProfile(
    rules=("Blackjack against the dealer: hit to draw a card, stick to stop and let the dealer play. Face cards "
           "count 10, an ace 1 or 11 (usable ace: counted as 11 without going over 21). Over 21 you bust and lose. "
           "Reward +1 for a win, 0 for a draw, -1 for a loss."),
    action_names=("stick", "hit"),
    action_help=("stop drawing; the dealer plays and the hand is scored", "draw one more card"),
    gym_kwargs={"natural": _v_bool, "sab": _v_bool}, render=_blackjack_text, observation_source="described",
    codec=BLACKJACK_CODEC, policy=blackjack_policy, success=reached_goal, max_turns=10)
MINIGRID_PROFILE = GymProfile(
    rules=(f"MiniGrid: carry out the mission on the grid (the whole grid is shown). Symbols: {MINIGRID_LEGEND}. "
           "Turning and moving forward are separate actions; pickup, toggle and drop act on the cell in front of "
           "you (toggle opens a door, a locked one only with the key of its colour in hand). Reward on success "
           "is 1 - 0.9 * (steps taken / step limit), else 0."),
    action_names=("turn_left", "turn_right", "forward", "pickup", "drop", "toggle", "finish"),
    action_help=("turn 90 degrees to the left", "turn 90 degrees to the right", "move one cell forward",
                 "pick up the object in front of you", "drop what you carry in front of you",
                 "open, close or unlock the door in front of you (or open a box)",
                 "declare the task finished (MiniGrid's done action; most missions ignore it)"),
    gym_kwargs={"max_steps": _v_int(1, MAX_TURNS_LIMIT)}, render=_minigrid_text, observation_source="state",
    policy=minigrid_policy, success=reached_goal, package="minigrid")

#: The allow-list: every Gymnasium id a :class:`GymTextEnv` may wrap, with what the adapter knows of it.
GYM_PROFILES: dict[str, GymProfile] = {
    "FrozenLake-v1": FROZENLAKE_PROFILE,
    "FrozenLake8x8-v1": FROZENLAKE_PROFILE,
    "Taxi-v4": TAXI_PROFILE,
    "CliffWalking-v1": CLIFF_PROFILE,
    "CliffWalkingSlippery-v1": CLIFF_PROFILE,
    "Blackjack-v1": BLACKJACK_PROFILE,
    "MiniGrid-Empty-5x5-v0": MINIGRID_PROFILE,
    "MiniGrid-Empty-Random-6x6-v0": MINIGRID_PROFILE,
    "MiniGrid-DoorKey-5x5-v0": MINIGRID_PROFILE,
    "MiniGrid-LavaGapS5-v0": MINIGRID_PROFILE,
}


def allow_gym_id(gym_id: str, profile: GymProfile | None = None) -> None:
    """Add ``gym_id`` to the allow-list (in-process, for an operator or a test; clients cannot). The id must be in
    Gymnasium's registry when an env is made; without ``profile`` it gets the generic one (``act(a)`` or
    ``act(text)``, ``ansi`` or described observations, no gym_kwargs, no demonstrator).

    Raises:
        ValueError: ``gym_id`` is not a str or has a ``module:`` part.
    """
    if not isinstance(gym_id, str) or ":" in gym_id or not gym_id:
        raise ValueError(f"gym_id must be a registered id without a module: part, got {gym_id!r}")
    GYM_PROFILES[gym_id] = profile or GymProfile()


def gym_profile(gym_id: Any) -> GymProfile:
    """The allow-listed profile of ``gym_id``, after importing its package (from the table only).

    Raises:
        ValueError: ``gym_id`` is not a str of at most 100 characters, has a ``module:`` part, is not
            allow-listed, or is not in Gymnasium's registry.
    """
    if not isinstance(gym_id, str) or not gym_id or len(gym_id) > 100 or ":" in gym_id:
        raise ValueError(f"gym_id must be a Gymnasium id (no module: part, at most 100 characters), got {gym_id!r}")
    profile = GYM_PROFILES.get(gym_id)
    if profile is None:
        raise ValueError(f"gym_id {gym_id!r} is not allowed here; allowed ids: {sorted(GYM_PROFILES)} (an operator "
                         "adds ids with envs.gym_adapter.allow_gym_id)")
    if profile.package is not None and gym_id not in gym.registry:
        try:
            importlib.import_module(profile.package)
        except ImportError as exc:
            raise ImportError(f"{gym_id} needs the package {profile.package!r}: pip install 'forkyard[suite]' "
                              f"({exc})") from exc
    if gym_id not in gym.registry:
        raise ValueError(f"gym_id {gym_id!r} is allowed but not in Gymnasium's registry")
    return profile


# --------------------------------------------------------------------------- replay digests
def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, np.ndarray):
        h.update(f"a{obj.dtype.str}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, np.generic):
        _feed(h, obj.item())
    elif isinstance(obj, dict):
        h.update(f"d{len(obj)}".encode())
        for k in sorted(obj, key=str):
            _feed(h, str(k))
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"l{len(obj)}".encode())
        for x in obj:
            _feed(h, x)
    else:
        h.update(f"{type(obj).__name__}:{obj!r}\x1f".encode("utf-8", "surrogatepass"))


def observation_digest(obs: Any, text: str) -> str:
    """BLAKE2b (16 bytes, hex) of a raw Gymnasium observation (arrays by dtype, shape and bytes) and its text."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, obs)
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


# --------------------------------------------------------------------------- the env
class GymTextEnv(TextEnv):
    """A Gymnasium env as a forkable multi-turn text env (module docstring).

    Args:
        gym_id: an allow-listed Gymnasium id (:data:`GYM_PROFILES`), default ``"FrozenLake-v1"``.
        gym_kwargs: the wrapped env's kwargs, a JSON object or its text; only the keys its profile allows.
        max_turns: turn budget, 1..1000; None: the profile's default (``max_episode_steps`` of the id, ...).
        fork_method: ``"auto"`` or one of :data:`GYM_FORK_METHODS`; the one taken is :attr:`fork_method`.
        action_names: tool names of the Discrete actions, one per action (identifiers, distinct, not in
            :data:`RESERVED_TOOL_NAMES`, at most 32 characters); default the profile's, else ``act(a)``.
        render_mode: ``None`` or ``"ansi"`` (the transcript).

    ``reset`` takes no ``options`` (ValueError). Attributes beyond :class:`~envs.core.TextEnv`'s: ``gym_id``,
    :attr:`fork_method` (the method taken), ``observation_source``, :attr:`success`.

    Raises:
        ValueError: a kwarg out of range, an id not allowed, ``fork_method="state_codec"`` for an env without a
            codec, ``"deepcopy"`` for one that cannot be deep-copied, an action space neither Discrete nor Text.
        ImportError: the id's package (minigrid) is not installed.
    """

    max_observation_length = 8192
    max_action_length = 1024
    fork_method = "state_codec"
    #: A subclass's own profile (FrozenLake's RAGEN form); None: :data:`GYM_PROFILES` of ``gym_id``. Profiles are
    #: looked up, never stored on the instance, so that an env pickles without them.
    own_profile: ClassVar[GymProfile | None] = None
    _restored: Any = None  # the wrapped env a restore built before it changed anything (see restore)

    def __init__(self, gym_id: str = "FrozenLake-v1", gym_kwargs: dict[str, Any] | str | None = None,
                 max_turns: int | None = None, fork_method: str = "auto", action_names: list[str] | None = None,
                 render_mode: str | None = None):
        profile = gym_profile(gym_id)
        checked = _parse_gym_kwargs(gym_id, profile.gym_kwargs, gym_kwargs)
        self._setup(gym_id, profile, checked, max_turns, fork_method, action_names, render_mode, None)

    # ------------------------------------------------------------- construction
    def _setup(self, gym_id: str, profile: GymProfile, gym_kwargs: dict[str, Any], max_turns: int | None,
               fork_method: str, action_names: list[str] | None, render_mode: str | None,
               record: dict[str, Any] | None) -> None:
        """Shared construction (subclasses with their own kwargs pass ``record``: the kwargs snapshots record)."""
        if fork_method != "auto" and fork_method not in GYM_FORK_METHODS:
            raise ValueError(f"fork_method must be 'auto' or one of {list(GYM_FORK_METHODS)}, got {fork_method!r}")
        if max_turns is not None and (isinstance(max_turns, bool) or not isinstance(max_turns, int)
                                      or not 1 <= max_turns <= MAX_TURNS_LIMIT):
            raise ValueError(f"max_turns must be an int in 1..{MAX_TURNS_LIMIT} or None, got {max_turns!r}")
        self.gym_id, self._gym_kwargs = gym_id, gym_kwargs
        self._episode_kwargs: dict[str, Any] = {}
        self._wrapped: Any = None
        wrapped = self._new_wrapped()
        space = wrapped.action_space
        self._text_actions = isinstance(space, spaces.Text)
        if isinstance(space, spaces.Discrete):
            self._n_actions, self._start = int(space.n), int(space.start)
        elif not self._text_actions:
            wrapped.close()
            raise ValueError(f"{gym_id} has a {type(space).__name__} action space; GymTextEnv takes Discrete or Text")
        names = self._check_names(gym_id, action_names if action_names is not None else profile.action_names)
        self._names = names
        try:
            self._validate_names()
        except ValueError:
            wrapped.close()
            raise
        if self._text_actions:
            menu = profile.text_menu(wrapped) if profile.text_menu else _sample_text_menu(space)
            self._menu = [format_action("act", str(t)) for t in menu]
        elif names is not None:
            self._menu = [format_action(n) for n in names]
        else:
            self._menu = [format_action("act", self._start + i) for i in range(self._n_actions)]
        self._method_codec = callable(getattr(wrapped, "get_state", None)) and callable(
            getattr(wrapped, "set_state", None))
        method = fork_method
        if method == "state_codec" and self._codec is None:
            wrapped.close()
            raise ValueError(f"{gym_id} has no state codec (neither in the adapter's table nor get_state/set_state "
                             "methods); use fork_method='deepcopy', 'replay' or 'auto'")
        if method in ("auto", "deepcopy") and not (method == "auto" and self._codec is not None):
            try:
                copy.deepcopy(wrapped).close()
                deep_ok = True
            except Exception as exc:  # noqa: BLE001 - any failure means deepcopy is not a fork method here
                if method == "deepcopy":
                    wrapped.close()
                    raise ValueError(f"{gym_id} cannot be deep-copied ({type(exc).__name__}: {exc}); use "
                                     "fork_method='replay' or 'auto'") from exc
                deep_ok = False
            if method == "auto":
                method = "deepcopy" if deep_ok else "replay"
        elif method == "auto":
            method = "state_codec"
        if max_turns is None:
            spec_steps = gym.spec(gym_id).max_episode_steps
            max_turns = profile.max_turns or spec_steps or int(getattr(wrapped, "max_steps", 0) or 100)
            max_turns = min(int(max_turns), MAX_TURNS_LIMIT)
        if record is None:
            record = {"gym_id": gym_id, "gym_kwargs": gym_kwargs, "max_turns": max_turns, "fork_method": method,
                      "action_names": None if action_names is None else list(action_names)}
        super().__init__(max_turns=max_turns, kwargs=record, render_mode=render_mode)
        self.fork_method = method  # type: ignore[misc]  # per instance: the method taken for this wrapped env
        self._wrapped = wrapped
        self._wrapped_ansi = wrapped.render_mode == "ansi"
        #: Where the observation text comes from: ``"ansi"``, ``"state"`` or ``"described"`` (module docstring).
        self.observation_source = profile.observation_source or (
            "ansi" if wrapped.render_mode == "ansi" else "described")
        self._wrapped_seed: int | None = None
        self._actions: list[Any] = []
        self._trace: list[list[Any]] = []
        self._return = 0.0
        self._last_reward = 0.0
        self._terminated = False

    @property
    def _profile(self) -> GymProfile:
        return type(self).own_profile or GYM_PROFILES[self.gym_id]

    @property
    def _codec(self) -> StateCodec | None:
        """The wrapped env's state codec: its profile's, else its own get_state / set_state methods, else None."""
        return self._profile.codec or (METHOD_CODEC if self._method_codec else None)

    def _render_fn(self, wrapped: Any, obs: Any, ended: bool) -> str:
        render = self._profile.render or (_ansi_text if self._wrapped_ansi else _described_text)
        return render(wrapped, obs, ended)

    @staticmethod
    def _check_names(gym_id: str, names: Any) -> tuple[str, ...] | None:
        if names is None:
            return None
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"action_names must be a list of strings, got {names!r}")
        return tuple(names)

    def _validate_names(self) -> None:
        names = self._names
        if names is None:
            return
        if self._text_actions:
            raise ValueError(f"{self.gym_id} has a Text action space: action_names apply to Discrete actions only")
        if len(names) != self._n_actions:
            raise ValueError(f"action_names needs {self._n_actions} names for {self.gym_id}, got {len(names)}")
        bad = [n for n in names if not n.isidentifier() or keyword.iskeyword(n) or n.startswith("_")
               or len(n) > 32 or n in RESERVED_TOOL_NAMES or not n.isascii()]
        if bad or len(set(names)) != len(names):
            raise ValueError(f"action_names must be distinct ASCII identifiers of at most 32 characters, not "
                             f"keywords nor {sorted(RESERVED_TOOL_NAMES)}; refused: {bad or names}")

    def _new_wrapped(self, episode_kwargs: dict[str, Any] | None = None) -> Any:
        """A fresh wrapped env (never reset) of this env's id and kwargs (and ``episode_kwargs``, default this
        episode's): the bare env of ``gymnasium.make``."""
        spec = gym.spec(self.gym_id)
        creator = gym.envs.registration.load_env_creator(spec.entry_point) if isinstance(
            spec.entry_point, str) else spec.entry_point
        modes = getattr(creator, "metadata", {}).get("render_modes", [])
        render_mode = "ansi" if "ansi" in modes else None
        return gym.make(spec, render_mode=render_mode, disable_env_checker=True,
                        **self._gym_kwargs, **(self._episode_kwargs if episode_kwargs is None else episode_kwargs)
                        ).unwrapped

    def _episode_gym_kwargs(self) -> dict[str, Any]:
        """Wrapped-env kwargs drawn per episode from ``self.np_random`` (plain JSON data; none here). A subclass
        that generates its task per episode (FrozenLake's maps) overrides it; the wrapped env is rebuilt when
        they change."""
        return {}

    def _model_key(self) -> str:
        return json.dumps([self.gym_id, self._gym_kwargs, self._episode_kwargs], sort_keys=True)

    # ------------------------------------------------------------- episode
    def _text(self, wrapped: Any, obs: Any, ended: bool) -> tuple[str, str]:
        text = self._render_fn(wrapped, obs, ended)
        return text, observation_digest(obs, text)

    def _reset_task(self, options: dict[str, Any] | None) -> str:
        if options:
            raise ValueError(f"{type(self).__name__} takes no reset options, got {sorted(options)}")
        episode_kwargs = self._episode_gym_kwargs()
        if episode_kwargs != self._episode_kwargs:
            self._episode_kwargs = episode_kwargs
            old, self._wrapped = self._wrapped, self._new_wrapped()
            old.close()
        self._wrapped_seed = int(self.np_random.integers(2**31 - 1))
        obs, _ = self._wrapped.reset(seed=self._wrapped_seed)
        text, digest = self._text(self._wrapped, obs, False)
        self._actions, self._trace = [], [[digest, 0.0, False, False]]
        self._return, self._last_reward, self._terminated = 0.0, 0.0, False
        menu = ", ".join(self._menu)
        return f"{self._rules()}\nActions: {menu}.\n\n{text}\n{self._prompt()}"

    def _rules(self) -> str:
        return self._profile.rules or f"Gymnasium env {self.gym_id}."

    def _prompt(self) -> str:
        what = "act(text) with your action as a string" if self._text_actions else "one of " + ", ".join(self._menu)
        return f"Turn {self._turn + 1} of {self.max_turns}: call {what}."

    def _legal_actions(self) -> list[str]:
        return list(self._menu)

    def _decode(self, call: ToolCall) -> Any:
        """The wrapped env's action for ``call``. Raises IllegalActionError (explaining) when it is none."""
        if self._text_actions:
            if call.name != "act":
                raise IllegalActionError(f"{self.gym_id} takes one tool, act(text); got {call.text()}.")
            text = bind_arguments(call, ["text"]).get("text")
            if not isinstance(text, str) or not self._wrapped.action_space.contains(text):
                space = self._wrapped.action_space
                raise IllegalActionError(f"act(text) needs a string of {space.min_length}..{space.max_length} "
                                         f"characters from the env's character set; got {call.text()}.")
            return text
        if self._names is not None:
            if call.name not in self._names:
                raise IllegalActionError(f"{call.text()} is not an action of {self.gym_id}; call one of "
                                         f"{', '.join(self._menu)}.")
            if call.args or call.kwargs:
                raise IllegalActionError(f"{call.name}() takes no arguments; got {call.text()}.")
            return self._start + self._names.index(call.name)
        low, high = self._start, self._start + self._n_actions - 1
        if call.name != "act":
            raise IllegalActionError(f"{self.gym_id} takes one tool, act(a) with an int a in {low}..{high}; "
                                     f"got {call.text()}.")
        a = bind_arguments(call, ["a"]).get("a")
        if type(a) is not int or not low <= a <= high:
            raise IllegalActionError(f"act(a) needs an int a in {low}..{high}; got {call.text()}.")
        return a

    def _action_text(self, action: Any) -> str:
        if self._text_actions:
            return format_action("act", str(action))
        return self._menu[int(action) - self._start]

    def _act(self, call: ToolCall) -> Outcome:
        action = self._decode(call)
        obs, reward, terminated, truncated, _ = self._wrapped.step(action)
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        text, digest = self._text(self._wrapped, obs, terminated or truncated)
        self._actions.append(action)
        self._trace.append([digest, reward, terminated, truncated])
        self._return += reward
        self._last_reward, self._terminated = reward, terminated
        head = f"{self._action_text(action)}: reward {reward:g}."
        if terminated:
            head += " The game is over."
        elif truncated:
            head += f" {self.gym_id}'s own step limit ended the episode."
        return Outcome(f"{head}\n{text}", reward=reward, terminated=terminated, truncated=truncated and not terminated,
                       reason="answered" if terminated else "max_turns" if truncated else None)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; at the episode's end ``info["episode_metrics"] = {"success", "return"}``."""
        out = TextEnv.step(self, action)
        if self._done:
            out[4]["episode_metrics"] = {"success": float(self.success), "return": self._return}
        return out

    @property
    def success(self) -> bool:
        """Whether the episode so far counts as a success (module docstring; the profile's rule)."""
        rule = self._profile.success
        return bool(rule(self._return, self._last_reward, self._terminated)) if rule else self._return > 0

    # ------------------------------------------------------------- features
    @property
    def action_vocabulary(self) -> list[str]:
        """Every action text (the whole Discrete menu; all are legal in every state).

        Raises:
            AttributeError: the action space is Text (open: no vocabulary).
        """
        if self._text_actions:
            raise AttributeError("a Text action space has no finite action vocabulary")
        return list(self._menu)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """One tool per named action (no arguments), else ``act(a)`` (integer) or ``act(text)`` (string)."""
        if self._text_actions:
            space = self._wrapped.action_space
            return [function_tool("act", f"send one text action to {self.gym_id}",
                                  {"text": {"type": "string", "minLength": int(space.min_length),
                                            "maxLength": int(space.max_length), "description": "the action"}})]
        if self._names is not None:
            helps = self._profile.action_help if self._names == self._profile.action_names else ()
            return [function_tool(n, helps[i] if i < len(helps) else f"action {self._start + i} of {self.gym_id}",
                                  {}) for i, n in enumerate(self._names)]
        return [function_tool("act", f"take one action of {self.gym_id}",
                              {"a": {"type": "integer", "minimum": self._start,
                                     "maximum": self._start + self._n_actions - 1, "description": "the action"}})]

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """With probability ``skill`` the profile's scripted action (module docstring), else a uniformly random
        legal action; ``skill`` 0 is random play, 1 the scripted play. Envs without a script play randomly.

        Raises:
            ValueError: ``skill`` outside [0, 1].
        """
        if not 0.0 <= skill <= 1.0:
            raise ValueError(f"skill must be in [0, 1], got {skill!r}")
        policy = self._profile.policy
        if policy is not None and skill > 0 and rng.random() < skill:
            return self._action_text(policy(self))
        return rng.choice(self._legal_actions())

    # ------------------------------------------------------------- fork / snapshot
    def _task_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "episode_kwargs": self._episode_kwargs, "wrapped_seed": self._wrapped_seed,
            "actions": list(self._actions), "trace": [list(t) for t in self._trace], "return": self._return,
            "last_reward": self._last_reward, "terminated": self._terminated, "gym_state": None}
        if self.fork_method == "state_codec" and self._wrapped_seed is not None and self._codec is not None:
            state["gym_state"] = self._codec.get(self._wrapped)
        return state

    def restore(self, snapshot: Any) -> None:
        """:meth:`TextEnv.restore`, atomic: the wrapped env is rebuilt first (state codec, else verified replay), so a
        snapshot that cannot be restored leaves this env as it was.

        Raises:
            ValueError: a snapshot of another class or kwargs, or with an action the wrapped env does not take.
            ReplayDivergedError: the replay of the snapshot's episode differs from its record.
        """
        snap = self._checked_snapshot(snapshot)
        self._restored = self._wrapped_for(snap.state["task"], "restore")
        try:
            super().restore(snap)
        finally:
            self._restored = None

    def _wrapped_for(self, task: dict[str, Any], what: str) -> Any:
        """A new wrapped env in the state a snapshot's task state records: by the codec, else by verified replay."""
        episode_kwargs = dict(task["episode_kwargs"])
        seed = task["wrapped_seed"]
        if seed is not None and self.fork_method == "state_codec" and self._codec is not None:
            wrapped = self._new_wrapped(episode_kwargs)
            try:
                self._codec.set(wrapped, task["gym_state"])
            except Exception:
                wrapped.close()
                raise
            return wrapped
        actions = [self._checked_action(a) for a in task["actions"]]
        return self._replayed(what, episode_kwargs, None if seed is None else int(seed), actions, task["trace"])

    def _checked_action(self, action: Any) -> Any:
        ok = (isinstance(action, str) and self._wrapped.action_space.contains(action) if self._text_actions else
              type(action) is int and self._start <= action < self._start + self._n_actions)
        if not ok:
            raise ValueError(f"the snapshot's action log holds {action!r}, which is no action of {self.gym_id}")
        return action

    def _load_task_state(self, state: dict[str, Any]) -> None:
        wrapped = self._restored if self._restored is not None else self._wrapped_for(state, "restore")
        self._episode_kwargs = dict(state["episode_kwargs"])
        seed = state["wrapped_seed"]
        self._wrapped_seed = None if seed is None else int(seed)
        self._actions = list(state["actions"])
        self._trace = [list(t) for t in state["trace"]]
        self._return, self._last_reward = float(state["return"]), float(state["last_reward"])
        self._terminated = bool(state["terminated"])
        old, self._wrapped = self._wrapped, wrapped
        if old is not None and old is not wrapped:
            old.close()

    def _fork_into(self, children: list[TextEnv]) -> None:
        wrapped_state = None
        if self._wrapped_seed is not None and self.fork_method == "state_codec" and self._codec is not None:
            wrapped_state = json.dumps(self._codec.get(self._wrapped))
        for child in children:
            assert isinstance(child, GymTextEnv)
            child._actions, child._trace = list(self._actions), list(self._trace)
            if self._wrapped_seed is None:
                child._wrapped = self._new_wrapped()
            elif wrapped_state is not None:
                assert self._codec is not None
                child._wrapped = copy.copy(self._wrapped) if self._codec.share_constants else self._new_wrapped()
                self._codec.set(child._wrapped, json.loads(wrapped_state))
            elif self.fork_method == "deepcopy":
                child._wrapped = copy.deepcopy(self._wrapped)
            else:
                child._wrapped = self._replayed("fork", self._episode_kwargs, self._wrapped_seed, self._actions,
                                                self._trace)

    def _replayed(self, what: str, episode_kwargs: dict[str, Any], seed: int | None, actions: list[Any],
                  trace: list[list[Any]]) -> Any:
        """A new wrapped env brought to an episode's state by seeded replay of its action log from its wrapped
        ``seed``, every step verified against its ``trace`` (``[digest, reward, terminated, truncated]`` per step,
        the reset first).

        Raises:
            ReplayDivergedError: a step's observation, reward, terminated or truncated differs from the record.
        """
        wrapped = self._new_wrapped(episode_kwargs)
        if seed is None:
            return wrapped
        if len(trace) != len(actions) + 1:
            wrapped.close()
            raise ReplayDivergedError(f"cannot {what} {type(self).__name__}({self.gym_id!r}): its action log "
                                      f"({len(actions)}) and trace ({len(trace)}) disagree")
        obs, _ = wrapped.reset(seed=seed)
        have = [self._text(wrapped, obs, False)[1], 0.0, False, False]
        for i, want in enumerate(trace):
            if i > 0:
                obs, reward, terminated, truncated, _ = wrapped.step(actions[i - 1])
                ended = bool(terminated or truncated)
                have = [self._text(wrapped, obs, ended)[1], float(reward), bool(terminated), bool(truncated)]
            if list(want) != have:
                wrapped.close()
                where = "the reset observation" if i == 0 else f"step {i} ({self._action_text(actions[i - 1])})"
                raise ReplayDivergedError(
                    f"cannot {what} {type(self).__name__}({self.gym_id!r}) by seeded replay: replaying its "
                    f"{len(actions)} recorded action(s) from seed {seed} gave another {where} than the episode "
                    f"recorded (digest, reward, terminated, truncated: recorded {list(want)}, replayed {have}). "
                    f"{self.gym_id} is not deterministic given its seed and actions, so it cannot be copied by "
                    "replay; refusing rather than returning a different copy.")
        return wrapped

    def close(self) -> None:
        """Close the wrapped env."""
        if getattr(self, "_wrapped", None) is not None:
            self._wrapped.close()
        super().close()


def _sample_text_menu(space: spaces.Text) -> list[str]:
    sampler = copy.deepcopy(space)
    sampler.seed(0)
    return list(dict.fromkeys(str(sampler.sample()) for _ in range(4)))
