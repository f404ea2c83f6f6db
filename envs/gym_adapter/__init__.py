"""Any Gymnasium env with Discrete (or Text) actions as a forkable forkyard :class:`~envs.core.TextEnv`.

:class:`GymTextEnv` wraps one Gymnasium env, *the wrapped env*, named by its id in Gymnasium's registry
(``gym_id``), and makes it a multi-turn text env with fork, snapshot and restore, so that the field's Gymnasium
envs join forkyard's trainers and server as they are. It is registered once, as ``forkyard/Gym-v0``:
``gymnasium.make("forkyard/Gym-v0", gym_id="Taxi-v4")``, the server's ``/v1/envs``
(``{"env_id": "forkyard/Gym-v0", "kwargs": {"gym_id": "Taxi-v4", "gym_kwargs": {"is_rainy": true}}}``) and
``envs.trl.environment_factory("forkyard/Gym-v0", gym_id="Blackjack-v1")`` reach every allowed env with no glue.

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
    ``set_state(state)``; the toy-text envs, which keep their state in a few attributes, get one from
    :mod:`~envs.gym_adapter.state_codecs` (FrozenLake and CliffWalking ``s``, ``lastaction``; Taxi also
    ``fickle_step``, ``taxi_orientation``; Blackjack the ``player`` and ``dealer`` hands and the dealer's face
    card). Fork sets the state on a fresh wrapped env (for the toy-text envs on a shallow copy, whose transition
    table and map are constants: :attr:`StateCodec.share_constants`); the snapshot carries the state, so it
    restores in another process.
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
random legal one: the mixing rule of :func:`envs.features.mixed_demo`), from the visible state: FrozenLake, Taxi
and CliffWalking greedy on a finite-horizon dynamic programme (discount 0.999, horizon = the turns left) over the
transition table ``P`` the env publishes, which follows from the visible map and the documented rules (shortest
paths where moves are deterministic, the most likely success on slippery ice); Blackjack the basic strategy for
hit / stick (Sutton & Barto, Reinforcement Learning, 2nd ed., ch. 5); MiniGrid breadth-first search over (cell,
heading) on the visible grid, to the goal, or first to the key and the door it opens.

The package, one job per module (:class:`GymTextEnv` is in :mod:`~envs.gym_adapter.env`; every name below is
importable from ``envs.gym_adapter``):

==================  ==========================================================================================
``env``             :class:`GymTextEnv`: construction, the episode, the features, fork / snapshot / restore
``profiles``        the allow-list :data:`GYM_PROFILES` and :class:`GymProfile`: what the adapter knows per id
``kwargs``          the checks of a client's ``gym_kwargs`` (types, ranges, size)
``actions``         the wrapped action space as tools (:class:`~envs.gym_adapter.actions.ActionSet`)
``renderings``      the observation texts (``ansi``, built from the state, described)
``state_codecs``    the wrapped envs' state codecs (:class:`StateCodec`)
``demonstrators``   the scripted policies
``replay``          the verified replay and its observation digests (:class:`ReplayDivergedError`)
==================  ==========================================================================================
"""

from __future__ import annotations

from envs.gym_adapter.actions import RESERVED_TOOL_NAMES
from envs.gym_adapter.demonstrators import (
    DP_DISCOUNT,
    DP_MAX_HORIZON,
    blackjack_policy,
    minigrid_policy,
    tabular_policy,
)
from envs.gym_adapter.env import GYM_FORK_METHODS, GymTextEnv
from envs.gym_adapter.kwargs import MAX_GYM_KWARGS_CHARS, MAX_TURNS_LIMIT
from envs.gym_adapter.profiles import (
    BLACKJACK_PROFILE,
    CLIFF_PROFILE,
    FROZENLAKE_PROFILE,
    GYM_PROFILES,
    MINIGRID_PROFILE,
    TAXI_PROFILE,
    GymProfile,
    allow_gym_id,
    ended_by_game,
    gym_profile,
    reached_goal,
)
from envs.gym_adapter.renderings import LAKE_LEGEND, MINIGRID_LEGEND, Renderer, lake_grid, lake_rows
from envs.gym_adapter.replay import ReplayDivergedError, observation_digest
from envs.gym_adapter.state_codecs import BLACKJACK_CODEC, GRID_CODEC, METHOD_CODEC, TAXI_CODEC, StateCodec

__all__ = [
    "BLACKJACK_CODEC", "BLACKJACK_PROFILE", "CLIFF_PROFILE", "DP_DISCOUNT", "DP_MAX_HORIZON", "FROZENLAKE_PROFILE",
    "GRID_CODEC", "GYM_FORK_METHODS", "GYM_PROFILES", "LAKE_LEGEND", "MAX_GYM_KWARGS_CHARS", "MAX_TURNS_LIMIT",
    "METHOD_CODEC", "MINIGRID_LEGEND", "MINIGRID_PROFILE", "RESERVED_TOOL_NAMES", "TAXI_CODEC", "TAXI_PROFILE",
    "GymProfile", "GymTextEnv", "Renderer", "ReplayDivergedError", "StateCodec", "allow_gym_id", "blackjack_policy",
    "ended_by_game", "gym_profile", "lake_grid", "lake_rows", "minigrid_policy", "observation_digest",
    "reached_goal", "tabular_policy",
]
