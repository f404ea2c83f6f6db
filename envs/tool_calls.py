"""Tools as JSON schemas, and tool calls in the forms models write, mapped to one env action and back.

Tool definitions use the format of the OpenAI chat API and of Hugging Face chat templates (``tools=``)::

    {"type": "function",
     "function": {"name": "probe", "description": "...",
                  "parameters": {"type": "object", "properties": {"k": {"type": "integer", ...}},
                                 "required": ["k"], "additionalProperties": False}}}

An env with tools offers :class:`envs.features.ToolSchemas` (``env.tool_schemas()``); a server serves them
at ``GET /v1/envs/{session_id}/tools``. A tool call is ``{"name": NAME, "arguments": {PARAM: VALUE}}``.

Mapping (:func:`action_to_call`, :func:`call_to_action`): an action text ``name(args)``
(:mod:`envs.actions`) binds its positional arguments to the tool's parameters in schema order; a call
becomes the canonical action text: its arguments positional in schema order as long as no parameter is
skipped, the rest as keywords (``grep('x', 'Lib')``, ``find('.', type='f')``). The two are inverse:
``call_to_action(action_to_call(a)) == canonical_action(a)`` for every action that binds, and
``action_to_call(call_to_action(c)) == c`` for every call with scalar arguments (tested with hypothesis).

Model output (:func:`parse_model_output`) is accepted in three forms, each exactly one call:

* ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as Qwen and Hermes chat templates emit (text
  around the block is ignored);
* the bare JSON object ``{"name": ..., "arguments": {...}}`` (``"parameters"`` for ``"arguments"``, as
  Llama 3 writes it, and ``arguments`` as a JSON string, as the OpenAI API returns it, are accepted too);
* forkyard's own ``name(args)``.

Anything else raises :class:`envs.actions.ActionParseError`; a trainer then sends the raw text to the env,
which answers with its invalid-action observation. Standard library only.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from envs.actions import ActionParseError, Scalar, bind_arguments, format_action, parse_action

TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def function_tool(name: str, description: str, properties: dict[str, dict[str, Any]],
                  required: list[str] | None = None) -> dict[str, Any]:
    """A tool definition in the ``tools=`` format (module docstring); ``properties`` in parameter order."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": dict(properties),
                       "required": list(properties) if required is None else list(required),
                       "additionalProperties": False}}}


def param_names(tool: dict[str, Any]) -> list[str]:
    """The parameter names of a tool definition, in schema order."""
    return list(tool["function"]["parameters"].get("properties", {}))


def _by_name(tools: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {t["function"]["name"]: param_names(t) for t in tools}


def action_to_call(action: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The tool call ``{"name", "arguments"}`` an action text makes (arguments in schema order).

    Raises:
        ActionParseError: the text is not an action, names no tool of ``tools``, or does not bind.
    """
    call = parse_action(action)
    params = _by_name(tools).get(call.name)
    if params is None:
        raise ActionParseError(f"unknown tool {call.name!r}; tools: {', '.join(sorted(_by_name(tools)))}.")
    bound = bind_arguments(call, params)
    return {"name": call.name, "arguments": {p: bound[p] for p in params if p in bound}}


def _scalar(value: Any, where: str) -> Scalar:
    if isinstance(value, float) and not math.isfinite(value):
        raise ActionParseError(f"{where} is {value}, not a finite number.")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ActionParseError(f"{where} must be a string, a number, true, false or null; got {type(value).__name__}.")


def call_to_action(call: dict[str, Any], tools: list[dict[str, Any]]) -> str:
    """The canonical action text of a tool call (module docstring).

    Raises:
        ActionParseError: an unknown tool, arguments that are not an object of the tool's parameters, or a
            value that is not a scalar (string, number, true, false, null).
    """
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ActionParseError('a tool call is a JSON object {"name": ..., "arguments": {...}}.')
    name = call["name"]
    params = _by_name(tools).get(name)
    if params is None:
        raise ActionParseError(f"unknown tool {name!r}; tools: {', '.join(sorted(_by_name(tools)))}.")
    args = call.get("arguments", {})
    if not isinstance(args, dict):
        raise ActionParseError(f"the arguments of {name} must be a JSON object, got {type(args).__name__}.")
    unknown = [k for k in args if k not in params]
    if unknown:
        raise ActionParseError(f"{name}() has no argument {unknown[0]!r}; its arguments are: {', '.join(params) or 'none'}.")
    positional: list[Scalar] = []
    keywords: dict[str, Scalar] = {}
    for p in params:
        if p not in args:
            continue
        value = _scalar(args[p], f"argument {p!r} of {name}")
        if keywords or len(positional) != params.index(p):
            keywords[p] = value
        else:
            positional.append(value)
    text = format_action(name, *positional, **keywords)
    parse_action(text)  # the length limit and the grammar hold for what we hand the env
    return text


def canonical_action(action: str, tools: list[dict[str, Any]]) -> str:
    """``call_to_action(action_to_call(action))``: the one spelling of an action. Raises ActionParseError."""
    return call_to_action(action_to_call(action, tools), tools)


def _json_call(text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ActionParseError(f"the tool call is not valid JSON ({exc}).") from None
    if not isinstance(obj, dict):
        raise ActionParseError('a tool call is a JSON object {"name": ..., "arguments": {...}}.')
    extra = set(obj) - {"name", "arguments", "parameters"}
    if extra or ("arguments" in obj and "parameters" in obj):
        raise ActionParseError(f'a tool call has the keys "name" and "arguments"; got {sorted(obj)}.')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # the OpenAI API's form: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError) as exc:
            raise ActionParseError(f"the arguments string is not valid JSON ({exc}).") from None
    return {"name": obj.get("name"), "arguments": args}


def parse_model_output(text: str, tools: list[dict[str, Any]]) -> str:
    """The canonical action text of a model's output in one of the three forms (module docstring).

    Raises:
        ActionParseError: no call, more than one ``<tool_call>`` block, or a call that does not map.
    """
    if not isinstance(text, str):
        raise ActionParseError(f"model output must be text, got {type(text).__name__}.")
    blocks = TOOL_CALL_BLOCK.findall(text)
    if len(blocks) > 1:
        raise ActionParseError(f"{len(blocks)} <tool_call> blocks; write exactly one tool call per turn.")
    if blocks:
        return call_to_action(_json_call(blocks[0]), tools)
    stripped = text.strip()
    if stripped.startswith("{"):
        return call_to_action(_json_call(stripped), tools)
    return canonical_action(stripped, tools)


def format_tool_call(call: dict[str, Any]) -> str:
    """``<tool_call>`` + the call as compact JSON + ``</tool_call>``: the Qwen / Hermes form a chat template
    renders an assistant's tool call in."""
    return "<tool_call>" + json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False) + "</tool_call>"


__all__ = ["TOOL_CALL_BLOCK", "action_to_call", "call_to_action", "canonical_action", "format_tool_call",
           "function_tool", "param_names", "parse_model_output"]
