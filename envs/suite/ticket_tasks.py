"""TicketAPI's tasks: the generated initial states, the tasks of each kind drawn on them, and the plan that does a
task (:mod:`envs.suite.ticket_api` is the env, and documents the kinds).

Everything is drawn from the env's ``numpy`` Generator, in a fixed order, so ``reset(seed=s)`` gives the same state
and task for ``s``. :func:`plan_task` is the calls that do a task on the tickets one has seen: on every ticket it
gives the gold state (:func:`gold_state`), on the tickets the agent listed the demonstrator's plan and the menu.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envs.actions import format_action, parse_action
from envs.suite.ticket_system import ACTIVE, PRIORITIES, STATUSES, TicketApi, bind_call, copy_json

#: The task kinds (:mod:`envs.suite.ticket_api`), in the order ``kinds`` defaults to.
KINDS = ("close", "reassign", "escalate", "resolve", "create", "count")
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi")
COMPONENTS = ("Login page", "VPN", "Printer", "Payroll export", "Email sync", "Build server", "Laptop battery",
              "Wiki search", "Billing API", "Door badge", "Video calls", "Backup job", "Sales dashboard",
              "Password reset", "Shared drive")
PROBLEMS = ("times out", "crashes on start", "is slow", "shows wrong totals", "rejects valid input",
            "fails overnight", "needs access for a new hire", "returns error 500", "drops the connection",
            "has a broken link")
RESOLUTIONS = ("restarted the service", "replaced the hardware", "granted access", "rolled back the update",
               "cleared the cache")
_STATUS_WEIGHTS = (0.5, 0.2, 0.15, 0.15)


def plan_task(kind: str, params: dict[str, Any], seen: dict[int, dict[str, Any]]) -> tuple[list[str], list[int]]:
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


def draw_state(rng: np.random.Generator, n_users: int, n_tickets: int) -> dict[str, Any]:
    """An initial API state drawn from ``rng``: ``n_tickets`` tickets with ids from a random base, assigned among
    ``n_users`` team members (:mod:`envs.suite.ticket_api`)."""
    users = sorted(str(u) for u in rng.choice(USERS, size=n_users, replace=False))
    pairs = rng.choice(len(COMPONENTS) * len(PROBLEMS), size=n_tickets, replace=False)
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
    return {"tickets": tickets, "next_id": base + n_tickets, "users": users}


def draw_task(rng: np.random.Generator, kind: str, state: dict[str, Any]) -> dict[str, Any] | None:
    """The task of ``kind`` on ``state``, drawn from ``rng`` (``kind``, ``params``, ``instruction``, the gold
    ``calls`` and the expected ``answer``, None for kinds that take any), or None when the state has none."""
    users, tickets = state["users"], state["tickets"]
    active = [t for t in tickets if t["status"] in ACTIVE]
    seen = {t["id"]: t for t in tickets}
    if kind == "close":
        options = sorted({(t["assignee"], t["priority"]) for t in active})
        options = [o for o in options if len(plan_task(kind, {"user": o[0], "priority": o[1]}, seen)[1]) <= 4]
        if not options:
            return None
        user, priority = options[int(rng.integers(len(options)))]
        params = {"user": user, "priority": priority}
        text = (f"Close every active ticket assigned to {user} with priority {priority}, then call answer with "
                "the number of tickets you closed.")
    elif kind == "reassign":
        leaving = [u for u in users if 1 <= len(plan_task(kind, {"user": u, "to": u, "comment": ""}, seen)[1]) <= 3]
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
        keywords = [k for k in keywords if 1 <= len(plan_task(kind, {"keyword": k}, seen)[1]) <= 3]
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
    calls, ids = plan_task(kind, params, seen)
    answer = {"close": len(ids), "count": len(ids), "create": state["next_id"]}.get(kind)
    return {"kind": kind, "params": params, "instruction": text, "calls": calls,
            "answer": None if answer is None else str(answer)}


def gold_state(state: dict[str, Any], calls: list[str]) -> dict[str, Any]:
    """The state the task asks for: its ``calls`` made on a copy of ``state``."""
    gold = copy_json(state)
    api = TicketApi(gold)
    for call_text in calls:
        call = parse_action(call_text)
        getattr(api, call.name)(**bind_call(call))
    return gold
