"""Bandit-v0: RAGEN's two-armed bandit, a low-risk arm and a high-risk arm with names, one pull or several.

The task form is RAGEN's (RAGEN / StarPO, arXiv 2504.20073): two arms with names (RAGEN's defaults: ``phoenix``
and ``dragon``). The low-risk arm always pays ``lo_arm_score`` (0.1); the high-risk arm pays ``hi_arm_hiscore``
(1.0) with probability ``hi_arm_hiscore_prob`` (0.25), else ``hi_arm_loscore`` (0.0), so by default the
high-risk arm has the higher expected value (0.25 against 0.1). Which name is listed first is drawn per episode;
in RAGEN's form the prompt says only that each arm's payoff relates to its name, and the agent is to read the
names' meaning. ``describe_arms=True`` states both distributions in the prompt instead.

Actions: ``pull(arm)`` with an arm's name (``info["legal_actions"]`` lists both, in the prompt's order; names are
matched case-insensitively). The reward of a step is the pull's payoff, drawn from the env's seeded RNG; the
observation reports it (``pull('dragon') -> 1.0 points``) and the running total.

``pulls`` is the number of pulls: 1 (the default) is RAGEN's single-turn bandit; more make a multi-turn episode
whose return is the summed payoff, where the observed pulls tell the arms apart (and forks branch on which arm to
pull next). The last pull *terminates* the episode (``termination_reason="answered"``: the task is done). The turn
budget ``max_turns`` (default ``pulls + 1``: one refused call may be retried) *truncates* it when refused calls
use it up (``"invalid"`` when the last turn's call was refused). ``hidden_roles=True`` draws per episode
which name is the high-risk arm, so that only observed pulls tell (then the names say nothing).

The step that ends an episode carries ``info["episode_metrics"] = {"best_arm_share": s, "success": 0.0 or 1.0,
"total_reward": r}``: ``s`` the share of the episode's pulls on an arm of the highest expected value, ``success``
1.0 when that is more than half of them (with one pull: RAGEN's success, the high-expected-value arm pulled).

Tasks: the arm order (and, with ``hidden_roles``, the roles) is the finite task set; :meth:`BanditEnv.evaluation_resets`
balances it over seeds (the seeds give the payoff draws). Fork method ``state_codec``.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

from envs.actions import ToolCall, bind_arguments, format_action
from envs.core import Action, IllegalActionError, Outcome, TextEnv
from envs.features import mixed_demo
from envs.tool_calls import function_tool

MAX_PULLS = 100
MAX_TURNS = 200
MAX_SCORE = 1000.0
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9 _-]{0,31}")


def _score(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or abs(value) > MAX_SCORE:
        raise ValueError(f"{name} must be a finite number in [-{MAX_SCORE:g}, {MAX_SCORE:g}], got {value!r}")
    return float(value)


class BanditEnv(TextEnv):
    """Bandit-v0 (see module docstring): RAGEN's two-armed bandit, single-turn by default, multi-turn by ``pulls``.

    Args:
        max_turns: the turn budget, pulls..200, or None (default): ``pulls + 1`` (a refused call takes a turn).
        pulls: pulls per episode, 1..100 (default 1, RAGEN's single turn); the last one ends the episode.
        lo_arm_name: the low-risk arm's name (RAGEN's default ``phoenix``): 1..32 characters, a letter first,
            then letters, digits, spaces, ``_`` or ``-``.
        hi_arm_name: the high-risk arm's name (RAGEN's default ``dragon``), the same form, distinct from
            ``lo_arm_name`` ignoring case.
        lo_arm_score: the low-risk arm's sure payoff (default 0.1); every payoff is a finite number in
            [-1000, 1000].
        hi_arm_loscore: the high-risk arm's usual payoff (default 0.0).
        hi_arm_hiscore: the high-risk arm's rare payoff (default 1.0).
        hi_arm_hiscore_prob: probability of ``hi_arm_hiscore``, in [0, 1] (default 0.25).
        describe_arms: state both payoff distributions in the prompt (default False: RAGEN's prompt, names only).
        hidden_roles: draw per episode which name is the high-risk arm (default False: the names fix the roles).
        render_mode: ``None`` or ``"ansi"``.

    Raises:
        ValueError: on a setting of the wrong type or out of range.
    """

    max_observation_length = 2048
    max_action_length = 256
    fork_method = "state_codec"

    def __init__(self, max_turns: int | None = None, pulls: int = 1, lo_arm_name: str = "phoenix",
                 hi_arm_name: str = "dragon",
                 lo_arm_score: float = 0.1, hi_arm_loscore: float = 0.0, hi_arm_hiscore: float = 1.0,
                 hi_arm_hiscore_prob: float = 0.25, describe_arms: bool = False, hidden_roles: bool = False,
                 render_mode: str | None = None):
        if not isinstance(pulls, int) or isinstance(pulls, bool) or not 1 <= pulls <= MAX_PULLS:
            raise ValueError(f"pulls must be an int in 1..{MAX_PULLS}, got {pulls!r}")
        turns = pulls + 1 if max_turns is None else max_turns
        if not isinstance(turns, int) or isinstance(turns, bool) or not pulls <= turns <= MAX_TURNS:
            raise ValueError(f"max_turns must be an int in pulls..{MAX_TURNS} ({pulls}..{MAX_TURNS}) or None, "
                             f"got {max_turns!r}")
        for key, name in (("lo_arm_name", lo_arm_name), ("hi_arm_name", hi_arm_name)):
            if not isinstance(name, str) or not _NAME.fullmatch(name) or name != name.strip():
                raise ValueError(f"{key} must be 1..32 characters: a letter, then letters, digits, spaces, '_' or "
                                 f"'-', without surrounding spaces; got {name!r}")
        if lo_arm_name.lower() == hi_arm_name.lower():
            raise ValueError(f"the arms need distinct names (ignoring case), got {lo_arm_name!r} twice")
        scores = {k: _score(k, v) for k, v in (("lo_arm_score", lo_arm_score), ("hi_arm_loscore", hi_arm_loscore),
                                                ("hi_arm_hiscore", hi_arm_hiscore))}
        prob = _score("hi_arm_hiscore_prob", hi_arm_hiscore_prob)
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"hi_arm_hiscore_prob must be in [0, 1], got {hi_arm_hiscore_prob!r}")
        for key, flag in (("describe_arms", describe_arms), ("hidden_roles", hidden_roles)):
            if not isinstance(flag, bool):
                raise ValueError(f"{key} must be true or false, got {flag!r}")
        super().__init__(max_turns=turns, render_mode=render_mode, kwargs={
            "max_turns": max_turns, "pulls": pulls, "lo_arm_name": lo_arm_name, "hi_arm_name": hi_arm_name,
            "lo_arm_score": lo_arm_score, "hi_arm_loscore": hi_arm_loscore, "hi_arm_hiscore": hi_arm_hiscore,
            "hi_arm_hiscore_prob": hi_arm_hiscore_prob, "describe_arms": describe_arms, "hidden_roles": hidden_roles})
        self.names = (lo_arm_name, hi_arm_name)
        self.pulls = pulls
        self.lo_score, self.hi_loscore, self.hi_hiscore = (scores["lo_arm_score"], scores["hi_arm_loscore"],
                                                           scores["hi_arm_hiscore"])
        self.hi_prob = prob
        self.describe_arms, self.hidden_roles = describe_arms, hidden_roles
        #: Expected payoff of the low-risk and the high-risk arm.
        self.expected = {"lo": self.lo_score, "hi": prob * self.hi_hiscore + (1 - prob) * self.hi_loscore}
        self._order: list[str] = list(self.names)  # the arms' names as the prompt lists them
        self._hi = hi_arm_name  # this episode's high-risk arm
        self._pulls: list[list[Any]] = []  # [name, payoff] of every pull so far (visible in the history too)

    # ----------------------------------------------------------------- episode
    @classmethod
    def evaluation_resets(cls, kwargs: dict[str, Any], n_seeds: int) -> list[tuple[int, dict[str, Any]]]:
        """Every task (arm order; with ``hidden_roles`` also which name is high-risk) equally often, over
        ``max(n_seeds, number of tasks)`` resets: seed ``k // tasks`` with the ``k % tasks``-th task, so the
        payoff draws differ across seeds (:class:`envs.features.EvaluationResets`).

        Raises:
            ValueError: on kwargs the constructor refuses.
        """
        env = cls(**kwargs)
        tasks: list[dict[str, Any]] = [{"hi_arm_first": first} for first in (True, False)]
        if env.hidden_roles:
            tasks = [dict(t, hi_arm=name) for t in tasks for name in env.names]
        total = max(int(n_seeds), len(tasks))  # (n_seeds comes from a trainer: an int)
        return [(k // len(tasks), dict(tasks[k % len(tasks)])) for k in range(total)]

    def _reset_task(self, options: dict[str, Any] | None) -> str:
        options = dict(options or {})
        unknown = sorted(set(options) - {"hi_arm_first", "hi_arm"})
        if unknown:
            raise ValueError(f"unknown reset options {unknown}; Bandit takes 'hi_arm_first' and 'hi_arm'")
        if "hi_arm_first" in options and not isinstance(options["hi_arm_first"], bool):
            raise ValueError(f"options['hi_arm_first'] must be true or false, got {options['hi_arm_first']!r}")
        if "hi_arm" in options and (not self.hidden_roles or options["hi_arm"] not in self.names):
            raise ValueError(f"options['hi_arm'] needs hidden_roles=True and one of {list(self.names)}, "
                             f"got {options['hi_arm']!r}")
        # Both draws always happen, so the payoff draws that follow do not depend on the options or settings.
        swap, hi_first = bool(self.np_random.random() < 0.5), bool(self.np_random.random() < 0.5)
        hi = self.names[0] if swap and self.hidden_roles else self.names[1]
        hi = options.get("hi_arm", hi)
        lo = self.names[0] if hi == self.names[1] else self.names[1]
        hi_first = options.get("hi_arm_first", hi_first)
        self._hi = hi
        self._order = [hi, lo] if hi_first else [lo, hi]
        self._pulls = []
        a, b = self._order
        if self.hidden_roles:
            hint = (f"One arm pays {self.lo_score:g} on every pull; the other pays {self.hi_hiscore:g} with "
                    f"probability {self.hi_prob:g}, else {self.hi_loscore:g}. Which is which is not told: the names "
                    "say nothing about it.")
        elif self.describe_arms:
            hint = (f"{lo} pays {self.lo_score:g} on every pull; {hi} pays {self.hi_hiscore:g} with probability "
                    f"{self.hi_prob:g}, else {self.hi_loscore:g}.")
        else:
            hint = ("Each arm has its own payoff distribution, related to its name: think about what the names "
                    "suggest about how their payoffs behave.")
        pulls = "one pull" if self.pulls == 1 else f"{self.pulls} pulls; your return is the sum of the payoffs"
        return (f"Bandit: two arms, {a} and {b}. {hint} You have {pulls}. Which arm pays more on average? Pull an arm "
                f"with pull(arm), e.g. pull({a!r}) or pull({b!r}).\n{self._prompt()}")

    def _prompt(self) -> str:
        return (f"Pull {len(self._pulls) + 1} of {self.pulls} (turn {self._turn + 1} of {self.max_turns}): call "
                f"pull(arm) with arm {self._order[0]!r} or {self._order[1]!r}.")

    def _legal_actions(self) -> list[str]:
        return [format_action("pull", name) for name in self._order]

    @property
    def action_vocabulary(self) -> list[str]:
        """``pull(name)`` for both arms (both are legal on every turn)."""
        return [format_action("pull", name) for name in self.names]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """``pull(arm)`` as a JSON-schema tool definition (:class:`envs.features.ToolSchemas`); ``arm`` is one of
        the two names."""
        return [function_tool("pull", "pull one arm of the bandit; the reward is its payoff",
                              {"arm": {"type": "string", "enum": list(self.names),
                                       "description": "the arm's name"}})]

    def _act(self, call: ToolCall) -> Outcome:
        if call.name != "pull":
            raise IllegalActionError(f"this env has one tool: pull(arm) with arm {self._order[0]!r} or "
                                     f"{self._order[1]!r}; got {call.text()}.")
        arm = bind_arguments(call, ["arm"]).get("arm")
        match = [n for n in self.names if isinstance(arm, str) and arm.strip().lower() == n.lower()]
        if not match:
            raise IllegalActionError(f"pull(arm) needs arm {self._order[0]!r} or {self._order[1]!r}; "
                                     f"got {call.text()}.")
        name = match[0]
        if name == self._hi:
            payoff = self.hi_hiscore if self.np_random.random() < self.hi_prob else self.hi_loscore
        else:
            payoff = self.lo_score
        self._pulls = self._pulls + [[name, payoff]]  # a new list: forks share the old one (a shallow copy)
        total = sum(p for _, p in self._pulls)
        text = f"pull({name!r}) -> {payoff:g} points (total {total:g} after {len(self._pulls)} pull(s))."
        if len(self._pulls) >= self.pulls:
            return Outcome(text, reward=payoff, terminated=True, reason="answered")
        return Outcome(text, reward=payoff)

    def _best(self) -> set[str]:
        """The names of the arms with the highest expected payoff this episode."""
        lo = self.names[0] if self._hi == self.names[1] else self.names[1]
        best = max(self.expected.values())
        return {n for n, role in ((lo, "lo"), (self._hi, "hi")) if self.expected[role] == best}

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; at the episode's end ``info["episode_metrics"]`` (module docstring)."""
        out = TextEnv.step(self, action)
        if self._done:
            best = self._best()
            share = sum(n in best for n, _ in self._pulls) / len(self._pulls) if self._pulls else 0.0
            out[4]["episode_metrics"] = {"best_arm_share": share, "success": float(share > 0.5),
                                         "total_reward": float(sum(p for _, p in self._pulls))}
        return out

    # ----------------------------------------------------------------- state codec
    def _task_state(self) -> dict[str, Any]:
        return {"order": list(self._order), "hi": self._hi, "pulls": [list(p) for p in self._pulls]}

    def _load_task_state(self, state: dict[str, Any]) -> None:
        order, hi = [str(n) for n in state["order"]], str(state["hi"])
        if sorted(order) != sorted(self.names) or hi not in self.names:
            raise ValueError(f"a Bandit state names arms {order}, this env's are {list(self.names)}")
        self._order, self._hi = order, hi
        self._pulls = [[str(n), float(p)] for n, p in state["pulls"]]

    # ----------------------------------------------------------------- reference policies
    def _posterior_hi(self) -> dict[str, float]:
        """P(name is the high-risk arm | the pulls seen), for each name: 1/0 when the roles are fixed by name."""
        if not self.hidden_roles:
            return {n: float(n == self.names[1]) for n in self.names}

        def likelihood(hi_name: str) -> float:
            p = 1.0
            for name, payoff in self._pulls:
                if name == hi_name:
                    p *= ((self.hi_prob if payoff == self.hi_hiscore else 0.0)
                          + ((1 - self.hi_prob) if payoff == self.hi_loscore else 0.0))
                else:
                    p *= float(payoff == self.lo_score)
            return p

        first, second = (likelihood(n) for n in self.names)
        if first + second == 0:
            return {n: 0.5 for n in self.names}
        return {self.names[0]: first / (first + second), self.names[1]: second / (first + second)}

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """A demonstration action (:class:`envs.features.Demonstrator`), from what the agent can know.

        With probability ``skill``, the arm of the higher expected payoff given what is known: with the roles
        fixed by name (RAGEN's form), the arm that the names stand for (the env's public settings, which
        ``describe_arms`` puts in the prompt and RAGEN's prompt asks the agent to read from the names); with
        ``hidden_roles``, the posterior of the roles given the observed pulls (an even split goes to the arm
        pulled fewer times, the first listed on a tie: it explores). Else a uniformly random arm. ``skill=1``
        always pulls the best arm with fixed roles, and after at most one exploratory pull with hidden roles
        when the payoffs tell the arms apart (the defaults do: 0.1 comes from the low-risk arm only).

        Raises:
            ValueError: if ``skill`` is outside [0, 1].
        """
        return mixed_demo(rng, skill, self._best_pull, self._legal_actions)

    def _best_pull(self) -> str:
        """The scripted pull of :meth:`demo_action`: the arm of the higher expected payoff given what is known (an
        even split: the arm pulled fewer times, the first listed on a tie)."""
        post = self._posterior_hi()
        value = {n: post[n] * self.expected["hi"] + (1 - post[n]) * self.expected["lo"] for n in self._order}
        a, b = self._order
        if math.isclose(value[a], value[b]):
            counts = {n: sum(p[0] == n for p in self._pulls) for n in self._order}
            pick = a if counts[a] <= counts[b] else b
        else:
            pick = a if value[a] > value[b] else b
        return format_action("pull", pick)
