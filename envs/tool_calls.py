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

Model output is read by one parser, :func:`read_calls` (what every trainer, the text policy, the
OpenAI-compatible client and the SkyRL / TRL adapters use, through :func:`parse_model_output` or directly). It
finds every call of a turn, in order, in the forms serving stacks produce:

* ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, as Qwen and Hermes chat templates emit
  (text around them is ignored). A block is delimited by the JSON grammar, not by the first closing-tag text:
  ``{"pattern": "</tool_call>"}`` is a string argument (field case S35). A closing tag missing at the very
  end of the output (a stop string cut it) is accepted;
* otherwise, bare calls making up the whole visible output, separated by whitespace or ``;``: JSON call
  objects ``{"name": ..., "arguments": {...}}`` (``"parameters"`` for ``"arguments"``, as Llama 3 writes it,
  and ``arguments`` as a JSON string, as the OpenAI API returns it, are accepted too, and so are an OpenAI
  ``tool_calls`` entry ``{"type": "function", "function": {...}}`` and OpenEnv's ``CallToolAction``
  ``{"type": "call_tool", "tool_name": ..., "arguments": {...}}``; a JSON array of them too) and forkyard
  ``name(args)`` calls, each delimited by its grammar (the JSON decoder, Python's tokenizer), so tags inside
  their strings are text. ``name(args)`` is read by the env's own parser
  (:mod:`envs.actions`): ``ｐｒｏｂｅ(0)``, ``probe( 0 )`` and ``probe(0x0)`` mean ``probe(0)``, as to the env.

Reasoning is never a call (field case S36): text inside ``<think>...</think>``, after an unclosed ``<think>``,
and before a ``</think>`` that has no opening tag (templates that open the reasoning in the prompt) is
skipped, drafted ``<tool_call>`` blocks in it included (their JSON is skipped by its grammar too, so a
``</think>`` inside a drafted string does not end the reasoning). Tool and argument names are read as Python
reads identifiers (NFKC: ``ｐｒｏｂｅ`` is ``probe``) and stripped of surrounding spaces.

One action per env turn: :func:`parse_model_output` (:func:`one_action`) gives the action of an output that
holds exactly one call and raises otherwise (several calls: "write exactly one tool call per turn"), so the text
policy, the SkyRL and TRL adapters and the OpenAI client read the same text alike. Structured ``tool_calls``
carry ids the chat API wants answered: the OpenAI client (:mod:`trainer.openai_rollout`) runs the first and
answers the others "not executed" (field case S34). :func:`calls_from_openai` reads the structured
``tool_calls`` of a chat answer the same way. Whether an action text means one of ``legal_actions`` is decided
by the env's parser (:func:`envs.action_input.is_legal`: canonical forms, never string equality; field case
S43). Text that holds no call goes to the env as written, which answers with its invalid-action observation.
Every env's ``step`` reads what it is handed with this reader too (:func:`envs.action_input.read_action`, field
case S62), so every door (in-process, REST, batched, OpenEnv) takes the same forms. Standard library only.

