"""A wrapped env's action space as forkyard tools (:class:`ActionSet`): the menu, the reading of a call, the tool
schemas.

A Discrete(n) space becomes n tools without arguments, one per action, named by the profile or the
``action_names`` kwarg, else one tool ``act(a)`` with the integer action (``start <= a < start + n``); a
``gymnasium.spaces.Text`` space becomes ``act(text)``, with a fixed curated menu (the profile's, else four
strings drawn once from the space with seed 0). :mod:`envs.gym_adapter` (Actions) has the user's view.
"""

from __future__ import annotations

import copy
import keyword
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gymnasium import spaces

from envs.actions import ToolCall, bind_arguments, format_action
from envs.core import IllegalActionError
from envs.tool_calls import function_tool

#: Tool names a client's ``action_names`` may not take: TRL's tool-env protocol members and our generic tool.
RESERVED_TOOL_NAMES = frozenset({"reset", "step", "close", "get_reward", "env", "rewards", "done", "info", "act"})


@dataclass(frozen=True)
class ActionSet:
    """The tools of one wrapped env (module docstring); immutable, so forks share it.

    Attributes:
        gym_id: the wrapped env's id (in messages).
        text: whether the space is Text (``act(text)``); else Discrete.
        names: the Discrete actions' tool names in index order, or None (``act(a)``, or a Text space).
        start, n: the Discrete space's first action and size (0 for a Text space).
        menu: ``info["legal_actions"]``: every action text of a Discrete space, the curated menu of a Text one.
        space: the Text space (length limits and character set), or None.
    """

    gym_id: str
    text: bool
    names: tuple[str, ...] | None
    start: int
    n: int
    menu: tuple[str, ...]
    space: spaces.Text | None = None

    @classmethod
    def of(cls, gym_id: str, wrapped: Any, names: Any, text_menu: Callable[[Any], list[str]] | None) -> ActionSet:
        """The action set of ``wrapped`` (a wrapped env) with the tool ``names`` (None: ``act``) and, for a Text
        space, the profile's ``text_menu`` (None: sampled).

        Raises:
            ValueError: the space is neither Discrete nor Text, or ``names`` are not valid here (a list of distinct
                ASCII identifiers of at most 32 characters, not keywords nor :data:`RESERVED_TOOL_NAMES`, one per
                Discrete action).
        """
        space = wrapped.action_space
        if isinstance(space, spaces.Text):
            if names is not None:
                _as_names(names)
                raise ValueError(f"{gym_id} has a Text action space: action_names apply to Discrete actions only")
            texts = text_menu(wrapped) if text_menu else _sample_text_menu(space)
            return cls(gym_id, True, None, 0, 0, tuple(format_action("act", str(t)) for t in texts), space)
        if not isinstance(space, spaces.Discrete):
            raise ValueError(f"{gym_id} has a {type(space).__name__} action space; GymTextEnv takes Discrete or Text")
        n, start = int(space.n), int(space.start)
        checked = None if names is None else _checked_names(gym_id, names, n)
        menu = (tuple(format_action(name) for name in checked) if checked is not None
                else tuple(format_action("act", start + i) for i in range(n)))
        return cls(gym_id, False, checked, start, n, menu)

    def decode(self, call: ToolCall) -> Any:
        """The wrapped env's action for ``call``. Raises IllegalActionError (explaining) when it is none."""
        if self.text:
            assert self.space is not None
            if call.name != "act":
                raise IllegalActionError(f"{self.gym_id} takes one tool, act(text); got {call.text()}.")
            text = bind_arguments(call, ["text"]).get("text")
            if not isinstance(text, str) or not self.space.contains(text):
                raise IllegalActionError(f"act(text) needs a string of {self.space.min_length}.."
                                         f"{self.space.max_length} characters from the env's character set; got "
                                         f"{call.text()}.")
            return text
        if self.names is not None:
            if call.name not in self.names:
                raise IllegalActionError(f"{call.text()} is not an action of {self.gym_id}; call one of "
                                         f"{', '.join(self.menu)}.")
            if call.args or call.kwargs:
                raise IllegalActionError(f"{call.name}() takes no arguments; got {call.text()}.")
            return self.start + self.names.index(call.name)
        low, high = self.start, self.start + self.n - 1
        if call.name != "act":
            raise IllegalActionError(f"{self.gym_id} takes one tool, act(a) with an int a in {low}..{high}; "
                                     f"got {call.text()}.")
        a = bind_arguments(call, ["a"]).get("a")
        if type(a) is not int or not low <= a <= high:
            raise IllegalActionError(f"act(a) needs an int a in {low}..{high}; got {call.text()}.")
        return a

    def action_text(self, action: Any) -> str:
        """The text of a wrapped env's action, as the agent writes it."""
        if self.text:
            return format_action("act", str(action))
        return self.menu[int(action) - self.start]

    def checked(self, action: Any) -> Any:
        """``action`` when it is an action of the space (a snapshot's action log). Raises ValueError otherwise."""
        ok = (isinstance(action, str) and self.space is not None and self.space.contains(action) if self.text else
              type(action) is int and self.start <= action < self.start + self.n)
        if not ok:
            raise ValueError(f"the snapshot's action log holds {action!r}, which is no action of {self.gym_id}")
        return action

    def tool_schemas(self, helps: Sequence[str]) -> list[dict[str, Any]]:
        """One tool per named action (no arguments; ``helps``: their descriptions, by index), else ``act(a)``
        (integer) or ``act(text)`` (string)."""
        if self.text:
            assert self.space is not None
            return [function_tool("act", f"send one text action to {self.gym_id}",
                                  {"text": {"type": "string", "minLength": int(self.space.min_length),
                                            "maxLength": int(self.space.max_length), "description": "the action"}})]
        if self.names is not None:
            return [function_tool(n, helps[i] if i < len(helps) else f"action {self.start + i} of {self.gym_id}",
                                  {}) for i, n in enumerate(self.names)]
        return [function_tool("act", f"take one action of {self.gym_id}",
                              {"a": {"type": "integer", "minimum": self.start,
                                     "maximum": self.start + self.n - 1, "description": "the action"}})]


def _as_names(names: Any) -> tuple[str, ...]:
    if not isinstance(names, (list, tuple)) or not all(isinstance(name, str) for name in names):
        raise ValueError(f"action_names must be a list of strings, got {names!r}")
    return tuple(names)


def _checked_names(gym_id: str, names: Any, n: int) -> tuple[str, ...]:
    names = _as_names(names)
    if len(names) != n:
        raise ValueError(f"action_names needs {n} names for {gym_id}, got {len(names)}")
    bad = [name for name in names if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_")
           or len(name) > 32 or name in RESERVED_TOOL_NAMES or not name.isascii()]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"action_names must be distinct ASCII identifiers of at most 32 characters, not "
                         f"keywords nor {sorted(RESERVED_TOOL_NAMES)}; refused: {bad or names}")
    return names


def _sample_text_menu(space: spaces.Text) -> list[str]:
    sampler = copy.deepcopy(space)
    sampler.seed(0)
    return list(dict.fromkeys(str(sampler.sample()) for _ in range(4)))
