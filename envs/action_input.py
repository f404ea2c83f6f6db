"""What an env's ``step`` takes: a tool call in any form a model or a client writes, read by the one reader.

Field case S62: a door that read only the env's own ``name(args)`` syntax refused every turn of a tool-calling
model. :func:`read_action` is what :meth:`envs.core.TextEnv.step` reads its action with, so every door (an
in-process ``env.step``, ``POST /v1/envs/{id}/step``, the batched step, OpenEnv's WebSocket) takes the same
forms, through the reader of model output the text policy and the adapters use
(:func:`envs.tool_calls.read_calls`):

* the env's own syntax, ``probe(1)``: positional arguments are the env's to read, as written; keyword arguments
  of a declared tool (``probe(k=1)``, its schema's parameter names) are bound to its parameters and read as the
  canonical action (:func:`envs.tool_calls.canonical_action`: ``probe(1)``), so every env with tool schemas
  takes keyword and positional calls alike (keywords that do not bind go to the env as written, which refuses
  them with its own reason);
* any other text: a model's reply, read by :func:`envs.tool_calls.read_calls` against the env's tool schemas
  (``<tool_call>`` blocks, bare JSON calls, OpenAI and OpenEnv call objects, reasoning skipped) and held to one
  call per turn (:func:`envs.tool_calls.one_action`);
* a JSON value rather than text (a client that sends the call as an object): a call object, a JSON array of
  them, or an OpenAI assistant message ``{"role", "content", "tool_calls"}``, read by the same reader.

What is not one action raises :class:`~envs.actions.ActionParseError` whose message says why; the env turns it
into its invalid-action observation (``info["invalid_action"]``, reward ``invalid_action_reward``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from envs.actions import FORMAT_HELP, ActionParseError, is_legal_action, parse_action
from envs.tool_calls import calls_from_openai, canonical_action, one_action, read_calls

Tools = list[dict[str, Any]]


#: The longest model reply, in characters, a step takes at a server's doors (REST, batched, OpenEnv): a reply
#: holds one tool call amid reasoning, so it may be far longer than the env's own ``max_action_length``, which
#: bounds the action written in the env's syntax. Past it a door answers 413 before reading the reply.
MAX_REPLY_CHARS = 32768


def reply_limit(max_action_length: int) -> int:
    """The most characters a door takes as one step's action for an env whose actions are at most
    ``max_action_length`` characters: the longer of that and :data:`MAX_REPLY_CHARS` (field case S62)."""
    return max(int(max_action_length), MAX_REPLY_CHARS)


def _schemas(tools: Tools | Callable[[], Tools | None] | None) -> Tools | None:
    return tools() if callable(tools) else tools


def read_action(action: Any, tools: Tools | Callable[[], Tools | None] | None) -> str:
    """The action text an env acts on, for what a client or a model handed its ``step`` (module docstring).

    Args:
        action: text (the env's syntax or a model's reply), or a decoded JSON value (a call object, an array of
            them, an OpenAI assistant message).
        tools: the env's tool definitions (``env.tool_schemas()``), a function giving them (called only when
            the action is not positional ``name(args)`` text), or None for an env that declares none (it then
            takes its own syntax alone).

    Returns:
        ``action`` itself when it is positional ``name(args)`` text, a call of a tool the env declares no schema
        for, or keywords that do not bind to the tool's parameters; otherwise the canonical action text of the
        one call read.

    Raises:
        ActionParseError: no call, several calls, a call that names no declared tool or an argument it does not
            have, a value that is no scalar, or an action of another type; the message says which.
    """
    if isinstance(action, str):
        try:
            call = parse_action(action)
        except ActionParseError:
            schemas = _schemas(tools) if action.strip() else None
            if not schemas:
                raise
            return one_action(read_calls(action, schemas))
        if not call.kwargs:
            return action
        schemas = _schemas(tools)
        if not schemas or call.name not in {t["function"]["name"] for t in schemas}:
            return action  # a tool with no declared parameters: the env binds its keywords itself
        try:
            return canonical_action(action, schemas)
        except ActionParseError:
            return action  # keywords the tool does not have: the env refuses them with its own reason
    if isinstance(action, (dict, list)):
        schemas = _schemas(tools)
        if not schemas:
            raise ActionParseError(f"this env declares no tool schemas, so it reads text only. {FORMAT_HELP}")
        if isinstance(action, dict) and "role" in action and set(action) <= {"role", "content", "tool_calls"}:
            if action.get("tool_calls"):  # an OpenAI assistant message
                return one_action(calls_from_openai(action["tool_calls"], schemas))
            content = action.get("content")
            return read_action(content if isinstance(content, str) else "", schemas)
        try:
            text = json.dumps(action, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ActionParseError(f"the action is not a JSON value ({exc}).") from None
        return one_action(read_calls(text, schemas))
    raise ActionParseError(f"the action must be text or a JSON tool call, got {type(action).__name__}. {FORMAT_HELP}")


def action_record(action: Any) -> str:
    """The text an env records for an action it could not read (its history, anchor key and transcript): text
    as written, a JSON value as compact JSON with sorted keys, anything else as ``repr``."""
    if isinstance(action, str):
        return action
    try:
        return json.dumps(action, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return repr(action)


def is_legal(action: Any, legal_actions: list[str] | tuple[str, ...], tools: Tools | None) -> bool:
    """Whether ``action`` (text, a model's reply or a JSON call object) means one of ``legal_actions`` to an env
    whose tools are ``tools`` (its ``tool_schemas()``): read as the env's ``step`` reads it (:func:`read_action`:
    ``probe(k=0)``, a ``<tool_call>`` block, a call object), then compared in canonical form
    (:func:`envs.actions.is_legal_action`). An action that cannot be read is not legal."""
    try:
        return is_legal_action(read_action(action, tools), legal_actions)
    except ActionParseError:
        return False


__all__ = ["MAX_REPLY_CHARS", "action_record", "is_legal", "read_action", "reply_limit"]
