"""ClueProbe-v0: find a hidden target by probing its bits, then answer.

The benchmark task of the granularity study (docs/results/granularity.md): a hidden target is one of
``2**bits`` candidates, drawn from the env's seeded RNG at ``reset``. An episode has ``max_turns`` turns.
On turns 1..T-1 the agent calls ``probe(k)`` (``0 <= k < bits``), which returns bit ``k`` of the target
(``target >> k & 1``); on turn T it calls ``answer(c)``. Reward 1.0 for the right answer, else 0.0.
Probing a bit twice is allowed but wastes a turn. ``reset(options={"target": c})`` fixes the target
(for exact evaluation over all candidates). Answering before turn T or probing on turn T is an
illegal action (reward 0.0, turn consumed).

Optional features (:mod:`envs.features`): :class:`~envs.features.Demonstrator`
(:meth:`ClueProbeEnv.demo_action`), :class:`~envs.features.FiniteActions` (``action_vocabulary``) and
:class:`~envs.features.EvaluationResets` (every target once) and :class:`~envs.features.ToolSchemas`
(``probe`` and ``answer`` as JSON-schema tool definitions).

With bits=3 the optimal success rate is ``min(1, 2**(T-1) / 8)``: 0.25, 0.5, 1.0, 1.0 for T = 2..5.

Episode metrics: the ``info`` of the step that ends an episode carries ``info["episode_metrics"] =
{"distinct_probes": n}``, the number of distinct probe calls the agent wrote in the episode (distinct
action texts beginning with ``probe``, refused ones included). Trainers average it without knowing
what it means (the ``episode_metrics`` convention of :mod:`trainer.rollout`).
"""

from __future__ import annotations

import random
import re
import warnings
from typing import Any

from envs.actions import ToolCall, format_action
from envs.core import Action, IllegalActionError, Outcome, TextEnv
from envs.features import mixed_demo
from envs.tool_calls import function_tool

MAX_BITS = 16
_PROBE_RESULT = re.compile(r"probe\((\d+)\) -> bit \d+ of the target is ([01])\.")