Why one file: the schema mapping and the model-output reader keep one invariant together: every form of a
call, in text or structured, reads to the canonical action text the env's own parser gives; split, one form
could drift from the others unseen.
"""

from __future__ import annotations

import io
import json
import math
import re
import tokenize
import unicodedata
from dataclasses import dataclass
from typing import Any

from envs.actions import MAX_ACTION_CHARS, ActionParseError, Scalar, bind_arguments, format_action, parse_action

#: The tags of a call block and of a reasoning block, as Qwen / Hermes / DeepSeek-R1 templates write them.
CALL_OPEN, CALL_CLOSE, THINK_OPEN, THINK_CLOSE = "<tool_call>", "</tool_call>", "<think>", "</think>"


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


def _ident(name: str) -> str:
    """A tool or argument name as Python reads an identifier: NFKC-normalised, surrounding spaces dropped."""
    return unicodedata.normalize("NFKC", name).strip()


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
    name = _ident(call["name"])
    params = _by_name(tools).get(name)
    if params is None:
        raise ActionParseError(f"unknown tool {name!r}; tools: {', '.join(sorted(_by_name(tools)))}.")
    args = call.get("arguments", {})
    if not isinstance(args, dict):
        raise ActionParseError(f"the arguments of {name} must be a JSON object, got {type(args).__name__}.")
    named: dict[str, Any] = {}
    for k, v in args.items():
        key = _ident(k) if isinstance(k, str) else k
        if key in named:
            raise ActionParseError(f"{name}() got argument {key!r} twice.")
        named[key] = v
    args = named
    unknown = [k for k in args if k not in params]
    if unknown:
        raise ActionParseError(
            f"{name}() has no argument {unknown[0]!r}; its arguments are: {', '.join(params) or 'none'}."
        )
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


def _json_call(obj: Any) -> dict[str, Any]:
    """A decoded JSON value as a call ``{"name", "arguments"}`` (arguments still unchecked). Raises ActionParseError."""
    if not isinstance(obj, dict):
        raise ActionParseError('a tool call is a JSON object {"name": ..., "arguments": {...}}.')
    if isinstance(obj.get("function"), dict) and set(obj) <= {"id", "type", "function"} \
            and obj.get("type", "function") == "function":  # an OpenAI tool_calls entry
        obj = obj["function"]
    elif "tool_name" in obj and set(obj) <= {"type", "tool_name", "arguments", "metadata"} \
            and obj.get("type", "call_tool") == "call_tool":  # OpenEnv's CallToolAction, as model_dump() gives it
        obj = {"name": obj["tool_name"], "arguments": obj.get("arguments", {})}
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


@dataclass(frozen=True)
class ReadCall:
    """One tool call found in model output (:func:`read_calls`, :func:`calls_from_openai`).

    Attributes:
        action: the canonical action text (:func:`call_to_action`), or None when the call does not map.
        error: why it does not map (the :class:`envs.actions.ActionParseError` message), or None.
        text: the call as the model wrote it (the JSON, the ``name(args)`` text, or the structured call's
            ``name`` and ``arguments`` as JSON).
    """

    action: str | None
    error: str | None
    text: str


def _read(value: Any, tools: list[dict[str, Any]], text: str) -> ReadCall:
    """A decoded JSON call (or an ActionParseError raised while decoding) as a :class:`ReadCall`."""
    try:
        if isinstance(value, ActionParseError):
            raise value
        return ReadCall(call_to_action(_json_call(value), tools), None, text)
    except ActionParseError as exc:
        return ReadCall(None, str(exc), text)


_DECODER = json.JSONDecoder()
_WS = re.compile(r"\s*")
_TAGS = re.compile("|".join(map(re.escape, (THINK_OPEN, THINK_CLOSE, CALL_OPEN))))
_IN_THINK = re.compile("|".join(map(re.escape, (THINK_CLOSE, CALL_OPEN))))


def _decode_at(text: str, pos: int) -> tuple[Any, int]:
    """``(JSON value, end)`` of the value starting at ``pos`` (leading whitespace skipped).
    Raises ActionParseError when none starts there."""
    pos = _WS.match(text, pos).end()
    try:
        return _DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError) as exc:
        raise ActionParseError(f"the tool call is not valid JSON ({exc}).") from None


def _block(text: str, start: int) -> tuple[Any, int, int]:
    """The ``<tool_call>`` block whose JSON starts at ``start`` (just after the opening tag), delimited by the
    JSON grammar: ``(decoded value or ActionParseError, end of the JSON, end of the block)``. A block whose
    JSON does not parse, or is followed by other text than the closing tag, ends at the next closing tag."""
    try:
        value, end = _decode_at(text, start)
        after = _WS.match(text, end).end()
        if text.startswith(CALL_CLOSE, after):
            return value, end, after + len(CALL_CLOSE)
        if after == len(text):  # the closing tag was cut (a stop string, the token limit)
            return value, end, after
        raise ActionParseError(f"text after the JSON of a {CALL_OPEN} block: write {CALL_CLOSE} right after it.")
    except ActionParseError as exc:
        close = text.find(CALL_CLOSE, start)
        stop = len(text) if close < 0 else close + len(CALL_CLOSE)
        return exc, (len(text) if close < 0 else close), stop


def _skip_reasoning(text: str, pos: int) -> int:
    """The end of a reasoning block whose text starts at ``pos``: just after its ``</think>``, or the end of
    the text. Drafted ``<tool_call>`` blocks in it are skipped whole (a ``</think>`` in a JSON string does not
    end the reasoning)."""
    while True:
        m = _IN_THINK.search(text, pos)
        if m is None:
            return len(text)
        if m.group() == THINK_CLOSE:
            return m.end()
        value, _, stop = _block(text, m.end())
        pos = stop if not isinstance(value, ActionParseError) else m.end()


def read_calls(text: str, tools: list[dict[str, Any]]) -> list[ReadCall]:
    """Every tool call in a model output, in order, each mapped to its canonical action (module docstring:
    the forms, reasoning skipped, blocks delimited by the JSON grammar).

    Args:
        text: the decoded model output of one turn.
        tools: the env's tool definitions (``env.tool_schemas()``).

    Returns:
        One :class:`ReadCall` per call (``action`` set when it maps, else ``error``); an output whose visible
        text (outside reasoning) is not a call in any form gives one ReadCall with ``action=None``; an output
        with nothing outside reasoning gives ``[]``.

    Raises:
        ActionParseError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise ActionParseError(f"model output must be text, got {type(text).__name__}.")
    pieces: list[tuple[str, str, Any]] = []  # visible segments outside reasoning: (kind, text, JSON value)
    calls: list[ReadCall] = []
    pos = 0
    while True:
        pos = _calls_at(text, pos, pieces)
        m = _TAGS.search(text, pos)
        pieces.append(("text", text[pos:m.start() if m else len(text)], None))
        if m is None:
            break
        if m.group() == THINK_OPEN:
            pos = _skip_reasoning(text, m.end())
        elif m.group() == THINK_CLOSE:  # the reasoning was opened by the prompt: all so far was reasoning
            pieces, calls, pos = [], [], m.end()
        else:
            value, end, pos = _block(text, m.end())
            calls.append(_read(value, tools, text[m.end():end].strip()))
    if calls:
        return calls
    visible = "".join(t for _, t, _ in pieces).strip()
    if not visible:
        return []
    found = [(kind, t, v) for kind, t, v in pieces if kind != "text"]
    if found and not "".join(t for kind, t, _ in pieces if kind == "text").strip():
        if len(found) == 1 and isinstance(found[0][2], list):  # a JSON array of calls
            if not found[0][2]:
                return [ReadCall(None, "an empty JSON array holds no tool call.", found[0][1])]
            return [_read(v, tools, json.dumps(v, ensure_ascii=False)) for v in found[0][2]]
        return [_read(v, tools, t) if kind == "json" else _action(t, tools) for kind, t, v in found]
    if visible[0] in "{[":
        try:
            _decode_at(visible, 0)
        except ActionParseError as exc:
            return [ReadCall(None, str(exc), visible)]
    return [_action(visible, tools)]


