"""TicketAPI-v0: multi-turn function calling against a stateful simulated support-ticket API, checked on final state.

The task form of the multi-turn category of the Berkeley Function Calling Leaderboard (BFCL v3, Patil et al., "The
Berkeley Function Calling Leaderboard", ICML 2025; the multi-turn set: simulated APIs such as a file system, a
ticket system and a trading bot, whose state the calls change, and a task checked on the API's final state). This
is our own small ticket system, not BFCL's: the ``bfcl-eval`` package (2026.3.23) does ship its API classes as plain
Python, but it requires about thirty packages (model clients such as openai, anthropic, cohere and google-genai,
sentence-transformers, faiss-cpu) and pins ``numpy==1.26.4``, which conflicts with the numpy 2 this project runs on.

An episode: at ``reset`` an initial state is generated from the seed (``tickets`` tickets with ids from a random
base, each with a title, description, assignee among ``users`` team members, priority ``low`` / ``medium`` /
``high`` / ``urgent``, status ``open`` / ``in_progress`` / ``resolved`` / ``closed``; ``open`` and ``in_progress``
are *active*) and one task of a kind drawn from ``kinds``:

``close``     close every active ticket of user U with priority P (1..4 of them) and answer how many;
``reassign``  reassign every active ticket of U (1..3) to V, with the comment ``handed over from U`` on each;
``escalate``  set every active ticket whose title mentions K (1..3 not yet urgent) to priority ``urgent``;
``resolve``   resolve the active ticket titled T with resolution R;
``create``    create a ticket (title, priority, assignee given) and answer its id;
``count``     answer how many active high or urgent tickets U has (0..), changing nothing.

The first observation states the team, the fields, the tools and the task, not the tickets: the agent lists or
gets them. Tools (``tool_schemas()``, typed JSON schemas): ``list_tickets(status, assignee, priority)`` (filters
optional), ``get_ticket(ticket_id)``, ``create_ticket(title, priority, assignee)``, ``update_ticket(ticket_id,
title, priority, assignee)`` (at least one field), ``add_comment(ticket_id, text)``, ``close_ticket(ticket_id)``,
``resolve_ticket(ticket_id, resolution)`` and the final ``answer(value)``. Each call's observation is
``call -> JSON``.

Errors: a call that does not fit a tool's schema (no such tool, an unknown or missing argument, a value of the
wrong JSON type) is an invalid action (:class:`~envs.core.IllegalActionError`: explained, reward 0, turn consumed,
``info["invalid_action"]``). A well-typed call the API refuses (an unknown ticket id or user, a value outside a
field's choices, an empty text, changing a closed ticket, resolving a resolved one) is an *API error*, as a real API
answers it: the observation is ``{"error": ...}``, the state is unchanged, the reward is 0 and the turn is consumed,
but it is a legal action (``info["api_error"] = True``, ``info["invalid_action"] = False``).

Reward: ``answer(value)`` ends the episode (terminated, ``"answered"``) with reward 1.0 when the API's final state
equals the gold state the generator computed (every ticket and every field, comments included, and no other ticket
created) and, for ``close``, ``create`` and ``count``, the value is the right number (an int or its digits); other
kinds take any value (``answer('done')``). Otherwise 0.0; ``info["check"]`` says which part failed. An episode
that runs out of turns is truncated with reward 0.

Legal-action menu (``info["legal_actions"]``, a finite curated menu from the visible state; any well-typed call is
legal): ``list_tickets()`` and a listing filtered by the task's user; for up to 6 tickets seen in a listing or a
``get_ticket`` (those the task names first, then by id) the task's change on it (right for some, wrong for the
others) and ``get_ticket`` of the first two; for ``create`` the asked call and one with a wrong priority; answers
``answer(0)``..``answer(5)`` for counting tasks, ``answer(id)`` of created tickets for ``create``, else
``answer('done')``.

Optional features (:mod:`envs.features`): :class:`~envs.features.ToolSchemas` and :class:`~envs.features.Demonstrator`
(:meth:`TicketAPIEnv.demo_action`: lists, then makes the task's changes on the tickets it saw, then answers).
The API state is plain JSON and forks with the episode (``fork_method = "state_codec"``); the tools touch nothing
outside the env. ``info["episode_metrics"]`` at an episode's end: ``{"success": 0.0 or 1.0, "api_errors": n}``
(success: reward 1). The simulated API and its tool schemas are :mod:`envs.suite.ticket_system`, the generated
states and tasks :mod:`envs.suite.ticket_tasks`; this module is the env.
"""

from __future__ import annotations

import json
import random
from typing import Any

from envs.actions import ToolCall, format_action
from envs.core import Action, IllegalActionError, Outcome, TextEnv
from envs.features import mixed_demo
from envs.suite.ticket_system import PRIORITIES, TOOLS, ApiError, TicketApi, bind_call, copy_json, tool_schemas
from envs.suite.ticket_tasks import KINDS, USERS, draw_state, draw_task, gold_state, plan_task

__all__ = ["KINDS", "TicketAPIEnv"]

