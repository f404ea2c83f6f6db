"""The allow-list of wrapped Gymnasium ids, with what the adapter knows of each (:class:`GymProfile`).

``gym_id`` comes from untrusted clients: :func:`gym_profile` takes only an id of :data:`GYM_PROFILES` (never a
``module:Id`` form), imports only the package its profile names (minigrid for ``MiniGrid-*``), and an operator adds
ids in-process with :func:`allow_gym_id`, never through kwargs. A profile gathers the per-env parts of the other
modules of this package: the allowed kwargs (:mod:`~envs.gym_adapter.kwargs`), the state codec
(:mod:`~envs.gym_adapter.state_codecs`), the rendering (:mod:`~envs.gym_adapter.renderings`) and the demonstrator
(:mod:`~envs.gym_adapter.demonstrators`), with the rules text, the action names and the success rule.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from envs.gym_adapter.demonstrators import PolicyView, blackjack_policy, minigrid_policy, tabular_policy
from envs.gym_adapter.kwargs import MAX_TURNS_LIMIT, KwargCheck, v_bool, v_choice, v_float, v_int, v_lake_map
from envs.gym_adapter.renderings import (
    LAKE_LEGEND,
    MINIGRID_LEGEND,
    Renderer,
    ansi_text,
    blackjack_text,
    lake_text,
    minigrid_text,
    taxi_text,
)
from envs.gym_adapter.state_codecs import BLACKJACK_CODEC, GRID_CODEC, TAXI_CODEC, StateCodec


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
        observation_source: ``"ansi"``, ``"state"`` or ``"described"`` (:mod:`envs.gym_adapter`).
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
    gym_kwargs: Mapping[str, KwargCheck] = field(default_factory=dict)
    render: Renderer | None = None
    observation_source: str | None = None
    codec: StateCodec | None = None
    policy: Callable[[PolicyView], Any] | None = None
    success: Callable[[float, float, bool], bool] | None = None
    max_turns: int | None = None
    package: str | None = None
    text_menu: Callable[[Any], list[str]] | None = None


_LAKE_KWARGS: dict[str, KwargCheck] = {
    "is_slippery": v_bool, "map_name": v_choice("4x4", "8x8"), "desc": v_lake_map,
    "success_rate": v_float(0.0, 1.0)}
FROZENLAKE_PROFILE = GymProfile(
    rules=("FrozenLake: walk from the top-left corner to the goal G over frozen ice without falling into a hole. "
           f"Symbols: {LAKE_LEGEND}. On slippery ice a move may carry you to either side of the direction you "
           "chose. Reward 1 on reaching the goal, else 0; the episode ends at the goal or in a hole."),
    action_names=("left", "down", "right", "up"),
    action_help=("move one cell left", "move one cell down", "move one cell right", "move one cell up"),
    gym_kwargs=_LAKE_KWARGS, render=lake_text, observation_source="state", codec=GRID_CODEC,
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
    gym_kwargs={"is_rainy": v_bool, "fickle_passenger": v_bool, "rainy_probability": v_float(0.0, 1.0),
                "fickle_probability": v_float(0.0, 1.0)},
    render=taxi_text, observation_source="state", codec=TAXI_CODEC, policy=tabular_policy,
    success=ended_by_game)
CLIFF_PROFILE = GymProfile(
    rules=("CliffWalking: walk from the start (bottom left) to the goal T (bottom right). x marks you, o safe "
           "ground, C the cliff: stepping onto it costs -100 and sends you back to the start. Reward -1 per move; "
           "the episode ends at the goal."),
    action_names=("up", "right", "down", "left"),
    action_help=("move one cell up", "move one cell right", "move one cell down", "move one cell left"),
    gym_kwargs={"is_slippery": v_bool}, render=ansi_text, observation_source="ansi", codec=GRID_CODEC,
    policy=tabular_policy, success=ended_by_game, max_turns=100)
BLACKJACK_PROFILE = GymProfile(
    rules=("Blackjack against the dealer: hit to draw a card, stick to stop and let the dealer play. Face cards "
           "count 10, an ace 1 or 11 (usable ace: counted as 11 without going over 21). Over 21 you bust and lose. "
           "Reward +1 for a win, 0 for a draw, -1 for a loss."),
    action_names=("stick", "hit"),
    action_help=("stop drawing; the dealer plays and the hand is scored", "draw one more card"),
    gym_kwargs={"natural": v_bool, "sab": v_bool}, render=blackjack_text, observation_source="described",
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
    gym_kwargs={"max_steps": v_int(1, MAX_TURNS_LIMIT)}, render=minigrid_text, observation_source="state",
    policy=minigrid_policy, success=reached_goal, package="minigrid")

#: The allow-list: every Gymnasium id a :class:`~envs.gym_adapter.GymTextEnv` may wrap, with what the adapter
#: knows of it.
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