class ClueProbeEnv(TextEnv):
    """ClueProbe-v0 (see module docstring).

    Args:
        max_turns: turns per episode T, 1..64 (default 5): every episode takes exactly this many (the turn
            budget's one name, as in every :class:`~envs.core.TextEnv`).
        bits: number of target bits, 1..16 (default 3, i.e. 8 candidates).
        render_mode: ``None`` or ``"ansi"``.
        turns: the former name of ``max_turns``; when given it wins (a client's ``{"turns": 4}`` over the
            registered default) and a DeprecationWarning says to rename it.

    Raises:
        ValueError: on out-of-range ``max_turns`` or ``bits``.
    """

    max_observation_length = 1024
    max_action_length = 256

    def __init__(self, max_turns: int = 5, bits: int = 3, render_mode: str | None = None, *,
                 turns: int | None = None):
        if turns is not None:
            warnings.warn("ClueProbe's turns is now max_turns (the turn budget's name in every env)",
                          DeprecationWarning, stacklevel=2)
            max_turns = turns
        if not isinstance(bits, int) or not 1 <= bits <= MAX_BITS:
            raise ValueError(f"bits must be an int in 1..{MAX_BITS}, got {bits!r}")
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or not 1 <= max_turns <= 64:
            raise ValueError(f"max_turns must be an int in 1..64, got {max_turns!r}")
        super().__init__(max_turns=max_turns, kwargs={"max_turns": max_turns, "bits": bits}, render_mode=render_mode)
        self.bits = bits
        self.n_candidates = 2**bits
        self._probe_actions = [format_action("probe", k) for k in range(bits)]
        self._answer_actions = [format_action("answer", c) for c in range(self.n_candidates)]
        self._target = 0

    def _reset_task(self, options: dict[str, Any] | None) -> str:
        unknown = sorted(set(options or {}) - {"target"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown}; ClueProbe takes only 'target'")
        fixed = bool(options) and "target" in options  # evaluation: enumerate every target exactly
        target = options["target"] if fixed else None
        if fixed and (not isinstance(target, int) or isinstance(target, bool) or not 0 <= target < self.n_candidates):
            raise ValueError(f"options['target'] must be an int in 0..{self.n_candidates - 1}, got {target!r}")
        self._target = int(self.np_random.integers(self.n_candidates))  # drawn always: the RNG stream is the same
        if fixed:
            self._target = target
        return (
            f"ClueProbe: a hidden target is one of {self.n_candidates} candidates, 0..{self.n_candidates - 1}. "
            f"You have {self.max_turns} turn(s). On turns 1..{self.max_turns - 1} call probe(k) with k in "
            f"0..{self.bits - 1} to read bit k of the target; on turn {self.max_turns} call answer(c).\n"
            + self._prompt()
        )

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; at the episode's end ``info["episode_metrics"]`` (module docstring)."""
        out = TextEnv.step(self, action)  # not super(): this runs on every step of every rollout
        if self._done:
            out[4]["episode_metrics"] = {"distinct_probes": len({a for a, _ in self._history if a[:5] == "probe"})}
        return out

    def _is_answer_turn(self) -> bool:
        return self._turn == self.max_turns - 1

    def _prompt(self) -> str:
        what = "answer(c)" if self._is_answer_turn() else "probe(k)"
        return f"Turn {self._turn + 1} of {self.max_turns}: call {what}."

    def _legal_actions(self) -> list[str]:
        return list(self._answer_actions if self._is_answer_turn() else self._probe_actions)

    @property
    def action_vocabulary(self) -> list[str]:
        """Every action text that is legal in some state (``bits`` probes, then ``2**bits`` answers); at a
        given turn the others are illegal there (turn consumed, reward 0). Used by exact evaluation
        (:func:`trainer.text.text_eval.exact_success`)."""
        return self._probe_actions + self._answer_actions

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The two tools as JSON-schema definitions (:class:`envs.features.ToolSchemas`)."""
        return [
            function_tool("probe", "reveal one bit of the hidden target (turns before the last)",
                          {"k": {"type": "integer", "minimum": 0, "maximum": self.bits - 1,
                                 "description": "bit index"}}),
            function_tool("answer", "name the target (the last turn only); reward 1 when right",
                          {"c": {"type": "integer", "minimum": 0, "maximum": self.n_candidates - 1,
                                 "description": "the candidate"}}),
        ]

    @classmethod
    def evaluation_resets(cls, kwargs: dict[str, Any], n_seeds: int) -> list[tuple[int, dict[str, int]]]:
        """Every target exactly once: ``[(0, {"target": c}) for c in 0..2**bits - 1]`` (``n_seeds`` is
        ignored: the candidates are few and enumerated exactly). The :class:`envs.features.EvaluationResets`
        feature, read by trainers' evaluations.

        Raises:
            ValueError: on kwargs the constructor refuses.
        """
        return [(0, {"target": c}) for c in range(cls(**kwargs).n_candidates)]

    def _act(self, call: ToolCall) -> Outcome:
        name = call.name
        if name not in ("probe", "answer") or call.kwargs or len(call.args) != 1 or type(call.args[0]) is not int:
            raise IllegalActionError(
                f"this env has two tools: probe(k) with an int k in 0..{self.bits - 1}, and answer(c) with an "
                f"int c in 0..{self.n_candidates - 1}; got {call.text()}."
            )
        value = call.args[0]
        if self._is_answer_turn():
            if name != "answer":
                raise IllegalActionError(f"turn {self._turn + 1} is the last turn: call answer(c), not {call.text()}.")
            if not 0 <= value < self.n_candidates:
                raise IllegalActionError(f"answer(c) needs c in 0..{self.n_candidates - 1}, got {value}.")
            correct = value == self._target
            verdict = "correct" if correct else f"wrong; the target was {self._target}"
            return Outcome(f"answer({value}) is {verdict}.", reward=1.0 if correct else 0.0, terminated=True,
                           reason="answered")
        if name != "probe":
            raise IllegalActionError(f"answer(c) is for the last turn ({self.max_turns}); on this turn call probe(k).")
        if not 0 <= value < self.bits:
            raise IllegalActionError(f"probe(k) needs k in 0..{self.bits - 1}, got {value}.")
        return Outcome(f"probe({value}) -> bit {value} of the target is {(self._target >> value) & 1}.")

    def _task_state(self) -> dict[str, Any]:
        return {"target": self._target}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        self._target = int(state["target"])

    # ----------------------------------------------------------------- reference policies
    def oracle_action(self) -> str:
        """The optimal action from the *visible* history alone (never the hidden target).

        Probes bits 0, 1, ... in order while turns remain, then answers the candidate whose known bits
        match what was observed (unknown bits 0). Success rate ``min(1, 2**(T-1) / 2**bits)``.
        """
        known: dict[int, int] = {}
        for _, obs in self._history:
            match = _PROBE_RESULT.match(obs)
            if match:
                known[int(match[1])] = int(match[2])
        if self._is_answer_turn():
            return format_action("answer", sum(b << k for k, b in known.items()))
        unknown = [k for k in range(self.bits) if k not in known]
        return format_action("probe", unknown[0] if unknown else 0)

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """A demonstration action: the format, without (most of) the strategy.

        Probes are always a uniformly random legal ``probe(k)`` (repeats allowed: no probing strategy).
        On the answer turn, with probability ``skill`` the answer that fits the probed bits
        (:meth:`oracle_action`), else a uniformly random legal ``answer(c)``. ``skill=0`` (default) is
        uniformly random legal actions; ``0 < skill < 1`` is a deliberately weak scripted policy (the
        warm start of the text-policy study, docs/results/text_policy.md). The demonstrator's success rate at
        bits=3, T=4 is about ``0.58 * skill + (1 - skill) / 8``, against 1.0 for the oracle.

        Raises:
            ValueError: if ``skill`` is outside [0, 1].
        """
        return mixed_demo(rng, skill, self.oracle_action if self._is_answer_turn() else None, self._legal_actions)