def _action(text: str, tools: list[dict[str, Any]]) -> ReadCall:
    """A ``name(args)`` text as a :class:`ReadCall` (the env's parser, :func:`canonical_action`)."""
    try:
        return ReadCall(canonical_action(text, tools), None, text)
    except ActionParseError as exc:
        return ReadCall(None, str(exc), text)


_CALL_HEAD = re.compile(r"\s*([^\W\d]\w*\s*\()")


_CALL_TOKENS = {tokenize.NAME, tokenize.NUMBER, tokenize.STRING, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT,
                tokenize.INDENT, tokenize.DEDENT}
_CALL_OPS = {"(", ")", ",", "=", "+", "-"}


def _call_end(text: str, start: int) -> int | None:
    """The end of the ``name(args)`` call that starts at ``start``, found with Python's tokenizer (so a tag or
    a parenthesis inside a string literal is part of the string), or None when no call starts there. The scan
    stops at the first token no action holds (a ``<`` of a tag outside a string, say) and within
    :data:`envs.actions.MAX_ACTION_CHARS`, so reading an output stays linear in its length."""
    if start >= len(text) or not text[start].isidentifier():
        return None
    window = text[start:start + MAX_ACTION_CHARS + 1]
    lines = [0] + [m.end() for m in re.finditer("\n", window)]  # the lines io.StringIO reads
    depth = 0
    try:
        for tok in tokenize.generate_tokens(io.StringIO(window).readline):
            if tok.type == tokenize.OP and tok.string in _CALL_OPS:
                depth += tok.string == "("
                if tok.string == ")":
                    depth -= 1
                    if depth <= 0:
                        return start + lines[tok.end[0] - 1] + tok.end[1]
            elif tok.type not in _CALL_TOKENS:
                return None
    except (tokenize.TokenError, SyntaxError, ValueError, IndexError):
        return None
    return None


