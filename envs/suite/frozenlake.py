"""FrozenLake-v0: RAGEN's text form of FrozenLake on Gymnasium's env, a new solvable map per episode.

The task form of RAGEN / StarPO (arXiv 2504.20073): the lake is a grid of text, one line per row, with RAGEN's
symbols (``P`` the player, ``_`` frozen ice, ``O`` a hole, ``G`` the goal, ``X`` the player fallen into a hole,
``√`` the player on the goal), and RAGEN's actions Left, Down, Right, Up as the tools ``Left()``, ``Down()``,
``Right()``, ``Up()`` (the names RAGEN's prompts use, as forkyard/Sokoban-v0 does; ``forkyard/Gym-v0`` on
``FrozenLake-v1`` names them ``left()`` ... ``up()``). The dynamics are Gymnasium's
``FrozenLakeEnv`` itself (``gymnasium.envs.toy_text.frozen_lake``): on slippery ice a move goes the chosen way
with probability 1/3 and to either side of it with 1/3 each. Reward 1.0 on reaching the goal, else 0.0; the goal
and the holes terminate the episode (``termination_reason="answered"``); the turn budget truncates it.

Every ``reset`` (unless ``map_name`` names one of Gymnasium's two fixed maps, "4x4" or "8x8") draws a map with
Gymnasium's ``generate_random_map(size, p, seed)`` (each cell frozen with
probability ``p``, start top-left, goal bottom-right, redrawn until a path exists, so every map is solvable),
its seed drawn from the env's ``np_random``: ``reset(seed=s)`` gives the same map and the same slips for ``s``.

Settings (validated; a bad one raises ValueError): ``size`` 2..12 (default 4, RAGEN's), ``p`` in [0.5, 1]
(default 0.8, RAGEN's), ``is_slippery`` (default True, RAGEN's), ``max_turns`` 1..200 (default None:
``10 * (size - 1)``, five times the shortest path of ``2 * (size - 1)`` moves: 30 at size 4). RAGEN gives 10
actions per trajectory, but its maps place start and goal at random; on Gymnasium's maps, goal in the far
corner, 10 turns on slippery 4x4 ice leave the best play about 0.14 success, 30 turns about 0.64 (measured with
the demonstrator below; 1.0 on ice that does not slip).

Fork and snapshot by the state codec of :mod:`envs.gym_adapter` (``fork_method="state_codec"``): the map, the
player's cell, the last action and the wrapped env's RNG state, all plain JSON. Demonstrator: the adapter's
finite-horizon dynamic programme over the map (shortest path on ice that does not slip, the most likely success
within the turns left on ice that does). ``info["episode_metrics"]`` at the end: ``success`` (goal reached) and
``return``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from gymnasium.envs.toy_text.frozen_lake import MAPS, generate_random_map

from envs.gym_adapter import FROZENLAKE_PROFILE, LAKE_LEGEND, GymProfile, GymTextEnv, lake_grid, lake_rows

MAX_SIZE = 12
MAX_TURNS = 200


def _ragen_grid(env: object, obs: object, ended: bool) -> str:
    """The lake alone, in RAGEN's symbols (:func:`envs.gym_adapter.lake_grid`)."""
    return lake_grid(lake_rows(env), int(env.s))  # type: ignore[attr-defined]


#: FrozenLake's adapter profile with RAGEN's observation: the grid alone.
RAGEN_FROZENLAKE_PROFILE = GymProfile(
    rules="", action_names=("Left", "Down", "Right", "Up"), action_help=FROZENLAKE_PROFILE.action_help,
    render=_ragen_grid, observation_source="state", codec=FROZENLAKE_PROFILE.codec, policy=FROZENLAKE_PROFILE.policy,
    success=FROZENLAKE_PROFILE.success)


class FrozenLakeEnv(GymTextEnv):
    """FrozenLake-v0 (module docstring).

    Args:
        size: the map's side, 2..12 (default 4).
        p: probability that a cell is frozen, 0.5..1 (default 0.8).
        is_slippery: whether moves may slip to the side (default True).
        max_turns: turn budget 1..200; None: ``10 * (size - 1)``.
        map_name: ``None`` (a new map per episode) or one of Gymnasium's fixed maps, ``"4x4"`` or ``"8x8"``
            (``gymnasium.envs.toy_text.frozen_lake.MAPS``, the maps of ``gymnasium.make("FrozenLake-v1")``): every
            episode plays it, ``size`` is its side and ``p`` is not used.
        render_mode: ``None`` or ``"ansi"`` (the transcript).

    Raises:
        ValueError: a setting of the wrong type or out of range.
    """

    own_profile: ClassVar[GymProfile | None] = RAGEN_FROZENLAKE_PROFILE

    def __init__(self, size: int = 4, p: float = 0.8, is_slippery: bool = True, max_turns: int | None = None,
                 map_name: str | None = None, render_mode: str | None = None):
        if map_name is not None:
            if map_name not in MAPS:
                raise ValueError(f"map_name must be None or one of {sorted(MAPS)}, got {map_name!r}")
            size = len(MAPS[map_name])
        if isinstance(size, bool) or not isinstance(size, int) or not 2 <= size <= MAX_SIZE:
            raise ValueError(f"size must be an int in 2..{MAX_SIZE}, got {size!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.5 <= p <= 1.0:
            raise ValueError(f"p must be a number in [0.5, 1], got {p!r}")
        if not isinstance(is_slippery, bool):
            raise ValueError(f"is_slippery must be a bool, got {is_slippery!r}")
        if max_turns is None:
            max_turns = 10 * (size - 1)
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or not 1 <= max_turns <= MAX_TURNS:
            raise ValueError(f"max_turns must be an int in 1..{MAX_TURNS} or None, got {max_turns!r}")
        self.size, self.p, self.is_slippery, self.map_name = size, float(p), is_slippery, map_name
        record: dict[str, Any] = {"size": size, "p": float(p), "is_slippery": is_slippery, "max_turns": max_turns}
        if map_name is not None:
            record["map_name"] = map_name
        self._setup("FrozenLake-v1", RAGEN_FROZENLAKE_PROFILE, {"is_slippery": is_slippery}, max_turns,
                    "state_codec", None, render_mode, record=record)

    def _episode_gym_kwargs(self) -> dict[str, list[str]]:
        """This episode's map: the fixed map ``map_name``, else ``generate_random_map(size, p, seed)`` with a seed
        drawn from ``np_random``."""
        if self.map_name is not None:
            return {"desc": list(MAPS[self.map_name])}
        return {"desc": generate_random_map(self.size, self.p, seed=int(self.np_random.integers(2**31 - 1)))}

    def _rules(self) -> str:
        ice = ("The ice is slippery: a move goes the way you chose with probability 1/3 and to either side of it "
               "with 1/3 each." if self.is_slippery else "The ice does not slip: every move goes the way you chose.")
        return (f"FrozenLake: you (P) start at the top left of a {self.size}x{self.size} frozen lake; reach the goal "
                f"G without falling into a hole O. Symbols: {LAKE_LEGEND}. {ice} Moves into the edge leave you where "
                "you are. Reward 1 at the goal, else 0; the episode ends at the goal or in a hole.")