MAX_TICKETS = 40
MAX_TURNS = 64
#: Menu: at most this many seen tickets get calls in ``info["legal_actions"]``.
MENU_TICKETS = 6


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
    return value


class TicketAPIEnv(TextEnv):
    """TicketAPI-v0 (see module docstring).

    Args:
        max_turns: tool calls per episode, 1..64 (default 12; the longest task takes 8 calls with its listing).
        tickets: tickets in the initial state, 4..40 (default 12).
        users: team members, 2..8 (default 4).
        kinds: task kinds to draw from, a non-empty list of :data:`KINDS` without repeats (default: all).
        render_mode: ``None`` or ``"ansi"``.

    Raises:
        ValueError: on a setting of the wrong type or out of range (the message names it).
    """

    max_observation_length = 8192
    max_action_length = 1024
    fork_method = "state_codec"

    def __init__(self, max_turns: int = 12, tickets: int = 12, users: int = 4, kinds: list[str] | None = None,
                 render_mode: str | None = None):
        _int_in("max_turns", max_turns, 1, MAX_TURNS)
        _int_in("tickets", tickets, 4, MAX_TICKETS)
        _int_in("users", users, 2, len(USERS))
        if kinds is not None and (not isinstance(kinds, (list, tuple)) or not kinds
                                  or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds)):
            raise ValueError(f"kinds must be a non-empty list of distinct kinds from {list(KINDS)}, got {kinds!r}")
        super().__init__(max_turns=max_turns, render_mode=render_mode, kwargs={
            "max_turns": max_turns, "tickets": tickets, "users": users,
            "kinds": None if kinds is None else list(kinds)})
        self.n_tickets, self.n_users = tickets, users
        self.kinds = tuple(kinds) if kinds is not None else KINDS
        self._state: dict[str, Any] = {"tickets": [], "next_id": 1, "users": []}
        self._gold: dict[str, Any] = {}
        self._task: dict[str, Any] = {"kind": "count", "params": {}, "answer": None}
        self._seen: dict[int, dict[str, Any]] = {}  # tickets as the agent last saw them (list_tickets, get_ticket)
        self._created: list[int] = []  # ids the agent's create_ticket calls returned
        self._api_errors = 0

    # ----------------------------------------------------------------- episode
    def _reset_task(self, options: dict[str, Any] | None) -> str:
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; TicketAPI takes none")
        for _ in range(100):
            state = draw_state(self.np_random, self.n_users, self.n_tickets)
            kind = self.kinds[int(self.np_random.integers(len(self.kinds)))]
            task = draw_task(self.np_random, kind, state)
            if task is not None:
                break
        else:  # pragma: no cover - every kind has a task on most states; 100 misses in a row do not happen
            raise RuntimeError(f"no {kind} task found in 100 generated states")
        gold = gold_state(state, task.pop("calls"))
        self._state, self._gold, self._task = state, gold, task
        self._seen, self._created, self._api_errors = {}, [], 0
        return (
            f"TicketAPI: you operate a support-ticket system by tool calls, one per turn. Team: "
            f"{', '.join(state['users'])}. A ticket has an id, title, description, assignee, priority (low, medium, "
            "high, urgent), status (open, in_progress, resolved, closed; open and in_progress are active), a "
            "resolution and comments; closed tickets cannot be changed. Tools: list_tickets(status=None, "
            "assignee=None, priority=None), get_ticket(ticket_id), create_ticket(title, priority, assignee), "
            "update_ticket(ticket_id, title=None, priority=None, assignee=None), add_comment(ticket_id, text), "
            "close_ticket(ticket_id), resolve_ticket(ticket_id, resolution), answer(value) (ends the episode). "
            "Each call returns JSON; a refused call returns {\"error\": ...} and changes nothing.\n"
            f"Task: {task['instruction']}\n" + self._prompt())

    def _prompt(self) -> str:
        return f"Turn {self._turn + 1} of {self.max_turns}: make one tool call."

    # ----------------------------------------------------------------- stepping
    def _act(self, call: ToolCall) -> Outcome:
        if call.name not in TOOLS:
            raise IllegalActionError(f"unknown tool {call.name!r}; tools: {', '.join(TOOLS)}.")
        args = bind_call(call)
        if call.name == "answer":
            return self._answer(args["value"])
        api = TicketApi(self._state)
        try:
            result = getattr(api, call.name)(**args)
        except ApiError as exc:
            self._api_errors += 1
            return Outcome(f"{call.text()} -> {json.dumps({'error': str(exc)})}", info={"api_error": True})
        if call.name == "list_tickets":
            self._seen.update({row["id"]: row for row in result["tickets"]})
        elif call.name == "get_ticket":
            self._seen[result["id"]] = {k: result[k] for k in ("id", "title", "assignee", "priority", "status")}
        elif call.name == "create_ticket":
            self._created.append(result["created"])
        return Outcome(f"{call.text()} -> {json.dumps(result)}", info={"api_error": False})

    def _answer(self, value: Any) -> Outcome:
        state_ok = self._state == self._gold
        expected = self._task["answer"]
        answer_ok = None if expected is None else str(value).strip() == expected
        success = state_ok and answer_ok is not False
        parts = ["the API state is as the task asked" if state_ok else "the API state is not as the task asked"]
        if answer_ok is not None:
            parts.append("the answer is right" if answer_ok else f"the answer is wrong (expected {expected})")
        return Outcome(f"{format_action('answer', value)} -> episode over: {'; '.join(parts)}.",
                       reward=1.0 if success else 0.0, terminated=True, reason="answered",
                       info={"check": {"state": state_ok, "answer": answer_ok}, "api_error": False})

    def step(self, action: Action) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; at the episode's end ``info["episode_metrics"]`` (module docstring)."""
        out = TextEnv.step(self, action)
        if self._done:
            out[4]["episode_metrics"] = {"success": float(out[1] == 1.0),  # the state and answer checked
                                         "api_errors": self._api_errors}
        return out

    # ----------------------------------------------------------------- menu and demonstrator (visible state only)
    def _visible_plan(self) -> tuple[list[str], list[int]]:
        return plan_task(self._task["kind"], self._task["params"], self._seen)

    def _legal_actions(self) -> list[str]:
        kind, params = self._task["kind"], self._task["params"]
        menu = ["list_tickets()"]
        if "user" in params:
            menu.append(format_action("list_tickets", assignee=params["user"]))
        _, named = self._visible_plan()
        order = named + [i for i in sorted(self._seen) if i not in named]
        for n, ticket_id in enumerate(order[:MENU_TICKETS]):
            if n < 2:
                menu.append(format_action("get_ticket", ticket_id))
            if kind in ("close", "count"):
                menu.append(format_action("close_ticket", ticket_id))
            elif kind == "reassign":
                menu += [format_action("update_ticket", ticket_id, assignee=params["to"]),
                         format_action("add_comment", ticket_id, params["comment"])]
            elif kind == "escalate":
                menu.append(format_action("update_ticket", ticket_id, priority="urgent"))
            elif kind == "resolve":
                menu.append(format_action("resolve_ticket", ticket_id, params["resolution"]))
        if kind == "create":
            wrong = PRIORITIES[(PRIORITIES.index(params["priority"]) + 1) % len(PRIORITIES)]
            menu += [format_action("create_ticket", params["title"], params["priority"], params["assignee"]),
                     format_action("create_ticket", params["title"], wrong, params["assignee"])]
            menu += [format_action("answer", i) for i in self._created] or [format_action("answer", "done")]
        elif kind in ("close", "count"):
            menu += [format_action("answer", k) for k in range(6)]
        else:
            menu.append(format_action("answer", "done"))
        return sorted(dict.fromkeys(menu))

    def _scripted_action(self) -> str:
        """The demonstrator's call: list all tickets once (not for ``create``), then the task's calls on the tickets
        listed that it has not made yet, then the answer (the count of listed tickets the task names, the id the
        create call returned, or ``'done'``)."""
        kind = self._task["kind"]
        if kind != "create" and not self._seen:
            return "list_tickets()"
        calls, named = self._visible_plan()
        made = {a for a, _ in self._history}
        for c in calls:
            if c not in made:
                return c
        if kind in ("close", "count"):
            return format_action("answer", len(named))
        if kind == "create":
            return format_action("answer", self._created[-1] if self._created else "done")
        return format_action("answer", "done")

    def demo_action(self, rng: random.Random, skill: float = 0.0) -> str:
        """A demonstration action (:class:`envs.features.Demonstrator`) from the visible state (the instruction and
        the tickets the listings showed): with probability ``skill`` the scripted call (:meth:`_scripted_action`),
        else a uniformly random action of the menu (``skill=0``: exactly a random-menu policy's draw). At the
        default settings ``skill=1`` solves every task (tests/envs/test_ticket_api.py).

        Raises:
            ValueError: if ``skill`` is outside [0, 1].
        """
        return mixed_demo(rng, skill, self._scripted_action, self._legal_actions)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The eight tools as typed JSON-schema definitions (:class:`envs.features.ToolSchemas`)."""
        return tool_schemas()

    # ----------------------------------------------------------------- snapshot codec
    def _task_state(self) -> dict[str, Any]:
        return copy_json({"api": self._state, "gold": self._gold, "task": self._task,
                          "seen": [self._seen[i] for i in sorted(self._seen)], "created": self._created,
                          "api_errors": self._api_errors})

    def _load_task_state(self, state: dict[str, Any]) -> None:
        state = copy_json(state)
        self._state, self._gold, self._task = state["api"], state["gold"], state["task"]
        self._seen = {int(t["id"]): t for t in state["seen"]}
        self._created = [int(i) for i in state["created"]]
        self._api_errors = int(state["api_errors"])

    def _fork_into(self, children: list[TextEnv]) -> None:
        """Each copy gets its own API state through the state codec (the parent's dicts are never shared)."""
        state = self._task_state()
        for child in children:
            assert isinstance(child, TicketAPIEnv)
            child._load_task_state(state)
