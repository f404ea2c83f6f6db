"""The observation texts of wrapped envs: ``(wrapped env, raw observation, ended) -> text``.

Which one an env gets (:attr:`envs.gym_adapter.GymTextEnv.observation_source`, described in :mod:`envs.gym_adapter`):
the wrapped env's own ``ansi`` render without its colour codes (:func:`ansi_text`: CliffWalking); a rendering built
from the wrapped env's state where the ``ansi`` render marks the player by colour alone or there is none
(:func:`lake_text` in RAGEN's symbols, :func:`taxi_text`, :func:`minigrid_text`); or the Gymnasium observation
written out (:func:`blackjack_text`, and :func:`described_text` for any other env without an ``ansi`` render).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

#: A rendering: ``(wrapped env, raw observation, ended) -> text``.
Renderer = Callable[[Any, Any, bool], str]
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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


def lake_text(env: Any, obs: Any, ended: bool) -> str:
    """FrozenLake: the lake in RAGEN's symbols and a sentence on the player's cell."""
    rows = lake_rows(env)
    r, c = divmod(int(env.s), len(rows[0]))
    return f"{lake_grid(rows, env.s)}\nYou are at row {r}, column {c} (row 0 is the top)."


_TAXI_STANDS = "RGYB"


def taxi_text(env: Any, obs: Any, ended: bool) -> str:
    """Taxi: the map with the taxi (``T``, or ``@`` with the passenger aboard) and a sentence on the passenger."""
    row, col, passenger, dest = env.decode(env.s)
    cells = [[ch.decode("ascii") for ch in line] for line in env.desc.tolist()]
    cells[1 + row][2 * col + 1] = "@" if passenger == 4 else "T"
    where = "in the taxi" if passenger == 4 else f"waiting at {_TAXI_STANDS[passenger]}"
    if ended:
        where = f"delivered to {_TAXI_STANDS[dest]}"
    return ("\n".join("".join(line) for line in cells)
            + f"\nTaxi at row {row}, column {col}. Passenger: {where}. Destination: {_TAXI_STANDS[dest]}.")


def ansi_text(env: Any, obs: Any, ended: bool) -> str:
    """The wrapped env's own ``ansi`` render, its ANSI colour codes removed."""
    text = env.render()
    return _ANSI_ESCAPE.sub("", text if isinstance(text, str) else str(text)).strip("\n")


def blackjack_text(env: Any, obs: Any, ended: bool) -> str:
    """Blackjack's ``(player sum, dealer card, usable ace)`` in words; at the end, the dealer's hand."""
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


def described_text(env: Any, obs: Any, ended: bool) -> str:
    """Any Gymnasium observation written out as JSON."""
    return "Observation: " + json.dumps(_plain(obs), default=str)


_MG_SYMBOLS = {"wall": "#", "floor": ".", "goal": "G", "lava": "~", "key": "K", "ball": "O", "box": "B"}
_MG_HEADINGS = ("right", "down", "left", "up")
_MG_AGENT = (">", "v", "<", "^")
#: MiniGrid's headings (``agent_dir`` 0..3) as (column, row) steps; the demonstrator plans with them too.
MG_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))
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


def minigrid_text(env: Any, obs: Any, ended: bool) -> str:
    """MiniGrid: the mission, the full grid, the agent's cell and heading, the cell in front, what it carries and
    the objects on the grid."""
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
    fx, fy = ax + MG_VEC[heading][0], ay + MG_VEC[heading][1]
    front = _mg_name(grid.get(fx, fy)) if 0 <= fx < grid.width and 0 <= fy < grid.height else "the edge"
    carrying = _mg_name(env.carrying) if env.carrying is not None else "nothing"
    return (f"Mission: {env.mission}\n" + "\n".join(lines)
            + f"\nYou are at row {ay}, column {ax}, facing {_MG_HEADINGS[heading]}. In front of you: {front}. "
              f"You carry: {carrying}." + (f"\nObjects: {'; '.join(objects)}." if objects else ""))