def _calls_at(text: str, pos: int, out: list[tuple[str, str, Any]]) -> int:
    """Read the calls that open the visible segment at ``pos`` (JSON values or ``name(args)``, separated by
    whitespace or ``;``), delimited by their grammar, into ``out`` as ``("json", text, value)`` /
    ``("call", text, None)``; return where the segment goes on. Text that starts neither is left as text."""
    while True:
        start = _WS.match(text, pos).end()
        if start < len(text) and text[start] in "{[":
            try:
                value, end = _decode_at(text, start)
            except ActionParseError:
                return pos
            out.append(("json", text[start:end], value))
        else:
            head = _CALL_HEAD.match(text, start)
            end = _call_end(text, start) if head else None
            if end is None:
                return pos
            out.append(("call", text[start:end], None))
        pos = _WS.match(text, end).end()
        if text.startswith(";", pos):
            pos += 1


def calls_from_openai(tool_calls: Any, tools: list[dict[str, Any]]) -> list[ReadCall]:
    """The structured ``tool_calls`` of an OpenAI chat answer (``[{"id", "type": "function", "function":
    {"name", "arguments": JSON string}}]``), each mapped like a call in text (:func:`read_calls`).

    Returns:
        One :class:`ReadCall` per entry, in order (a malformed entry gives one with ``action=None``).
    """
    out = []
    for entry in tool_calls if isinstance(tool_calls, list) else []:
        fn = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(fn, dict):
            out.append(ReadCall(None, 'a tool call entry has {"function": {"name", "arguments"}}.', json.dumps(entry)))
            continue
        value = {"name": fn.get("name"), "arguments": fn.get("arguments") or {}}
        out.append(_read(value, tools, json.dumps(value, ensure_ascii=False)))
    return out


def parse_model_output(text: str, tools: list[dict[str, Any]]) -> str:
    """The canonical action text of a model output that holds exactly one tool call (:func:`read_calls`).

    Raises:
        ActionParseError: no call outside reasoning, more than one call, or a call that does not map (the
            message says why).
    """
    return one_action(read_calls(text, tools))


def one_action(calls: list[ReadCall]) -> str:
    """The canonical action of the one call in ``calls`` (what :func:`read_calls` or :func:`calls_from_openai`
    found in one turn): the rule of one action per env turn.

    Raises:
        ActionParseError: no call, more than one, or a call that does not map (the message says why).
    """
    if not calls:
        raise ActionParseError("no tool call: the output is empty outside the reasoning (<think>...</think>).")
    if len(calls) > 1:
        raise ActionParseError(f"{len(calls)} tool calls in one turn; write exactly one tool call per turn.")
    if calls[0].action is None:
        raise ActionParseError(calls[0].error or "the tool call does not map to an action.")
    return calls[0].action


def format_tool_call(call: dict[str, Any]) -> str:
    """``<tool_call>`` + the call as compact JSON + ``</tool_call>``: the Qwen / Hermes form a chat template
    renders an assistant's tool call in."""
    body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
    return "<tool_call>" + body + "</tool_call>"


__all__ = ["CALL_CLOSE", "CALL_OPEN", "THINK_CLOSE", "THINK_OPEN", "ReadCall", "action_to_call", "call_to_action",
           "calls_from_openai", "canonical_action", "format_tool_call", "function_tool", "one_action",
           "param_names", "parse_model_output", "read_calls"]
