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
(success: reward 1).
"""

from __future__ import annotations

import json
import random
from typing import Any

from envs.actions import ToolCall, bind_arguments, format_action, parse_action
from envs.core import IllegalActionError, Outcome, TextEnv
from envs.tool_calls import function_tool

__all__ = ["KINDS", "TicketAPIEnv"]

#: The task kinds (module docstring), in the order ``kinds`` defaults to.
KINDS = ("close", "reassign", "escalate", "resolve", "create", "count")
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
PRIORITIES = ("low", "medium", "high", "urgent")
STATUSES = ("open", "in_progress", "resolved", "closed")
ACTIVE = ("open", "in_progress")
COMPONENTS = ("Login page", "VPN", "Printer", "Payroll export", "Email sync", "Build server", "Laptop battery",
              "Wiki search", "Billing API", "Door badge", "Video calls", "Backup job", "Sales dashboard",
              "Password reset", "Shared drive")
PROBLEMS = ("times out", "crashes on start", "is slow", "shows wrong totals", "rejects valid input",
            "fails overnight", "needs access for a new hire", "returns error 500", "drops the connection",
            "has a broken link")
RESOLUTIONS = ("restarted the service", "replaced the hardware", "granted access", "rolled back the update",
               "cleared the cache")
MAX_TICKETS = 40
MAX_TURNS = 64
#: Menu: at most this many seen tickets get calls in ``info["legal_actions"]``.
MENU_TICKETS = 6
_STATUS_WEIGHTS = (0.5, 0.2, 0.15, 0.15)
#: Each tool's parameters: (name, JSON type, required). Order is the positional order.
_TOOLS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "list_tickets": (("status", "string", False), ("assignee", "string", False), ("priority", "string", False)),
    "get_ticket": (("ticket_id", "integer", True),),
    "create_ticket": (("title", "string", True), ("priority", "string", True), ("assignee", "string", True)),
    "update_ticket": (("ticket_id", "integer", True), ("title", "string", False), ("priority", "string", False),
                      ("assignee", "string", False)),
    "add_comment": (("ticket_id", "integer", True), ("text", "string", True)),
    "close_ticket": (("ticket_id", "integer", True),),
    "resolve_ticket": (("ticket_id", "integer", True), ("resolution", "string", True)),
    "answer": (("value", "string", True),),
}


_PARAM_TEXT = {
    "status": "ticket status", "assignee": "a team member's name", "priority": "ticket priority",
    "ticket_id": "the ticket's id", "title": "the ticket's title", "text": "the comment",
    "resolution": "what resolved the ticket", "value": "the answer: a number as digits, or 'done'",
}


class ApiError(Exception):
    """A well-typed call the simulated API refuses; its message is the ``error`` of the observation."""


def _copy(data: Any) -> Any:
    """A deep copy of plain JSON data (the state codec)."""
    return json.loads(json.dumps(data))


def _int_in(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in {lo}..{hi}, got {value!r}")
    return value


class _Api:
    """The simulated ticket system over a plain-JSON state ``{"tickets": [...], "next_id": int, "users": [...]}``.

    Each public method is one tool; it changes ``state`` in place and returns a JSON-serialisable result, or raises
    :class:`ApiError` with the state unchanged."""

    def __init__(self, state: dict[str, Any]):
        self.state = state

    def _ticket(self, ticket_id: int) -> dict[str, Any]:
        for t in self.state["tickets"]:
            if t["id"] == ticket_id:
                return t
        raise ApiError(f"no ticket with id {ticket_id}")

    def _open_ticket(self, ticket_id: int) -> dict[str, Any]:
        t = self._ticket(ticket_id)
        if t["status"] == "closed":
            raise ApiError(f"ticket {ticket_id} is closed and cannot be changed")
        return t

    def _user(self, name: str) -> str:
        if name not in self.state["users"]:
            raise ApiError(f"no user {name!r}; users: {', '.join(self.state['users'])}")
        return name

    @staticmethod
    def _choice(field: str, value: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise ApiError(f"{field} must be one of {', '.join(choices)}; got {value!r}")
        return value

    @staticmethod
    def _text(field: str, value: str) -> str:
        if not value.strip():
            raise ApiError(f"{field} must not be empty")
        return value.strip()

    def list_tickets(self, status: str | None = None, assignee: str | None = None,
                     priority: str | None = None) -> dict[str, Any]:
        if status is not None:
            self._choice("status", status, STATUSES)
        if assignee is not None:
            self._user(assignee)
        if priority is not None:
            self._choice("priority", priority, PRIORITIES)
        rows = [{k: t[k] for k in ("id", "title", "assignee", "priority", "status")} for t in self.state["tickets"]
                if (status is None or t["status"] == status) and (assignee is None or t["assignee"] == assignee)
                and (priority is None or t["priority"] == priority)]
        return {"tickets": rows}

    def get_ticket(self, ticket_id: int) -> dict[str, Any]:
        return _copy(self._ticket(ticket_id))

    def create_ticket(self, title: str, priority: str, assignee: str) -> dict[str, Any]:
        ticket = {"id": self.state["next_id"], "title": self._text("title", title), "description": "",
                  "assignee": self._user(assignee), "priority": self._choice("priority", priority, PRIORITIES),
                  "status": "open", "resolution": None, "comments": []}
        self.state["tickets"].append(ticket)
        self.state["next_id"] += 1
        return {"created": ticket["id"]}

    def update_ticket(self, ticket_id: int, title: str | None = None, priority: str | None = None,
                      assignee: str | None = None) -> dict[str, Any]:
        t = self._open_ticket(ticket_id)
        if title is None and priority is None and assignee is None:
            raise ApiError("update_ticket needs at least one of title, priority, assignee")
        changes = {}
        if title is not None:
            changes["title"] = self._text("title", title)
        if priority is not None:
            changes["priority"] = self._choice("priority", priority, PRIORITIES)
        if assignee is not None:
            changes["assignee"] = self._user(assignee)
        t.update(changes)
        return {"updated": ticket_id, **changes}

    def add_comment(self, ticket_id: int, text: str) -> dict[str, Any]:
        t = self._open_ticket(ticket_id)
        t["comments"].append(self._text("text", text))
        return {"ticket_id": ticket_id, "comments": len(t["comments"])}

    def close_ticket(self, ticket_id: int) -> dict[str, Any]:
        t = self._open_ticket(ticket_id)
        t["status"] = "closed"
        return {"closed": ticket_id}

    def resolve_ticket(self, ticket_id: int, resolution: str) -> dict[str, Any]:
        t = self._open_ticket(ticket_id)
        if t["status"] == "resolved":
            raise ApiError(f"ticket {ticket_id} is already resolved")
        text = self._text("resolution", resolution)
        t["status"], t["resolution"] = "resolved", text
        return {"resolved": ticket_id, "resolution": text}


def _plan(kind: str, params: dict[str, Any], seen: dict[int, dict[str, Any]]) -> tuple[list[str], list[int]]:
    """(the calls that do the task on the tickets ``seen``, in order; the ids of the tickets the task names)."""
    active = [t for _, t in sorted(seen.items()) if t["status"] in ACTIVE]
    if kind == "close":
        ids = [t["id"] for t in active if t["assignee"] == params["user"] and t["priority"] == params["priority"]]
        return [format_action("close_ticket", i) for i in ids], ids
    if kind == "reassign":
        ids = [t["id"] for t in active if t["assignee"] == params["user"]]
        calls = []
        for i in ids:
            calls += [format_action("update_ticket", i, assignee=params["to"]),
                      format_action("add_comment", i, params["comment"])]
        return calls, ids
    if kind == "escalate":
        ids = [t["id"] for t in active if params["keyword"] in t["title"].lower() and t["priority"] != "urgent"]
        return [format_action("update_ticket", i, priority="urgent") for i in ids], ids
    if kind == "resolve":
        ids = [t["id"] for t in active if t["title"] == params["title"]]
        return [format_action("resolve_ticket", i, params["resolution"]) for i in ids], ids
    if kind == "count":
        return [], [t["id"] for t in active if t["assignee"] == params["user"] and t["priority"] in ("high", "urgent")]
    return [format_action("create_ticket", params["title"], params["priority"], params["assignee"])], []


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

    # ----------------------------------------------------------------- task generation
    def _draw_state(self) -> dict[str, Any]:
        rng = self.np_random
        users = sorted(str(u) for u in rng.choice(USERS, size=self.n_users, replace=False))
        pairs = rng.choice(len(COMPONENTS) * len(PROBLEMS), size=self.n_tickets, replace=False)
        base = int(rng.integers(1, 10)) * 100 + 1
        tickets = []
        for k, pair in enumerate(pairs):
            comp, prob = COMPONENTS[int(pair) // len(PROBLEMS)], PROBLEMS[int(pair) % len(PROBLEMS)]
            status = STATUSES[int(rng.choice(len(STATUSES), p=_STATUS_WEIGHTS))]
            reporter = users[int(rng.integers(len(users)))]
            tickets.append({
                "id": base + k, "title": f"{comp} {prob}", "description": f"Reported by {reporter}: {comp} {prob}.",
                "assignee": users[int(rng.integers(len(users)))], "priority": PRIORITIES[int(rng.integers(4))],
                "status": status, "resolution": RESOLUTIONS[int(rng.integers(len(RESOLUTIONS)))]
                if status == "resolved" else None, "comments": []})
        return {"tickets": tickets, "next_id": base + self.n_tickets, "users": users}

    def _draw_task(self, kind: str, state: dict[str, Any]) -> dict[str, Any] | None:
        """The task of ``kind`` on ``state`` (params, instruction, answer), or None when the state has none."""
        rng = self.np_random
        users, tickets = state["users"], state["tickets"]
        active = [t for t in tickets if t["status"] in ACTIVE]
        seen = {t["id"]: t for t in tickets}
        if kind == "close":
            options = sorted({(t["assignee"], t["priority"]) for t in active})
            options = [o for o in options if len(_plan(kind, {"user": o[0], "priority": o[1]}, seen)[1]) <= 4]
            if not options:
                return None
            user, priority = options[int(rng.integers(len(options)))]
            params = {"user": user, "priority": priority}
            text = (f"Close every active ticket assigned to {user} with priority {priority}, then call answer with "
                    "the number of tickets you closed.")
        elif kind == "reassign":
            leaving = [u for u in users if 1 <= len(_plan(kind, {"user": u, "to": u, "comment": ""}, seen)[1]) <= 3]
            if not leaving:
                return None
            user = leaving[int(rng.integers(len(leaving)))]
            others = [u for u in users if u != user]
            to = others[int(rng.integers(len(others)))]
            params = {"user": user, "to": to, "comment": f"handed over from {user}"}
            text = (f"{user} is on leave: reassign every active ticket of {user} to {to}, and add the comment "
                    f"'handed over from {user}' to each of them; then call answer('done').")
        elif kind == "escalate":
            keywords = sorted({c.lower() for c in COMPONENTS for t in active if c.lower() in t["title"].lower()})
            keywords = [k for k in keywords if 1 <= len(_plan(kind, {"keyword": k}, seen)[1]) <= 3]
            if not keywords:
                return None
            keyword = keywords[int(rng.integers(len(keywords)))]
            params = {"keyword": keyword}
            text = (f"Set the priority of every active ticket whose title mentions '{keyword}' to urgent; then "
                    "call answer('done').")
        elif kind == "resolve":
            if not active:
                return None
            title = active[int(rng.integers(len(active)))]["title"]
            resolution = RESOLUTIONS[int(rng.integers(len(RESOLUTIONS)))]
            params = {"title": title, "resolution": resolution}
            text = (f"Resolve the ticket titled '{title}' with the resolution '{resolution}'; then call "
                    "answer('done').")
        elif kind == "create":
            titles = {t["title"] for t in tickets}
            free = [f"{c} {p}" for c in COMPONENTS for p in PROBLEMS if f"{c} {p}" not in titles]
            title = free[int(rng.integers(len(free)))]
            params = {"title": title, "priority": PRIORITIES[int(rng.integers(4))],
                      "assignee": users[int(rng.integers(len(users)))]}
            text = (f"Create a ticket titled '{title}' with priority {params['priority']}, assigned to "
                    f"{params['assignee']}; then call answer with the new ticket's id.")
        else:  # count
            user = users[int(rng.integers(len(users)))]
            params = {"user": user}
            text = (f"How many active tickets with priority high or urgent are assigned to {user}? Change "
                    "nothing; call answer with the number.")
        calls, ids = _plan(kind, params, seen)
        answer = {"close": len(ids), "count": len(ids), "create": state["next_id"]}.get(kind)
        return {"kind": kind, "params": params, "instruction": text, "calls": calls,
                "answer": None if answer is None else str(answer)}

    def _reset_task(self, options: dict[str, Any] | None) -> str:
        if options:
            raise ValueError(f"unknown reset options {sorted(options)}; TicketAPI takes none")
        for _ in range(100):
            state = self._draw_state()
            kind = self.kinds[int(self.np_random.integers(len(self.kinds)))]
            task = self._draw_task(kind, state)
            if task is not None:
                break
        else:  # pragma: no cover - every kind has a task on most states; 100 misses in a row do not happen
            raise RuntimeError(f"no {kind} task found in 100 generated states")
        gold = _copy(state)
        api = _Api(gold)
        for call_text in task.pop("calls"):  # the gold state: the task's calls made on a copy of the state
            call = parse_action(call_text)
            getattr(api, call.name)(**_bind(call))
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
        if call.name not in _TOOLS:
            raise IllegalActionError(f"unknown tool {call.name!r}; tools: {', '.join(_TOOLS)}.")
        args = _bind(call)
        if call.name == "answer":
            return self._answer(args["value"])
        api = _Api(self._state)
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

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """:meth:`TextEnv.step`; at the episode's end ``info["episode_metrics"]`` (module docstring)."""
        out = TextEnv.step(self, action)
        if self._done:
            out[4]["episode_metrics"] = {"success": float(out[1] == 1.0),  # the state and answer checked
                                         "api_errors": self._api_errors}
        return out

    # ----------------------------------------------------------------- menu and demonstrator (visible state only)
    def _visible_plan(self) -> tuple[list[str], list[int]]:
        return _plan(self._task["kind"], self._task["params"], self._seen)

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
        if not 0.0 <= skill <= 1.0:
            raise ValueError(f"skill must be in [0, 1], got {skill!r}")
        if skill and rng.random() < skill:
            return self._scripted_action()
        return rng.choice(self._legal_actions())

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The eight tools as typed JSON-schema definitions (:class:`envs.features.ToolSchemas`)."""
        enums = {"status": list(STATUSES), "priority": list(PRIORITIES)}
        described = {
            "list_tickets": "list tickets (id, title, assignee, priority, status), optionally filtered",
            "get_ticket": "every field of one ticket, comments included",
            "create_ticket": "create an open ticket; returns its id",
            "update_ticket": "change the title, priority or assignee of a ticket that is not closed",
            "add_comment": "append a comment to a ticket that is not closed",
            "close_ticket": "close a ticket (closed tickets cannot be changed)",
            "resolve_ticket": "mark a ticket resolved with a resolution text",
            "answer": "end the episode with the value the task asks for (a number as digits, or 'done')",
        }
        tools = []
        for name, params in _TOOLS.items():
            props: dict[str, dict[str, Any]] = {}
            for pname, ptype, required in params:
                schema: dict[str, Any] = {"type": ptype}
                if pname in enums:
                    schema["enum"] = enums[pname]
                schema["description"] = _PARAM_TEXT[pname] + ("" if required else " (optional)")
                props[pname] = schema
            tools.append(function_tool(name, described[name], props, [p for p, _, r in params if r]))
        return tools

    # ----------------------------------------------------------------- snapshot codec
    def _task_state(self) -> dict[str, Any]:
        return _copy({"api": self._state, "gold": self._gold, "task": self._task,
                      "seen": [self._seen[i] for i in sorted(self._seen)], "created": self._created,
                      "api_errors": self._api_errors})

    def _load_task_state(self, state: dict[str, Any]) -> None:
        state = _copy(state)
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


def _bind(call: ToolCall) -> dict[str, Any]:
    """The call's arguments by name, type-checked against its tool's schema.

    Raises:
        ActionParseError: too many positional arguments, an unknown or repeated one (:func:`bind_arguments`).
        IllegalActionError: a missing argument, or a value of the wrong JSON type.
    """
    params = _TOOLS[call.name]
    args = bind_arguments(call, [p for p, _, _ in params])  # ActionParseError: an invalid action too
    signature = f"{call.name}({', '.join(p if r else p + '=None' for p, _, r in params)})"
    for pname, ptype, required in params:
        if pname not in args:
            if required:
                raise IllegalActionError(f"{call.name} needs the argument {pname!r}: {signature}.")
            continue
        value = args[pname]
        if value is None and not required:
            continue
        if call.name == "answer":
            ok = isinstance(value, (str, int)) and not isinstance(value, bool)
        elif ptype == "integer":
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, str)
        if not ok:
            want = "a string or an int" if call.name == "answer" else ("an int" if ptype == "integer" else "a string")
            raise IllegalActionError(f"argument {pname!r} of {call.name} must be {want}, got {value!r}: {signature}.")
    return args
