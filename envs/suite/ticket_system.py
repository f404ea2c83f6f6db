"""TicketAPI's simulated support-ticket system: the tools' typed schemas, the check of a call against them, and the
API itself over a plain-JSON state (:mod:`envs.suite.ticket_api` is the env over it, and documents the task).

The state is ``{"tickets": [...], "next_id": int, "users": [...]}``; a ticket has an ``id``, ``title``,
``description``, ``assignee``, ``priority`` (:data:`PRIORITIES`), ``status`` (:data:`STATUSES`; :data:`ACTIVE` are
the active ones), ``resolution`` and ``comments``. :class:`TicketApi` has one method per tool; a call it refuses
raises :class:`ApiError` with the state unchanged. :func:`bind_call` checks a call against its tool's schema
(:data:`TOOLS`) before it reaches the API, and :func:`tool_schemas` gives the schemas as JSON-schema tools.
"""

from __future__ import annotations

import json
from typing import Any

from envs.actions import ToolCall, bind_arguments
from envs.core import IllegalActionError
from envs.tool_calls import function_tool

PRIORITIES = ("low", "medium", "high", "urgent")
STATUSES = ("open", "in_progress", "resolved", "closed")
ACTIVE = ("open", "in_progress")
#: Each tool's parameters: (name, JSON type, required). Order is the positional order.
TOOLS: dict[str, tuple[tuple[str, str, bool], ...]] = {
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

_DESCRIBED = {
    "list_tickets": "list tickets (id, title, assignee, priority, status), optionally filtered",
    "get_ticket": "every field of one ticket, comments included",
    "create_ticket": "create an open ticket; returns its id",
    "update_ticket": "change the title, priority or assignee of a ticket that is not closed",
    "add_comment": "append a comment to a ticket that is not closed",
    "close_ticket": "close a ticket (closed tickets cannot be changed)",
    "resolve_ticket": "mark a ticket resolved with a resolution text",
    "answer": "end the episode with the value the task asks for (a number as digits, or 'done')",
}


class ApiError(Exception):
    """A well-typed call the simulated API refuses; its message is the ``error`` of the observation."""


def copy_json(data: Any) -> Any:
    """A deep copy of plain JSON data (the state codec)."""
    return json.loads(json.dumps(data))


class TicketApi:
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
        return copy_json(self._ticket(ticket_id))

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


def bind_call(call: ToolCall) -> dict[str, Any]:
    """The call's arguments by name, type-checked against its tool's schema.

    Raises:
        ActionParseError: too many positional arguments, an unknown or repeated one (:func:`bind_arguments`).
        IllegalActionError: a missing argument, or a value of the wrong JSON type.
    """
    params = TOOLS[call.name]
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


def tool_schemas() -> list[dict[str, Any]]:
    """The eight tools as typed JSON-schema definitions (:class:`envs.features.ToolSchemas`)."""
    enums = {"status": list(STATUSES), "priority": list(PRIORITIES)}
    tools = []
    for name, params in TOOLS.items():
        props: dict[str, dict[str, Any]] = {}
        for pname, ptype, required in params:
            schema: dict[str, Any] = {"type": ptype}
            if pname in enums:
                schema["enum"] = enums[pname]
            schema["description"] = _PARAM_TEXT[pname] + ("" if required else " (optional)")
            props[pname] = schema
        tools.append(function_tool(name, _DESCRIBED[name], props, [p for p, _, r in params if r]))
    return tools
