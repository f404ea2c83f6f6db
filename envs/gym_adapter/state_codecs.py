"""The state codecs of wrapped envs: a wrapped env's state as plain JSON data and back (fork method
``"state_codec"`` of :mod:`envs.gym_adapter`, whose docstring states the protocol).

The toy-text envs keep their state in a few attributes, and their codecs here name them (FrozenLake and
CliffWalking ``s`` and ``lastaction``; Taxi also ``fickle_step`` and ``taxi_orientation``; Blackjack the hands and
the dealer's face card), each with the wrapped env's RNG state; :data:`METHOD_CODEC` is the codec of a wrapped env
that offers its own ``get_state()`` / ``set_state(state)`` methods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class StateCodec:
    """A wrapped env's state codec (:mod:`envs.gym_adapter`): ``get(env) -> JSON data`` and ``set(env, data)``.

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


def _method_get(env: Any) -> dict[str, Any]:
    return env.get_state()


def _method_set(env: Any, state: dict[str, Any]) -> None:
    env.set_state(state)


#: The documented protocol of a wrapped env with its own codec: methods ``get_state()`` and ``set_state(state)``.
METHOD_CODEC = StateCodec(_method_get, _method_set)
