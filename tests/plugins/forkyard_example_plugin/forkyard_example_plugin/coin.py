"""A two-turn env: a hidden coin that ``peek()`` shows on turn 1 and ``guess(b)`` names on turn 2 (reward 1.0
when right). Imports ``envs`` only: env plugins load while ``envs`` is imported."""

from __future__ import annotations

from typing import Any

from envs import register_env
from envs.actions import ToolCall
from envs.core import IllegalActionError, Outcome, TextEnv


class CoinEnv(TextEnv):
    """A hidden coin (0 or 1, drawn at reset): ``peek()`` on turn 1, ``guess(b)`` on turn 2."""

    max_observation_length = 256
    max_action_length = 64

    def __init__(self, render_mode: str | None = None):
        super().__init__(max_turns=2, kwargs={}, render_mode=render_mode)
        self._coin = 0

    def _reset_task(self, options: dict[str, Any] | None) -> str:
        self._coin = int(self.np_random.integers(2))
        return "A coin is hidden. Turn 1: peek(). Turn 2: guess(b)."

    def _legal_actions(self) -> list[str]:
        return ["peek()"] if self._turn == 0 else ["guess(0)", "guess(1)"]

    def _act(self, call: ToolCall) -> Outcome:
        if self._turn == 0 and call.text() == "peek()":
            return Outcome(f"the coin is {self._coin}")
        if self._turn == 1 and call.name == "guess" and call.args in ((0,), (1,)):
            return Outcome("done", reward=float(call.args[0] == self._coin), terminated=True, reason="answered")
        raise IllegalActionError(f"not now: {call.text()}")

    def _task_state(self) -> dict[str, Any]:
        return {"coin": self._coin}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        self._coin = int(state["coin"])


def register_more() -> None:
    """The callable form of a ``forkyard.envs`` entry point: registers ``example/CoinMore-v0``."""
    register_env("example/CoinMore-v0", "forkyard_example_plugin.coin:CoinEnv")
