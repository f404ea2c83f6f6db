"""The optional features an env may offer beyond the :class:`~envs.core.TextEnv` API, as protocols.

Trainers test for a feature with ``isinstance(env, Feature)`` (or ``issubclass(cls, Feature)`` for a
feature of the class) and fall back to the default the protocol states when an env lacks it. An env offers
a feature by defining the member; no base class is needed. ClueProbe offers all four; FileQA offers
:class:`ToolSchemas`. Beside :class:`Demonstrator`, the rule most demonstrators share: :func:`check_skill` and
:func:`mixed_demo`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Demonstrator(Protocol):
    """An env that can play demonstration actions: ``demo_action(rng, skill)`` returns an action text for the
    current state, drawn with ``rng`` from the visible state only (never hidden task state, beyond what
    ``skill`` deliberately lets through as the env documents).

    ``skill`` in [0, 1] is how much strategy the demonstrations carry: 0 is the action format without
    strategy (e.g. uniformly random legal actions), 1 the env's best scripted play. Supervised warm starts
    (:func:`trainer.text.text_sft.demo_episodes`) train on these actions; without this feature they play
    uniformly random actions of ``info["legal_actions"]``.
    """

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str: ...


def check_skill(skill: float) -> float:
    """``skill`` itself when it is in [0, 1], the range of :meth:`Demonstrator.demo_action`'s ``skill``.

    Raises:
        ValueError: ``skill`` outside [0, 1] (NaN included).
    """
    if not 0.0 <= skill <= 1.0:
        raise ValueError(f"skill must be in [0, 1], got {skill!r}")
    return skill


def mixed_demo(rng: random.Random, skill: float, best: Callable[[], str | None] | None,
               legal: Callable[[], Sequence[str]]) -> str:
    """A demonstration action by the mixing rule most demonstrators share: with probability ``skill`` the scripted
    action ``best()``, else a uniformly random legal action.

    Exactly: ``skill`` is checked (:func:`check_skill`); then, when ``best`` is given and ``skill > 0``, one
    ``rng.random()`` is drawn, and when it is below ``skill`` the action is ``best()`` unless that is None (no
    scripted action in this state); every other way it is ``rng.choice(legal())``. So ``skill=0``, or no ``best``,
    draws exactly what a random-menu policy draws from ``info["legal_actions"]``, and a seeded ``rng`` gives the
    same actions whichever env calls it. An env that mixes otherwise (another draw, another fallback) documents its
    own rule and calls :func:`check_skill` alone.

    Args:
        rng: the demonstration's random stream (the only one drawn from).
        skill: the probability of the scripted action, in [0, 1].
        best: the scripted action now, or None when there is none; None: no script (random play at any skill).
        legal: the legal actions now (called only when the action is drawn at random).

    Raises:
        ValueError: ``skill`` outside [0, 1].
    """
    check_skill(skill)
    if best is not None and skill and rng.random() < skill:
        action = best()
        if action is not None:
            return action
    return rng.choice(legal())


@runtime_checkable
class FiniteActions(Protocol):
    """An env whose action set is finite and known in advance: ``action_vocabulary`` lists every action
    text that is legal in *some* state (at a given turn the others are refused like any illegal action).

    Exact evaluation (:func:`trainer.text.text_eval.exact_success`) enumerates these texts, with the state's
    ``info["legal_actions"]``, at every node of its tree; without this feature it enumerates the legal
    actions alone.
    """

    @property
    def action_vocabulary(self) -> list[str]: ...


@runtime_checkable
class EvaluationResets(Protocol):
    """An env that declares how to evaluate a policy on it: the ``(seed, options)`` pairs to reset with,
    each evaluation episode weighted equally (ClueProbe: every target exactly once).

    A classmethod of the constructor kwargs (the registered defaults merged with the caller's), so a
    trainer gets the same resets from the registered class whether the env runs here or on a server
    (:class:`envs.remote.RemoteEnv`), without an env instance at hand. ``n_seeds`` is how many resets the
    trainer would use otherwise; an env with a finite set of tasks may ignore it. Subclasses inherit the
    feature. Without it trainers evaluate on ``n_seeds`` held-out seeds
    (:func:`trainer.loop.evaluation_resets`).
    """

    @classmethod
    def evaluation_resets(cls, kwargs: dict[str, Any],
                          n_seeds: int) -> list[tuple[int | None, dict[str, Any] | None]]: ...


@runtime_checkable
class ToolSchemas(Protocol):
    """An env that describes its tools as JSON-schema tool definitions (the OpenAI / Hugging Face chat-template
    ``tools=`` format, :mod:`envs.tool_calls`): ``tool_schemas()`` returns one definition per tool, ``answer``
    included. A policy renders its prompt with them and maps tool calls in model output to actions with
    :func:`envs.tool_calls.parse_model_output`; a server serves them at ``GET /v1/envs/{session_id}/tools``.
    Without this feature an env has no declared tools (its actions are the ``name(args)`` texts alone).
    """

    def tool_schemas(self) -> list[dict[str, Any]]: ...
